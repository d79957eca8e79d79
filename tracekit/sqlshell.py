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

3. **It is bounded** (:func:`fetch_bounded`): a timer thread calls DuckDB's ``interrupt()`` on the
   connection after ``timeout_s`` (:data:`DEFAULT_TIMEOUT_S`), stopping the statement wherever it
   is (running or handing over its rows); the result is read as Arrow record batches of
   :data:`BATCH_ROWS` rows and refused once it holds more than ``max_rows``
   (:data:`DEFAULT_MAX_ROWS`) rows or ``max_bytes`` (:data:`DEFAULT_MAX_BYTES`) bytes of Arrow
   buffers, unless the batches go to a ``sink`` (``tracekit sql --format csv|parquet --output``),
   which writes each batch and keeps none: DuckDB streams the result within its memory budget.

A refused query raises :class:`tracekit.errors.BadInputError` (``tracekit sql`` exits 2 with one
line saying why); a query DuckDB rejects while running (syntax, an unknown column, a file outside
the store) does too. DuckDB's settings are those of the version installed (2.0: ``allowed_paths``
and ``lock_configuration``, https://duckdb.org/docs/stable/operations_manual/securing_duckdb/overview).
"""

from __future__ import annotations

from tracekit.errors import BadInputError

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a query may run (``tracekit sql --timeout``, ``Run.sql(timeout_s=)``) before it is
interrupted; 0 or None: no limit. Long enough for the first query to build the analyses of a large
store."""
DEFAULT_MAX_ROWS = 1_000_000
"""Rows of a result held in memory (printed, or written as JSON or a text table) before the query
is refused (``--max-rows``); 0 or None: no limit."""
DEFAULT_MAX_BYTES = 1 << 30
"""Bytes of Arrow buffers a held result may take (1 GiB) before the query is refused."""
BATCH_ROWS = 65_536
"""Rows per record batch read from DuckDB (the unit of the caps and of streamed output)."""

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


def fetch_bounded(raw_con, make_relation, *, timeout_s=DEFAULT_TIMEOUT_S, max_rows=DEFAULT_MAX_ROWS,
                  max_bytes=DEFAULT_MAX_BYTES, sink=None):
    """The result of ``make_relation()`` (a DuckDB relation on ``raw_con``, or None for a statement
    without rows) as a pyarrow Table, read in batches of :data:`BATCH_ROWS` rows, bounded:

    * ``timeout_s`` seconds after the call, a timer thread calls ``raw_con.interrupt()``; the
      statement stops and BadInputError says so (``--timeout``);
    * a result of more than ``max_rows`` rows, or ``max_bytes`` bytes of Arrow buffers, is refused
      with BadInputError as soon as a batch passes the cap (``--max-rows``), its rows dropped;
    * with ``sink`` (a callable taking the schema and returning an object with ``write_batch`` and
      ``close``), each batch goes to the sink as it comes and none is kept (no row or byte cap;
      the time limit holds); returns None then, as for a statement without rows.

    0 or None for a limit: no limit. Other DuckDB errors propagate (the caller words them).
    """
    import threading

    import duckdb

    timer = None
    if timeout_s:
        timer = threading.Timer(float(timeout_s), raw_con.interrupt)
        timer.daemon = True
        timer.start()
    try:
        rel = make_relation()
        if rel is None:
            return None
        reader = rel.to_arrow_reader(BATCH_ROWS)
        if sink is not None:
            out = sink(reader.schema)
            try:
                for batch in reader:
                    out.write_batch(batch)
            finally:
                out.close()
            return None
        import pyarrow as pa

        batches, rows, size = [], 0, 0
        for batch in reader:
            rows += batch.num_rows
            size += batch.nbytes
            if max_rows and rows > max_rows:
                raise BadInputError(f"sql: the result has more than {max_rows:,} rows (--max-rows); add a LIMIT, "
                                    "or stream it to a file with --format csv|parquet --output FILE")
            if max_bytes and size > max_bytes:
                raise BadInputError(f"sql: the result takes more than {max_bytes >> 20:,} MiB; add a LIMIT, "
                                    "or stream it to a file with --format csv|parquet --output FILE")
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException:
        raise BadInputError(f"sql: the query ran longer than {float(timeout_s):g} s and was stopped "
                            "(--timeout; 0 for no limit)") from None
    finally:
        if timer is not None:
            timer.cancel()


def run_query(store, query: str, *, arrow: bool = False, run_ids: list[str] | None = None,
              timeout_s=DEFAULT_TIMEOUT_S, max_rows=DEFAULT_MAX_ROWS, max_bytes=DEFAULT_MAX_BYTES, sink=None):
    """Run one read-only query on the store, confined and bounded (:func:`fetch_bounded`: its
    ``timeout_s``, ``max_rows``, ``max_bytes`` and ``sink``). Returns ``(columns, rows)``
    (``columns`` is None for a statement without a result), or with ``arrow`` the result as a
    pyarrow Table (None without a result, or when the batches went to ``sink``). ``run_ids``: the
    runs every table and view holds (default: all).

    Raises BadInputError for a refused, failing, too long or too large query, StoreError for an
    unreadable store. A query that runs out of DuckDB's memory budget is run again on a fresh
    confined connection with the budget ×4, up to ``tracekit.store.ANALYSIS_MEMORY_MAX`` (the
    budget cannot be raised on a locked connection); with a ``sink``, the sink is opened again.
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
                # a relation straight to Arrow (a DB-API result would copy the rows once more)
                table = fetch_bounded(raw, lambda: raw.sql(query),
                                      timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes, sink=sink)
                if arrow:
                    return table
                if table is None:
                    return None, []
                return table.column_names, [tuple(r.values()) for r in table.to_pylist()]
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
