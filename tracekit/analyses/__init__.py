"""The DuckDB analyses: an ordered pipeline of modules, built on a connection when first used.

Each module is ``analyses/<name>.sql`` (DuckDB statements) or ``analyses/<name>.py`` (a
``create(con)`` that builds a table, where the work calls the model, sweeps a sorted stream or
builds a table in parts). Every module starts with a header documenting each output column
(name, type, unit, meaning); ``tests/test_analysis_pipeline.py`` checks those headers against
``DESCRIBE`` of every view and table.

:data:`PIPELINE` is the order modules are created in: each reads only the base tables (``runs``,
``ranks``, ``events``, ``collectives``) and modules before it. :func:`connect` gives a connection
with the base views, the model UDFs and the ``tk_link`` variable, and nothing else yet: a
statement that names an object not created so far (DuckDB's binder answers CatalogException or
BinderException; a failed statement has no effect) makes the connection create the next module
and try again, until the statement binds or the pipeline is exhausted. So ``SELECT count(*) FROM
events`` builds no analysis, a query of ``collective_bandwidth`` builds the modules up to it, and
a report builds each table once on its one connection. Why on a miss rather than by reading the
names a query references: DuckDB itself decides what a statement needs (views, macros passed
table names as strings, CTEs), with no second list of names or dependencies to keep in step.

The α–β formulas are not re-typed in SQL: :func:`register_udfs` exposes ``tracekit.model``
functions to DuckDB (prefixed ``tk_``).
"""

from __future__ import annotations

from importlib import resources

PIPELINE = (
    "instance_rows",         # SQL: _instance_calls, the macro collective_instance_rows
    "collective_instances",  # Python: the table, built in parts
    "collective_bandwidth",
    "collective_waits",      # SQL: collective_waits, collective_duplicates (read __instance_calls)
    "collective_samples",
    "node_locality",         # SQL: instance_locality, bandwidth_by_locality (the fit and reference read the class)
    "fit",                   # Python: alpha_beta_fit
    "verdicts",              # collective_verdicts
    "intervals",             # SQL: the interval macros
    "overlap_windows",       # Python: the union-length sweep
    "overlap",               # overlap_by_rank/_by_step, collective_overlap
    "process_groups",        # per (run, process group): dimension, ranks, calls, bytes, sync, overlap
    "hang",                  # Python: hang_instances, hang_divergence (read fr_entries, process_groups; Flight Recorder triage)
    "measured_vs_model",     # Python: per rank, and per rank and dimension (reads process_groups)
    "gpu_time_breakdown",    # Python: GPU time by class and idle class per rank and step (the stored summaries)
    "kernel_summary",        # SQL: kernel_summary, gpu_time_by_launcher (reads the launcher summaries)
    "alltoall_imbalance",    # SQL: alltoall_matrix(_total), alltoall_imbalance (reads collective_instances)
    "pipeline_bubbles",      # SQL: pipeline_bubbles (reads overlap_windows' per-window summary)
    "critical_path",         # Python: critical_path, critical_path_summary (reads events, _instance_calls)
    "overlap_islands",       # SQL: comm_islands, compute_islands, overlap_islands (read events; HTML timeline)
    "gpu_launchers",         # Python: gpu_launchers, gpu_idle_gaps (per GPU op / gap; read events; no report)
)
"""The analysis modules in creation order (each after every module it reads). The collective
chain comes first and the overlap chain after it, so that the export (collectives, waits,
verdicts) never sweeps the events for overlap; the critical path near the end, as the costliest (a
walk over the events): a statement that needs any earlier module never builds it. Last the island
views, which only the HTML timeline queries, after :meth:`AnalysesConnection.ensure` creates them
(binding them reads every rank's events file), and the per-GPU-op tables gpu_launchers /
gpu_idle_gaps, which no report reads (they read every GPU op and CPU range)."""


_ENSURE_READS = {"overlap_islands": ("intervals",)}
"""The pipeline modules each module :meth:`AnalysesConnection.ensure` may create reads."""

_LATE_NAMES = {**{v: "overlap_islands" for v in ("comm_islands", "compute_islands", "overlap_islands")},
               **{t: "gpu_launchers" for t in ("gpu_launchers", "gpu_idle_gaps")}}
"""View or table → the late module (after the critical path) that defines it: a statement naming one creates
that module alone (:meth:`AnalysesConnection.ensure`), not every module before it."""


def _missing_name(exc) -> str | None:
    """The object a DuckDB CatalogException says does not exist (``Table with name X does not
    exist``), lower-cased; None for another message."""
    import re

    m = re.search(r"with name \"?([A-Za-z_][A-Za-z0-9_]*)\"? does not exist", str(exc))
    return m.group(1).lower() if m else None


def modules() -> dict[str, str]:
    """name → SQL text of every SQL module of the pipeline."""
    return {name: text for name in PIPELINE if (text := sql_text(name)) is not None}


def sql_text(name: str) -> str | None:
    """The text of ``analyses/<name>.sql``, or None when the module is a Python one."""
    f = resources.files(__package__).joinpath(f"{name}.sql")
    return f.read_text(encoding="utf-8") if f.is_file() else None


def create_module(con, name: str) -> None:
    """Create one pipeline module's objects on ``con`` (its inputs must exist already)."""
    text = sql_text(name)
    if text is not None:
        con.execute(text)
    else:
        import importlib

        importlib.import_module(f"{__package__}.{name}").create(con)


class AnalysesConnection:
    """A store connection (:class:`tracekit.store.AnalysisConnection`) whose analyses are created
    in :data:`PIPELINE` order when a statement first needs them (module docstring).

    ``execute`` and ``sql`` retry a statement that fails to bind after creating the next module;
    ``load_all`` creates the rest; everything else is the wrapped connection's. ``loaded``: the
    modules created so far, in order.
    """

    def __init__(self, con):
        self._con = con
        self.loaded: list[str] = []
        self._ahead: set[str] = set()  # created out of order by ensure()

    def load_next(self) -> bool:
        """Create the next module of the pipeline; False when every module exists already."""
        if len(self.loaded) == len(PIPELINE):
            return False
        name = PIPELINE[len(self.loaded)]
        if name not in self._ahead:
            create_module(self._con, name)
        self.loaded.append(name)
        return True

    def ensure(self, name: str) -> None:
        """Create the pipeline module ``name`` now unless it exists, out of order: for a module late in
        the pipeline that reads only the base tables and early modules (``overlap_islands``, which the
        HTML timeline queries; last so that no other statement binds it on the way; a statement naming
        one of its views calls this itself)."""
        if name not in self.loaded and name not in self._ahead:
            for dep in _ENSURE_READS.get(name, ()):
                self.ensure(dep)
            create_module(self._con, name)
            self._ahead.add(name)

    def load_all(self) -> "AnalysesConnection":
        while self.load_next():
            pass
        return self

    def _retry(self, call):
        import duckdb

        while True:
            try:
                return call()
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                late = _LATE_NAMES.get(_missing_name(exc))
                if late is not None and late not in self._ahead and late not in self.loaded:
                    self.ensure(late)  # a late module's view: that module, not the pipeline before it
                elif not self.load_next():
                    raise

    def execute(self, query, *args, **kwargs):
        return self._retry(lambda: self._con.execute(query, *args, **kwargs))

    def sql(self, query, *args, **kwargs):
        return self._retry(lambda: self._con.sql(query, *args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._con, name)


def connect(store, run_ids: list[str] | None = None, link: str | None = None) -> AnalysesConnection:
    """A connection to ``store`` (a :class:`tracekit.store.Store`) over ``run_ids`` (default: every
    run) with the analyses available, each created on first use.

    ``link``: the preset the verdicts and measured_vs_model compare with (the DuckDB variable
    ``tk_link``). Raises BadInputError for an unknown preset, StoreError as ``Store.connect``.
    """
    if link is not None:
        from tracekit.model import link_from_preset

        link_from_preset(link)  # validates, one-line BadInputError otherwise
    con = store.connect(run_ids=run_ids)
    con.execute("SET VARIABLE tk_link = ?", [link])
    register_udfs(con)
    return AnalysesConnection(con)


# NCCL's TREE kernels run the pipelined double binary tree (tracekit.model.collectives)
_KERNEL_ALGOS = {"RING": "ring", "TREE": "double_binary_tree", "NVLS": "nvls", "NVLSTREE": "nvls"}


def register_udfs(con) -> None:
    """Register the model functions the SQL uses; each returns NULL where the model has no answer.

    tk_busbw_factor(op, n) → DOUBLE            nccl-tests bus-bandwidth factor
    tk_algbw(S, t_ns) → DOUBLE                 S / t in GB/s (NULL for t = 0)
    tk_busbw(op, S, t_ns, n) → DOUBLE          algbw × factor, GB/s
    tk_verdict(α term, β term) → VARCHAR       latency-bound when α term >= β term, else bandwidth-bound
    tk_model_algo(op, kernel_algo, n) → VARCHAR the algorithm to model (kernel's if modelled, else default)
    tk_alpha_coeff(op, algo, n) → DOUBLE       A of T = A·α + B·D/β
    tk_beta_coeff(op, algo, n) → DOUBLE        B of T = A·α + B·D/β
    tk_link_alpha(preset) → DOUBLE             preset α, s
    tk_link_beta(preset) → DOUBLE              preset effective β, bytes/s
    tk_best_algo(op, D, n, α, β, sw) → VARCHAR fastest applicable algorithm under (α, β); in-switch
                                               (nvls) only when sw (an NVLink/NVSwitch preset)
    tk_best_time(op, D, n, α, β, sw) → DOUBLE  its time, s
    tk_pipeline_bubble(p, m) → DOUBLE          GPipe/1F1B bubble fraction (p−1)/(m+p−1) (Huang et al. 2019)
    tk_size_bucket(S) → BIGINT                 power-of-two size bucket, largest 2^k <= S (a macro:
                                               tracekit.model.size_bucket, SIZE_BUCKET_SQL)
    """
    import numpy as np

    from tracekit.errors import TracekitError
    from tracekit.model import (
        ALGORITHMS,
        algbw_array,
        algorithm_coefficients,
        verdict,
        applicable_algorithms,
        busbw_factor,
        custom_link,
        link_from_preset,
        pipeline_bubble_fraction,
        predict_collective,
    )

    import functools

    def safe(fn):
        @functools.wraps(fn)
        def wrapped(*args):
            if None in args:  # DuckDB passes plain Python values: the same as any(a is None ...), faster
                return None
            try:
                return fn(*args)
            except (TracekitError, ValueError, ZeroDivisionError):
                return None

        return wrapped

    def model_algo(op, kernel_algo, n):
        algos = ALGORITHMS.get(op)
        if not algos:
            return None
        cand = _KERNEL_ALGOS.get(str(kernel_algo or "").upper())
        if cand in algos and cand in applicable_algorithms(op, int(n)):
            return cand
        return algos[0]

    def best_uncached(op, size, n, alpha, beta, in_switch):
        link = custom_link(alpha, beta)
        preds = predict_collective(op, float(size), int(n), link, algo="all")
        if not in_switch:  # NVLS/SHARP needs switch hardware the fit cannot vouch for
            preds = [p for p in preds if p.algo != "nvls"] or preds
        return min(preds, key=lambda p: p.time_s)

    # predict_collective over every algorithm costs ~45 µs and tk_best_algo / tk_best_time ask it
    # twice per instance with arguments that repeat (same op, size, k, α, β): remember the answers.
    best_cache: dict = {}

    def best(*args):
        if any(type(a) is float and a == 0.0 for a in args):
            return best_uncached(*args)  # 0.0 and -0.0 are one dict key but may give different results
        try:
            return best_cache[args]
        except KeyError:
            pass
        got = best_uncached(*args)  # exceptions are not cached: safe() turns them into NULL each time
        if len(best_cache) >= 1 << 16:
            best_cache.clear()
        best_cache[args] = got
        return got

    def reg(name, fn, args, ret):
        # "special": safe() answers NULL itself (DuckDB's default null handling would skip the call
        # for NULL arguments, but then refuses a UDF that returns NULL, as safe() does on no answer)
        con.create_function(name, per_distinct(safe(fn), ret), args, ret, type="arrow", null_handling="special")

    reg("tk_busbw_factor", lambda op, n: float(busbw_factor(op, int(n))), ["VARCHAR", "INTEGER"], "DOUBLE")
    # algbw and busbw per row (sizes and times do not repeat): numpy over the chunk, busbw =
    # algbw × the factor (model.busbw), the factor once per distinct (op, k); NULL where NaN
    factor = per_distinct(safe(lambda op, n: float(busbw_factor(op, int(n)))), "DOUBLE")

    def algbw_udf(d, t_ns):
        return _nan_as_null(algbw_array(_floats(d), _floats(t_ns) * 1e-9))

    def busbw_udf(op, d, t_ns, n):
        bw, f = algbw_array(_floats(d), _floats(t_ns) * 1e-9), _floats(factor(op, n))
        return _nan_as_null(bw * f, np.isnan(bw) | np.isnan(f))  # inf × 0 is busbw's NaN, not NULL

    con.create_function("tk_algbw", algbw_udf, ["BIGINT", "DOUBLE"], "DOUBLE", type="arrow", null_handling="special")
    con.create_function("tk_busbw", busbw_udf, ["VARCHAR", "BIGINT", "DOUBLE", "INTEGER"], "DOUBLE", type="arrow",
                        null_handling="special")
    reg("tk_verdict", lambda a, b: verdict(float(a), float(b)), ["DOUBLE", "DOUBLE"], "VARCHAR")
    def model_algo_or_none(op, ka, n):
        if op is None or n is None:
            return None
        try:
            return model_algo(op, ka, n)
        except (TracekitError, ValueError):
            return None

    con.create_function("tk_model_algo", per_distinct(model_algo_or_none, "VARCHAR"), ["VARCHAR", "VARCHAR", "INTEGER"],
                        "VARCHAR", type="arrow", null_handling="special")
    reg("tk_alpha_coeff", lambda op, a, n: float(algorithm_coefficients(op, a, int(n)).alpha_coeff),
        ["VARCHAR", "VARCHAR", "INTEGER"], "DOUBLE")
    reg("tk_beta_coeff", lambda op, a, n: float(algorithm_coefficients(op, a, int(n)).beta_coeff),
        ["VARCHAR", "VARCHAR", "INTEGER"], "DOUBLE")
    reg("tk_link_alpha", lambda name: link_from_preset(name).alpha_s, ["VARCHAR"], "DOUBLE")
    reg("tk_link_beta", lambda name: link_from_preset(name).beta_Bps, ["VARCHAR"], "DOUBLE")
    reg("tk_best_algo", lambda op, d, n, a, b, sw: best(op, d, n, a, b, sw).algo,
        ["VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "DOUBLE", "BOOLEAN"], "VARCHAR")
    reg("tk_best_time", lambda op, d, n, a, b, sw: best(op, d, n, a, b, sw).time_s,
        ["VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "DOUBLE", "BOOLEAN"], "DOUBLE")
    reg("tk_pipeline_bubble", lambda p, m: pipeline_bubble_fraction(int(p), int(m)), ["BIGINT", "BIGINT"], "DOUBLE")
    from tracekit.model import SIZE_BUCKET_SQL

    con.execute(SIZE_BUCKET_SQL)


_ARROW_TYPES = {"DOUBLE": "float64", "VARCHAR": "string", "BIGINT": "int64", "INTEGER": "int32", "BOOLEAN": "bool_"}


def _floats(col):
    """An arrow column of numbers as float64 numpy, NaN for NULL."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    out = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.float64)
    out[col.is_null().to_numpy(zero_copy_only=False)] = np.nan
    return out


def _nan_as_null(values, null=None):
    """A float64 arrow array of ``values``, NULL where ``null`` (default: where NaN)."""
    import numpy as np
    import pyarrow as pa

    return pa.array(values, type=pa.float64(), mask=np.isnan(values) if null is None else null)


def per_distinct(fn, ret: str):
    """``fn`` (a scalar function of plain Python values) as a DuckDB arrow UDF: called once per
    distinct argument tuple of each chunk of rows (DuckDB's vectors, 2,048 rows), its answers
    repeated for the rows that share the tuple. The numbers are ``fn``'s own, as a scalar UDF's
    would be: the model's formulas exist once, in tracekit.model. Why: a scalar Python UDF costs
    DuckDB a Python call per row, and the verdicts call ~13 per instance on arguments that repeat
    (op, algorithm, group size, α, β); the costs are in benchmarks/README.md.

    Rows are the same tuple when every argument has the same bits: strings by value, integers and
    booleans by value, floats by their IEEE bits (0.0 and -0.0 differ; a NaN is shared only with
    the same NaN), NULL only with NULL. ``ret``: the DuckDB type of the answers (DOUBLE, VARCHAR,
    BIGINT, INTEGER, BOOLEAN).
    """
    import functools

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = getattr(pa, _ARROW_TYPES[ret])()

    def codes(col) -> list:
        """Integer columns that are equal exactly where the values are the same (above)."""
        null = col.is_null().to_numpy(zero_copy_only=False).astype(np.int64)
        t = col.type
        if pa.types.is_floating(t):
            bits = pc.fill_null(col, 0.0).to_numpy().astype(np.float64).view(np.int64)
        elif pa.types.is_boolean(t):
            bits = pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(np.int64)
        elif pa.types.is_integer(t):
            bits = pc.fill_null(col, 0).to_numpy().astype(np.int64)
        else:  # strings (any arrow string type): equal codes for equal values
            return [pc.fill_null(pc.dictionary_encode(col).indices, -1).to_numpy().astype(np.int64)]
        return [bits, null]

    @functools.wraps(fn)  # DuckDB counts the parameters of fn's signature
    def call(*cols):
        cols = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]
        if not len(cols[0]):
            return pa.array([], type=typ)
        keys = np.column_stack([k for c in cols for k in codes(c)])
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        args = zip(*(c.take(pa.array(first)).to_pylist() for c in cols))
        return pa.array([fn(*a) for a in args], type=typ).take(pa.array(inverse.reshape(-1)))

    return call


_DUCKDB_TYPES = {"int32": "INTEGER", "int64": "BIGINT", "double": "DOUBLE", "string": "VARCHAR", "bool": "BOOLEAN"}
_PY_CONVERT = {"int32": int, "int64": int, "double": float, "string": str, "bool": bool}


def create_table_from_rows(con, name: str, schema, rows: list[dict]) -> None:
    """``CREATE OR REPLACE TABLE name`` with ``schema``'s columns (a pyarrow schema of int32, int64,
    double, string and bool fields) holding ``rows`` (dicts; a missing key is NULL), in order.

    The values go to DuckDB as one typed list per column, unnested side by side, not through a
    pyarrow table: building one from Python objects imports pandas (~0.15 s on every analyze).
    """
    names, types, cols = [], [], []
    for field in schema:
        t = str(field.type)
        conv = _PY_CONVERT[t]
        names.append(field.name)
        types.append(_DUCKDB_TYPES[t])
        cols.append([None if r.get(field.name) is None else conv(r[field.name]) for r in rows])
    sel = ", ".join(f'unnest(?::{t}[]) AS "{n}"' for n, t in zip(names, types))
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {sel}", cols)
