"""The DuckDB analyses: modules declared as data, each built on a connection when a statement first names it.

Each module is ``analyses/<name>.sql`` (DuckDB statements) or ``analyses/<name>.py`` (a
``create(con)`` that builds a table, where the work calls the model, sweeps a sorted stream or
builds a table in parts). Every module starts with a header documenting each output column
(name, type, unit, meaning); ``tests/analyses/test_analysis_pipeline.py`` checks those headers against
``DESCRIBE`` of every view and table.

:data:`MODULES` says, for each module, the relations it defines (views, tables and macros,
internal ``_`` names included) and the relations it reads (the store's base views and other
modules' relations); ``tests/analyses/test_analysis_pipeline.py`` checks both against what each module
creates and names. :func:`connect` gives a store connection (:class:`tracekit.store.AnalysisConnection`)
with the base views, the model UDFs and the ``tk_link`` variable, and nothing else yet; its
``analyses`` (a :class:`Builder`) builds, before each statement, the modules defining the
relations the statement names and, first, every module those read (:meth:`Builder.ensure`). So
``SELECT count(*) FROM events`` builds no analysis, a query of ``collective_bandwidth`` builds
instance_rows, collective_instances and collective_bandwidth, and a report builds each module once
on its one connection. A name no module defines (a misspelt view) is left to DuckDB, whose binder
refuses the statement at once: alone, it builds nothing.

The α–β formulas are not re-typed in SQL: :func:`register_udfs` exposes ``tracekit.model``
functions to DuckDB (prefixed ``tk_``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib import resources

from tracekit.errors import BadInputError


@dataclass(frozen=True)
class Module:
    """One analysis module: ``name`` (its file, ``analyses/<name>.sql`` or ``.py``), ``defines`` (the
    views, tables and macros it creates) and ``reads`` (the relations its statements name: the
    store's base views and relations of other modules)."""

    name: str
    defines: tuple[str, ...]
    reads: tuple[str, ...]


MODULES: tuple[Module, ...] = (
    Module("instance_rows", ("_instance_calls", "_most_common", "collective_instance_rows"),
           ("collectives", "ranks", "runs")),
    Module("collective_instances", ("__instance_calls", "collective_instances"),  # Python: built in parts
           ("_instance_calls", "collective_instance_rows", "collectives")),
    Module("collective_bandwidth", ("bandwidth_by_size", "collective_bandwidth"), ("collective_instances", "runs")),
    Module("collective_waits", ("collective_duplicates", "collective_waits", "mismatched_instances"),
           ("__instance_calls", "collective_instances", "collectives", "ranks")),
    Module("collective_samples", ("collective_samples",), ("collective_instances", "collectives", "runs")),
    Module("machine", ("group_machine",), ("collectives", "ranks", "runs")),  # Python: hosts, GPU, NICs, class per group
    Module("machine_summary", ("machine_summary",), ("group_machine",)),
    Module("node_locality", ("bandwidth_by_locality", "instance_locality"),
           ("collective_bandwidth", "collective_instances", "collectives", "group_machine", "ranks")),
    Module("fit", ("alpha_beta_fit", "collective_reference"),  # Python
           ("collective_instances", "collective_samples", "collectives", "group_machine", "instance_locality", "ranks",
            "runs")),
    Module("verdicts", ("collective_verdicts",),
           ("alpha_beta_fit", "collective_bandwidth", "collective_instances", "collective_reference", "group_machine",
            "ranks", "runs")),
    Module("fleet", ("fleet_nodes", "fleet_pairs", "group_plateau"),  # Python: degraded links vs peers and model
           ("collective_bandwidth", "collective_reference", "group_machine", "ranks", "runs")),
    Module("intervals", ("intersect_islands", "island_prefix", "merge_intervals"), ()),
    Module("overlap_windows", ("_overlap_summary", "_span_overlap", "overlap_windows"),  # Python: the stored summaries
           ("overlap_summary", "ranks", "span_overlap")),
    Module("overlap", ("collective_overlap", "overlap_by_rank", "overlap_by_step"), ("_span_overlap", "overlap_windows")),
    Module("collective_sizes", ("collective_peaks", "collective_sizes", "peak_statistics", "size_statistics",
                                "verdict_rows"), ("_most_common", "collective_verdicts", "runs")),
    Module("collective_sizes_by_op", ("collective_sizes_by_op", "run_comm_totals"),
           ("__instance_calls", "collective_instances", "collective_overlap", "collective_waits", "overlap_by_rank",
            "ranks", "runs")),  # "ranks": a column's name
    Module("verdict_summary", ("reference_statistics", "verdict_counts", "verdict_references", "verdict_statistics"),
           ("_most_common", "verdict_rows")),
    Module("collective_ops", ("calls_by_rank", "collective_ops", "instance_health", "unattributed_comm"),
           ("collective_bandwidth", "collective_instances", "collective_waits", "collectives", "runs")),
    Module("stragglers", ("straggler_instances", "straggler_ranks"), ("collective_instances", "collective_waits", "runs")),
    Module("process_groups", ("_pg_desc", "_pg_layout", "process_group_sizes", "process_groups"),
           ("collective_instances", "collective_overlap", "collectives", "ranks", "runs")),
    Module("hang", ("hang_divergence", "hang_instances"),  # Python: Flight Recorder triage
           ("collectives", "fr_dumps", "fr_entries", "fr_groups", "process_groups", "ranks", "runs")),
    Module("fr_collectives", ("fr_collectives",), ("fr_entries", "ranks")),  # "ranks": a column's name
    Module("measured_vs_model", ("measured_vs_model", "measured_vs_model_by_dimension"),  # Python
           ("collective_overlap", "collective_reference", "collective_steps", "collective_waits", "collectives",
            "group_machine", "overlap_by_step", "process_groups", "ranks", "runs")),
    Module("gpu_time_breakdown", ("_gpu_breakdown_summary", "_gpu_launcher_summary", "_gpu_op_durations",
                                  "gpu_time_breakdown"),  # Python: the door to the stored GPU summaries
           ("gpu_breakdown_summary", "gpu_launcher_summary", "gpu_op_durations")),
    Module("kernel_summary", ("gpu_time_by_launcher", "kernel_summary"),
           ("_gpu_launcher_summary", "_gpu_op_durations", "gpu_time_breakdown", "ranks")),  # "ranks": a column's name
    Module("alltoall_imbalance", ("_a2a_cells", "_a2a_rows", "alltoall_imbalance", "alltoall_matrix",
                                  "alltoall_matrix_total"), ("__instance_calls", "collective_instances", "collectives")),
    Module("pipeline_bubbles", ("_pp_runs", "pipeline_bubbles"), ("_overlap_summary", "collectives", "runs")),
    Module("critical_path", ("_cp_walked", "_cp_walked_summary", "critical_path", "critical_path_summary"),
           # Python: the stored paths, and the walk of the stored nodes of runs of several ranks
           ("_instance_calls", "collective_instances", "critical_path_nodes", "rank_critical_path",
            "rank_critical_path_summary", "rank_steps")),
    Module("critical_path_events", ("critical_path_events", "critical_path_top"),
           ("critical_path", "critical_path_summary", "events", "ranks")),  # "events", "ranks": columns' names
    Module("replay", ("replay_steps",),  # Python: the critical path's graph replayed (tracekit.model.whatif)
           ("_instance_calls", "collective_instances", "events", "ranks", "runs")),
    Module("overlap_islands", ("_comm_spans", "_compute_spans", "comm_islands", "compute_islands", "overlap_islands"),
           ("events", "intersect_islands", "merge_intervals")),
    Module("gpu_launchers", ("gpu_idle_gaps", "gpu_launchers"), ("events", "ranks")),  # Python; no report reads them
)
"""Every analysis module: what it defines and what it reads (:class:`Module`). The order is the one
:meth:`Builder.ensure_all` builds in; a statement builds only what it needs, whatever the order."""

BY_NAME: dict[str, Module] = {m.name: m for m in MODULES}
"""Module name → :class:`Module`."""

DEFINED_BY: dict[str, str] = {rel: m.name for m in MODULES for rel in m.defines}
"""Relation (view, table or macro; lower case) → the name of the module that defines it."""


def modules() -> dict[str, str]:
    """name → SQL text of every SQL module."""
    return {m.name: text for m in MODULES if (text := sql_text(m.name)) is not None}


def sql_text(name: str) -> str | None:
    """The text of ``analyses/<name>.sql``, or None when the module is a Python one."""
    f = resources.files(__package__).joinpath(f"{name}.sql")
    return f.read_text(encoding="utf-8") if f.is_file() else None


def create_module(con, name: str) -> None:
    """Create one module's objects on ``con`` (the relations it reads must exist already)."""
    text = sql_text(name)
    if text is not None:
        con.execute(text)
    else:
        import importlib

        importlib.import_module(f"{__package__}.{name}").create(con)


def statement_names(query: str) -> set[str]:
    """The names in ``query`` (any SQL text: one statement or several, of any type) as DuckDB's
    tokenizer (``duckdb.tokenize``) reads them, lower case: every identifier (quotes removed) and
    every string constant (a macro may be passed a table's name as a string, as
    ``merge_intervals('_comm_spans')``), comments skipped. A superset of the relations the
    statement reads: a column or alias named like a relation is in it too (no column of the store
    or of an analysis is, tests/analyses/test_analysis_pipeline.py).
    """
    import duckdb

    kinds = duckdb.token_type
    raw = duckdb.tokenize(query)
    text = query.encode("utf-8")  # the tokenizer's offsets are in bytes
    ends = [t[0] for t in raw[1:]] + [len(text)]
    named: set[str] = set()
    for (a, kind), b in zip(raw, ends):
        if kind == kinds.identifier:
            named.add(text[a:b].decode("utf-8", "replace").strip().strip('"').lower())
        elif kind == kinds.string_const:
            named.add(text[a:b].decode("utf-8", "replace").strip().strip("'").lower())
    return named


class Builder:
    """The analyses of one connection (``con.analyses``, set by :func:`connect`): which modules are
    built (``built``, in the order they were), and the building.

    ``con``: the :class:`tracekit.store.AnalysisConnection` whose ``execute`` and ``sql`` call
    :meth:`prepare` with each statement before running it.
    """

    def __init__(self, con):
        self.con = con
        self.built: list[str] = []
        self._building = 0  # > 0 while a module is being created: its own statements prepare nothing
        self._lock = threading.RLock()

    def ensure(self, names) -> None:
        """Build what ``names`` (module names or the relations modules define) need: each named
        module, or the one defining a named relation, after every module it reads from, each once.

        Raises BadInputError (one line, nothing built) for a name that is neither a module nor a
        relation a module defines.
        """
        if isinstance(names, str):
            names = [names]
        wanted = []
        for n in names:
            key = str(n).lower()
            mod = key if key in BY_NAME else DEFINED_BY.get(key)
            if mod is None:
                import difflib

                near = difflib.get_close_matches(key, list(BY_NAME) + list(DEFINED_BY), n=1)
                hint = f" (did you mean {near[0]}?)" if near else ""
                raise BadInputError(f"no analysis module or view named {n!r}{hint}")
            wanted.append(mod)
        with self._lock:
            if set(wanted) - set(self.built):
                # the statement before may have left a result unread: the one about to run ends it
                # anyway, and DuckDB refuses some work (register) on a connection holding one
                self.con.duckdb.abort()
            for mod in wanted:
                self._build(mod, ())

    def _build(self, name: str, path: tuple[str, ...]) -> None:
        if name in self.built:
            return
        if name in path:  # a fault in MODULES, not in the input
            raise RuntimeError(f"analysis modules read each other: {' -> '.join(path + (name,))}")
        module = BY_NAME[name]
        for rel in module.reads:
            dep = DEFINED_BY.get(rel)
            if dep is not None and dep != name:
                self._build(dep, path + (name,))
        self._building += 1
        try:
            create_module(self.con, name)
        finally:
            self._building -= 1
        self.built.append(name)

    def ensure_all(self) -> None:
        """Build every module (in :data:`MODULES` order, each after what it reads)."""
        self.ensure([m.name for m in MODULES])

    def prepare(self, query: str) -> None:
        """Build the modules ``query`` needs before it runs: those defining a name it holds
        (:func:`statement_names`) and what they read (:meth:`ensure`). A name no module defines is
        left to DuckDB: a misspelt view alone builds nothing, and DuckDB's binder refuses the
        statement at once. Does nothing while a module is being built (modules declare what they
        read) or once every module is."""
        if self._building or len(self.built) == len(MODULES) or not isinstance(query, str):
            return
        wanted = {DEFINED_BY[n] for n in statement_names(query) if n in DEFINED_BY} - set(self.built)
        if wanted:
            self.ensure(sorted(wanted, key=_ORDER.__getitem__))


_ORDER = {m.name: i for i, m in enumerate(MODULES)}


def connect(store, run_ids: list[str] | None = None, link: str | None = None):
    """A connection (:class:`tracekit.store.AnalysisConnection`) to ``store`` (a
    :class:`tracekit.store.Store`) over ``run_ids`` (default: every run) with the analyses
    available, each built when a statement first names it (``con.analyses``, a :class:`Builder`).

    ``link``: the preset the verdicts and measured_vs_model compare with (the DuckDB variable
    ``tk_link``). DuckDB runs on :func:`analysis_threads` threads for the runs' stored events.
    Raises BadInputError for an unknown preset, StoreError as ``Store.connect``.
    """
    if link is not None:
        from tracekit.model import link_from_preset

        link_from_preset(link)  # validates, one-line BadInputError otherwise
    con = store.connect(run_ids=run_ids)
    con.execute("SET VARIABLE tk_link = ?", [link])
    events, cores = con.execute("SELECT coalesce(sum(events), 0), current_setting('threads') FROM ranks").fetchone()
    con.execute(f"SET threads = {analysis_threads(int(events), int(cores))}")
    register_udfs(con)
    con.analyses = Builder(con)
    return con


EVENTS_PER_THREAD = 4_000_000
"""Stored events per DuckDB thread of an analysis connection (:func:`analysis_threads`)."""


def analysis_threads(events: int, cores: int) -> int:
    """DuckDB threads for analysing runs of ``events`` stored events in all (the ``ranks`` table's
    sum) on ``cores`` threads (DuckDB's default): one per :data:`EVENTS_PER_THREAD` events, at
    least 1, at most ``cores``. Most report statements read the stored summaries, a few thousand
    rows, where a second thread costs more CPU time in starting and joining than it saves in wall
    time; only the scans of a large run's events gain from every core (the measurements:
    benchmarks/README.md, "Analyze on one DuckDB thread, the page's template built once")."""
    return max(1, min(cores, -(-events // EVENTS_PER_THREAD)))


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
    tk_device_peak_gbps(device) → DOUBLE       nominal per-direction GB/s of the device's intra-node link
                                               (the busbw cap; NULL for an unknown device)
    tk_size_bucket(S) → BIGINT                 power-of-two size bucket, largest 2^k <= S (a macro:
                                               tracekit.model.size_bucket, SIZE_BUCKET_SQL)
    tk_int_mean(total, n) → DOUBLE             the mean of n integers summing to total as DuckDB's avg
                                               of integers in a GROUP BY gives it (:func:`int_mean`);
                                               NULL for n NULL or 0
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

    # predict_collective over every algorithm is costly (benchmarks/README.md) and tk_best_algo /
    # tk_best_time ask it twice per instance with arguments that repeat (same op, size, k, α, β):
    # remember the answers.
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

    def device_peak_gbps(device):
        # the nominal per-direction rate of the device's intra-node link (tracekit.model.device_presets,
        # LINK_PRESETS: vendor data sheets), GB/s: no rank's busbw over any link of it can exceed this
        from tracekit.model.links import LINK_PRESETS, device_presets

        got = device_presets(device)
        return None if got is None else LINK_PRESETS[got[0]].nominal_Bps / 1e9

    con.create_function("tk_device_peak_gbps", per_distinct(device_peak_gbps, "DOUBLE"), ["VARCHAR"], "DOUBLE",
                        type="arrow", null_handling="special")

    import pyarrow as pa

    def int_mean_udf(total, n):
        t, t_ok = _ints(total)
        c, c_ok = _ints(n)
        ok = t_ok & c_ok & (c != 0)
        out = np.zeros(len(t))
        out[ok] = int_mean(t[ok], c[ok])
        return pa.array(out, type=pa.float64(), mask=~ok)

    con.create_function("tk_int_mean", int_mean_udf, ["BIGINT", "BIGINT"], "DOUBLE", type="arrow",
                        null_handling="special")
    from tracekit.model import SIZE_BUCKET_SQL

    con.execute(SIZE_BUCKET_SQL)
    from tracekit.analyses import _nccl_udfs  # tk_nccl_*: NCCL's pick as a preset verdict's reference (UDFs, not an analysis)

    _nccl_udfs.register(con)


def int_mean(total, n):
    """``total / n`` per element (int64 numpy arrays, n != 0) as DuckDB's ``avg`` of integers in a
    GROUP BY computes the mean of n integers summing to ``total``: the sum and the count as C's
    ``long double``, divided, then rounded to double (its hugeint-state average), float64 numpy.
    On x86-64 that is the x87 80-bit format, so the answer can differ from ``total / n`` in double
    in the last bit; numpy's longdouble is the same C type as DuckDB's on any one platform."""
    import numpy as np

    return (np.asarray(total, dtype=np.int64).astype(np.longdouble)
            / np.asarray(n, dtype=np.int64).astype(np.longdouble)).astype(np.float64)


def _ints(col):
    """(int64 numpy values, validity) of an arrow integer column (0 where NULL)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return (pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64),
            col.is_valid().to_numpy(zero_copy_only=False))


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
    pyarrow table: building one from Python objects imports pandas, on every analyze.
    """
    names, types, cols = [], [], []
    for field in schema:
        t = str(field.type)
        conv = _PY_CONVERT[t]
        names.append(field.name)
        types.append(_DUCKDB_TYPES[t])
        vals = [r.get(field.name) for r in rows]
        # a value of the exact type is its own conversion (conv(v) == v): only the others are converted
        cols.append([v if v is None or type(v) is conv else conv(v) for v in vals])
    sel = ", ".join(f'unnest(?::{t}[]) AS "{n}"' for n, t in zip(names, types))
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {sel}", cols)
