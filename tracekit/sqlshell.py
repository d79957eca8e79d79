"""The confined SQL shell behind ``tracekit sql``: a user's query reads the store and nothing else.

A query is run only when all of these hold:

1. **It is one read-only statement**, as DuckDB's own parser classifies it
   (``duckdb.extract_statements`` → ``StatementType``): SELECT (which covers ``WITH``, ``VALUES``,
   ``FROM t``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``), or EXPLAIN of one. ``EXPLAIN ANALYZE``
   executes its statement, so an EXPLAIN is judged by the statement it explains (the text after
   ``EXPLAIN [ANALYZE] [(options)]``, found with DuckDB's tokenizer, parsed again). A second
   statement after ``;`` is refused, never run.
2. **It runs on a locked-down connection**: the store's views are bound first
   (:func:`tracekit.analyses.connect`; an analysis is built when the query first names it), then
   ``allowed_paths`` is set to exactly the Parquet files those views read (each both as its path
   and as the escaped pattern the views hand DuckDB, :func:`tracekit.store.glob_escape`),
   ``enable_external_access = false`` (no other file, no COPY, no ATTACH, no extension install
   or load, no ``read_text('/proc/self/environ')``, no ``glob('/*')``),
   ``autoinstall_known_extensions = false``, ``autoload_known_extensions = false``,
   ``python_enable_replacements = false`` (no Python variables as tables), and last
   ``lock_configuration = true``, so the query cannot ``SET`` any of it back.

A refused query raises :class:`tracekit.errors.BadInputError` (``tracekit sql`` exits 2 with one
line saying why); a query DuckDB rejects while running (syntax, an unknown column, a file outside
the store) does too. DuckDB's settings are those of the version installed (2.0: ``allowed_paths``
and ``lock_configuration``, https://duckdb.org/docs/stable/operations_manual/securing_duckdb/overview).
"""

from __future__ import annotations

from tracekit.errors import BadInputError

READ_ONLY_TYPES = ("SELECT",)
"""Statement types (``duckdb.StatementType`` names) a query may be, besides EXPLAIN of one."""


def _one_statement(query: str):
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise BadInputError(f"SQL error: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise BadInputError(f"sql: give one SQL statement at a time (got {len(statements)}); nothing was run")
    return statements[0]


def _kind(st) -> str:
    """The statement's ``StatementType`` name; 'an unnamed statement type' for a type this duckdb's
    Python module has no name for (``UPDATE EXTENSIONS`` in 2.0 raises ValueError)."""
    try:
        return st.type.name
    except ValueError:
        return "an unnamed statement type"


def _explained(text: str) -> str:
    """The statement an ``EXPLAIN [ANALYZE] [(options)] <statement>`` explains (its text)."""
    import duckdb

    raw = duckdb.tokenize(text)
    ends = [t[0] for t in raw[1:]] + [len(text)]
    # (offset, type, text) of each token but comments (a token's text runs to the next token)
    toks = [(a, kind, text[a:b].strip()) for (a, kind), b in zip(raw, ends) if kind != duckdb.token_type.comment]
    i = 1  # toks[0] is EXPLAIN
    if i < len(toks) and toks[i][2].upper() == "ANALYZE":
        i += 1
    if i < len(toks) and toks[i][2] == "(":
        depth = 0
        while i < len(toks):
            if toks[i][1] == duckdb.token_type.operator:
                depth += toks[i][2].count("(") - toks[i][2].count(")")
            i += 1
            if depth <= 0:
                break
    if i >= len(toks):
        raise BadInputError("sql: EXPLAIN of nothing")
    return text[toks[i][0]:]


def check_read_only(query: str) -> str:
    """Return the statement type (``SELECT`` or ``EXPLAIN``) of a one-statement read-only query;
    raise BadInputError naming what is refused otherwise."""
    st = _one_statement(query)
    outer = kind = _kind(st)
    while kind == "EXPLAIN":
        st = _one_statement(_explained(st.query))
        kind = _kind(st)
    if kind not in READ_ONLY_TYPES:
        what = f"EXPLAIN of {kind}" if outer == "EXPLAIN" else kind
        raise BadInputError(f"sql: only read-only queries run (SELECT, or EXPLAIN of a SELECT), not {what}")
    return outer


def confine(con, files: list[str]) -> None:
    """Lock ``con`` (a DuckDB connection, or tracekit.store.AnalysisConnection) down to reading ``files``.

    Runs the settings in the module docstring, ``lock_configuration`` last; after this no setting
    of ``con`` can change.
    """
    from tracekit.store import glob_escape

    allowed = sorted(set(files) | {glob_escape(f) for f in files})
    con.execute("SET allowed_paths = ?", [allowed])
    con.execute("SET allowed_directories = []")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET python_enable_replacements = false")
    con.execute("SET lock_configuration = true")


def run_query(store, query: str, *, arrow: bool = False, run_ids: list[str] | None = None):
    """Run one read-only query on the store, confined. Returns ``(columns, rows)`` (``columns`` is
    None for a statement without a result), or with ``arrow`` the result as a pyarrow Table (None
    without a result). ``run_ids``: the runs every table and view holds (default: all).

    Raises BadInputError for a refused or failing query, StoreError for an unreadable store. A
    query that runs out of DuckDB's memory budget is run again on a fresh confined connection with
    the budget ×4, up to ``tracekit.store.ANALYSIS_MEMORY_MAX`` (the budget cannot be raised on a
    locked connection).
    """
    import duckdb

    from tracekit import analyses
    from tracekit.store import ANALYSIS_MEMORY_LIMIT, ANALYSIS_MEMORY_MAX

    if not query.strip():
        raise BadInputError("empty SQL query")
    check_read_only(query)
    limit = ANALYSIS_MEMORY_LIMIT
    while True:
        con = analyses.connect(store, run_ids=run_ids)  # base views and UDFs; the analyses the query names are built first
        raw = con.duckdb  # statements on it skip the budget retry (AnalysisConnection.execute would SET the budget)
        try:
            raw.execute(f"SET memory_limit = '{limit}B'")
            confine(raw, con.bound_files)
            try:
                con.analyses.prepare(query)
                if arrow:  # a relation straight to Arrow (a DB-API result would copy the rows once more)
                    rel = raw.sql(query)
                    return None if rel is None else rel.to_arrow_table()
                cur = raw.execute(query)
                if cur.description is None:
                    return None, []
                return [d[0] for d in cur.description], cur.fetchall()
            except duckdb.OutOfMemoryException:
                if limit >= ANALYSIS_MEMORY_MAX:
                    raise BadInputError(f"SQL error: the query needs more than {limit >> 20} MiB of memory") from None
                limit = min(limit * 4, ANALYSIS_MEMORY_MAX)
            except duckdb.PermissionException as exc:
                raise BadInputError(f"sql: refused, a query reads the store's views only: {_first_line(exc)}") from None
            except duckdb.Error as exc:
                raise BadInputError(f"SQL error: {_first_line(exc)}") from None
        finally:
            con.close()


def _first_line(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__
