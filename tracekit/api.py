"""The Python API for notebooks: ``tracekit.open(store)`` → :class:`Session`, ``.run()`` → :class:`Run`.

Every table comes back as a pandas DataFrame whose columns carry their unit in the name:
``_ns`` (nanoseconds, int64 exact where the store is), ``_bytes``, ``_GBps`` (GB/s with
GB = 1e9, the nccl-tests convention: ../shared/reference/alpha-beta.md "Units"), ``_s``
(seconds), ``_Bps`` (bytes/s); a name without a suffix is a count, a ratio or a label. The
DataFrames are the analysis views of ``tracekit sql`` (README "Analysis views", column meanings
in each ``analyses/<name>`` header) filtered to the run, with only ``*_gbps`` renamed
``*_GBps``.

Lazy: ``tracekit.open`` reads nothing; a :class:`Run` opens its DuckDB connection on the first
method call, and each analysis is built the first time a method needs it (``tracekit.analyses``
builds modules on first use), then reused by every later call on the same run.

    import tracekit
    tk = tracekit.open("tracekit-store")
    run = tk.run()                      # the newest run
    run.overlap(by="step")              # DataFrame: rank, step, comm_ns, ..., overlap_ratio
    run.sql("SELECT op, count(*) FROM collective_verdicts GROUP BY op").df()

Errors are tracekit's own (:mod:`tracekit.errors`): StoreError for an empty store or an unknown
run, BadInputError for bad arguments (an unknown ``by``, an unknown link preset).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from tracekit.errors import BadInputError
from tracekit.store import Store

__all__ = ["open", "Session", "Run"]

_GBPS = re.compile(r"_gbps$")


def _units(df):
    """``*_gbps`` → ``*_GBps`` (every other column already ends in its unit, or has none)."""
    return df.rename(columns={c: _GBPS.sub("_GBps", c) for c in df.columns if _GBPS.search(c)})


def open(store: str | os.PathLike | Store | None = None) -> "Session":  # noqa: A001 - tracekit.open
    """A handle on the store at ``store`` (default: ``$TRACEKIT_STORE`` or ``./tracekit-store``).

    Reads nothing until a method is called; a store folder that does not exist yet is created by
    the first :meth:`Session.ingest`.
    """
    return Session(store)


class Session:
    """A store: its runs, ingesting into it, and one :class:`Run` per run id."""

    def __init__(self, store: str | os.PathLike | Store | None = None):
        self.store = store if isinstance(store, Store) else Store(store)

    def __repr__(self) -> str:
        return f"tracekit.open({str(self.store.path)!r})"

    def runs(self):
        """The runs in the store, oldest first: one row per run.

        Columns: ``run_id``, ``created_at`` (timestamp, UTC), ``workload``, ``source`` (kineto,
        nsys, nccl_tests), ``backend``, ``world_size``, ``torch_version``, ``nccl_version``,
        ``device_name``, ``ranks`` (rank files ingested), ``events`` (events stored). Empty
        DataFrame (same columns) for an empty or missing store.
        """
        import pandas as pd

        cols = ["run_id", "created_at", "workload", "source", "backend", "world_size", "torch_version",
                "nccl_version", "device_name", "ranks", "events"]
        if not self.store.path.is_dir() or not self.store.run_ids():
            return pd.DataFrame(columns=cols)
        con = self.store.connect()
        try:
            return con.execute(
                "SELECT r.run_id, r.created_at, r.workload, r.source, r.backend, r.world_size, r.torch_version, "
                "r.nccl_version, r.device_name, count(k.rank) AS ranks, sum(k.events)::BIGINT AS events "
                "FROM runs r LEFT JOIN ranks k USING (run_id) GROUP BY ALL ORDER BY r.created_at, r.run_id"
            ).df()
        finally:
            con.close()

    def ingest(self, paths: str | os.PathLike | Sequence[str | os.PathLike], **opts) -> "Run":
        """Ingest trace files (one run, one file per rank) and return the :class:`Run`.

        ``paths``: a file, a folder of rank files, or a list of them (Kineto ``.json``/``.json.gz``,
        Nsight Systems ``.sqlite``, nccl-tests logs). ``opts``: the keyword arguments of
        :func:`tracekit.ingest.ingest_paths` (``run_id``, ``replace``, ``workload``,
        ``comm_patterns``, ``align``, ``jobs``). The same files ingested again give the existing
        run unless ``replace=True``. Raises FileError/BadInputError for unreadable or bad input.
        """
        from tracekit.ingest import ingest_paths

        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        rid = ingest_paths([str(p) for p in paths], self.store, **opts)
        return Run(self.store, rid)

    def run(self, run_id: str | None = None, link: str | None = None) -> "Run":
        """The run ``run_id`` (default: the newest), compared with link preset ``link`` if given.

        Raises StoreError for an empty store or an unknown run id, BadInputError for an unknown
        preset (``tracekit predict links`` lists them).
        """
        if run_id is None:
            run_id = self.store.latest_run_id()
        elif not self.store.has_run(run_id):
            raise self.store.missing_run(run_id)
        if link is not None:
            from tracekit.model import link_from_preset

            link_from_preset(link)
        return Run(self.store, run_id, link)


class Run:
    """One run's analyses as DataFrames (module docstring: units, laziness).

    The connection covers this run and the store's newest sweep run (whose α, β feed
    :meth:`measured_vs_model`, as in ``tracekit analyze``); every method filters to this run.
    :meth:`close` releases it (a closed run reopens on the next call).
    """

    def __init__(self, store: Store, run_id: str, link: str | None = None):
        self.store = store
        self.run_id = run_id
        self.link = link
        self._con = None
        self._sql_con = None  # the confined connection user queries run on (:meth:`sql`)

    def __repr__(self) -> str:
        return f"<tracekit run {self.run_id!r} in {str(self.store.path)!r}>"

    @property
    def con(self):
        """The run's DuckDB connection (``tracekit.analyses.connect``), opened on first use."""
        if self._con is None:
            from tracekit.report.data import report_connection

            _, self._con = report_connection(self.store, self.run_id, self.link)
        return self._con

    def close(self) -> None:
        for con in (self._con, self._sql_con):
            if con is not None:
                con.close()
        self._con = self._sql_con = None

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _view(self, view: str, order: str):
        cur = self.con.execute(f"SELECT * FROM {view} WHERE run_id = ? ORDER BY {order}", [self.run_id])
        return _units(cur.df())

    def sql(self, query: str, params: list | None = None, *, timeout_s: float | None = None,
            max_rows: int | None = None, max_bytes: int | None = None):
        """``query`` (one read-only statement) → a DuckDB relation (``.df()``, ``.arrow()``, ``.fetchall()``; duckdb 2 relations have no ``fetchone``).

        The statement runs at the call, bounded as ``tracekit sql`` bounds it
        (:func:`tracekit.sqlshell.fetch_bounded`): interrupted after ``timeout_s`` seconds
        (default :data:`tracekit.sqlshell.DEFAULT_TIMEOUT_S`), refused past ``max_rows`` rows or
        ``max_bytes`` bytes (defaults ``DEFAULT_MAX_ROWS``, ``DEFAULT_MAX_BYTES``; 0: no limit),
        each with BadInputError; the relation returned reads the result held in memory.

        Every view of ``tracekit sql`` is there (README "Analysis views"), holding this run's rows
        only (every table and view with a ``run_id`` column is read through a view of it filtered
        to :attr:`run_id`, so an aggregate over a view is this run's; the analyses are built over
        the run and the store's calibration runs first, as the report builds them). Columns
        keep the views' names (``*_gbps``). The query runs confined, as ``tracekit sql`` runs it
        (:mod:`tracekit.sqlshell`: SELECT or EXPLAIN of one only, the store's own files only, the
        connection's configuration locked), on a connection of its own.
        Raises BadInputError for a refused or failing query.
        """
        import duckdb

        from tracekit.errors import BadInputError
        from tracekit.sqlshell import check_read_only, confine

        check_read_only(query)
        if self._sql_con is None:
            from tracekit.report.data import report_connection

            _, acon = report_connection(self.store, self.run_id, self.link)
            confine(acon.duckdb, acon.bound_files)
            self._sql_con = acon
        raw = self._sql_con.duckdb  # the DuckDB connection itself (SET is locked: no budget retry)
        from tracekit import sqlshell

        try:
            self._scope_to_run(query)  # the analyses it names built, then this run's rows only
            table = sqlshell.fetch_bounded(
                raw, lambda: raw.sql(query, params=params) if params else raw.sql(query),
                timeout_s=sqlshell.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s,
                max_rows=sqlshell.DEFAULT_MAX_ROWS if max_rows is None else max_rows,
                max_bytes=sqlshell.DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
            if getattr(self, "_result_con", None) is None:
                self._result_con = duckdb.connect()  # in memory: holds no file, reads only the tables given
            return self._result_con.from_arrow(table)
        except duckdb.Error as exc:
            lines = str(exc).splitlines()
            raise BadInputError(f"SQL error: {lines[0] if lines else type(exc).__name__}") from None

    def _scope_to_run(self, query: str) -> None:
        """Build the analyses ``query`` names over every run of the connection (unscoped), then put
        a temporary view in front of each table and view with a ``run_id`` column that keeps this
        run's rows (the same name: DuckDB resolves the temporary schema first)."""
        con = self._sql_con
        raw = con.duckdb
        scoped = self.__dict__.setdefault("_run_scoped", [])  # the views this made (not the store's registered ones)
        while scoped:
            raw.execute(f'DROP VIEW temp.main."{scoped.pop()}"')
        con.analyses.prepare(query)  # creates the modules it names
        (db,) = raw.execute("SELECT current_database()").fetchone()
        rid = self.run_id.replace("'", "''")
        for (name,) in raw.execute(
                "SELECT DISTINCT table_name FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND column_name = 'run_id' AND NOT internal").fetchall():
            raw.execute(f'CREATE TEMP VIEW "{name}" AS SELECT * FROM "{db}".main."{name}" WHERE run_id = \'{rid}\'')
            scoped.append(name)

    def collectives(self):
        """One row per collective call per rank (the ``collectives`` table), by rank then start.

        Columns: ``rank``, ``pg_name``, ``seq`` (call number in the group), ``op``, ``dtype``,
        ``size_bytes`` (the nccl-tests size), ``wire_bytes``, ``ts_ns``/``dur_ns`` (start, length
        on the run's common clock), ``issue_ts_ns``, ``peer``, ``algo``, ``proto``,
        ``meta_source`` (where the op and size came from), ``approx``, ``log_algbw_GBps``/
        ``log_busbw_GBps`` (nccl-tests logs only), ``cpu_side`` (a CPU span, no GPU kernel: a gloo
        span or a CPU-only trace's collective call, launch and waiting included; README
        "Definitions"), DESIGN.md "collectives".
        """
        return self._view("collectives", "rank, ts_ns, event_id")

    def instances(self):
        """One row per collective instance, matched across ranks by (pg_name, seq).

        Columns: ``op``, ``size_bytes``, ``group_size``, ``ranks_seen``, ``complete``,
        ``disagree``, ``first_arrival_ns``, ``last_arrival_ns``, ``last_end_ns``, ``skew_ns``
        (last − first arrival), ``sync_time_ns`` (median over ranks of end − last arrival),
        ``straggler`` (the last rank to arrive), ``algo``.
        """
        return self._view("collective_instances", "first_arrival_ns, pg_name, seq")

    def waits(self):
        """One row per rank per instance: ``wait_ns`` = last arrival − the rank's start.

        Columns: ``pg_name``, ``seq``, ``rank``, ``event_id``, ``op``, ``ts_ns``, ``dur_ns``,
        ``wait_ns``, ``is_straggler``.
        """
        return self._view("collective_waits", "pg_name, seq, rank")

    def bandwidth(self, by: str = "instance"):
        """Bandwidth by the nccl-tests rules (alpha-beta.md "Bus bandwidth"); GB = 1e9.

        ``by="instance"``: one row per instance (``collective_bandwidth``): ``pg_name``, ``seq``,
        ``op``, ``size_bytes``, ``group_size``, ``sync_time_ns``, ``algbw_GBps`` = size / sync time,
        ``bus_factor``, ``busbw_GBps`` = algbw × bus factor. ``by="size"``: one row per process group
        (nccl-tests: benchmark run), op, group size and power-of-two size bucket
        (``bandwidth_by_size``, tracekit.model.size_bucket): ``bucket_bytes``, ``instances``,
        ``sizes``, ``total_bytes``, ``median_sync_time_ns``, ``median_algbw_GBps``,
        ``median_busbw_GBps``, ``peak_busbw_GBps`` (medians within a bucket, never across sizes).
        Raises BadInputError for another ``by``.
        """
        views = {"instance": ("collective_bandwidth", "pg_name, seq"),
                 "size": ("bandwidth_by_size", "op, group_size, pg_name, bucket_bytes")}
        if by not in views:
            raise BadInputError(f"bandwidth(by={by!r}): by is one of instance, size")
        return self._view(*views[by])

    def overlap(self, by: str = "rank"):
        """How much communication was hidden behind compute, on unions of intervals.

        ``by="rank"``: one row per rank (``overlap_by_rank``); ``"step"``: per rank per profiler
        step (``overlap_by_step``, adds ``step``); columns ``comm_ns`` = |∪comm|, ``compute_ns``,
        ``overlap_ns`` = |∪comm ∩ ∪compute|, ``exposed_comm_ns`` = comm − overlap,
        ``overlap_ratio`` = overlap / comm (null without communication). ``"call"``: one row per
        communication span (``collective_overlap``): ``rank``, ``event_id``, ``name``, ``ts_ns``,
        ``dur_ns``, ``overlap_ns``, ``overlap_fraction``. Raises BadInputError for another ``by``.
        """
        views = {"rank": ("overlap_by_rank", "rank"), "step": ("overlap_by_step", "rank, step"),
                 "call": ("collective_overlap", "rank, ts_ns, event_id")}
        if by not in views:
            raise BadInputError(f"overlap(by={by!r}): by is one of rank, step, call")
        return self._view(*views[by])

    def fit(self):
        """The α–β fits from this run's own collectives (``alpha_beta_fit``): one per (process group
        or nccl-tests benchmark run, op, group size), ``scope`` 'group', and one per (locality
        class, op, group size) over a trace's groups of that class, ``scope`` 'locality'.

        T(D) = a + b·D by least squares on sync times (alpha-beta.md "Fitting"); columns
        ``scope``, ``pg_name``, ``locality``, ``groups``, ``op``, ``group_size``, ``algo``, ``n_samples``/``n_used``/``n_dropped``/``n_warmup``,
        ``alpha_s`` (s), ``beta_Bps`` (bytes/s), ``beta_GBps``, ``n_half_bytes`` (the size where
        α and β terms are equal), ``a_s``, ``b_s_per_byte``, ``residual_spread``,
        ``residual_max_abs``, ``min_size_bytes``, ``max_size_bytes``, ``status`` (why a fit is
        missing, e.g. a single size).
        """
        return self._view("alpha_beta_fit", "op, group_size, scope, locality, pg_name")

    def verdicts(self):
        """One row per instance: latency-, bandwidth- or skew-bound, and the model's prediction.

        skew-bound when the longest wait exceeds the sync time, else latency-bound when the α
        term ≥ the β term, else bandwidth-bound (DESIGN.md "verdict"). Columns: ``op``,
        ``size_bytes``, ``group_size``, ``locality`` (the group's class), ``model_algo``,
        ``sync_time_ns``, ``skew_ns``,
        ``fit_alpha_s``, ``fit_beta_Bps``, ``fit_alpha_term_ns``, ``fit_beta_term_ns``,
        ``fit_predicted_ns``, ``link`` (the preset, if any), ``link_*_ns``, ``verdict``,
        ``verdict_basis`` (fit or link), ``efficiency`` (predicted / measured),
        ``efficiency_link``, ``best_algo``, ``best_predicted_ns``.
        """
        return self._view("collective_verdicts", "pg_name, seq")

    def measured_vs_model(self):
        """Per rank: measured exposed communication per step against the model's prediction.

        Columns: ``workload``, ``rank``, ``steps``, ``compute_ns``, ``comm_ns``, ``overlap_ns``,
        ``exposed_ns`` (measured, per step), ``model`` (the run's overlap model),
        ``predicted_comm_ns``, ``predicted_exposed_ns``, ``alpha_s``, ``beta_Bps``,
        ``ab_source`` (link preset, sweep run or this run's fit), ``gap_ratio`` (measured /
        predicted), ``larger``, ``bubble_fraction``, ``note``.
        """
        return self._view("measured_vs_model", "rank")

    def whatif(self, *, link: str | None = None, algo: str | None = None, scale: str | None = None,
               no_stragglers: bool = False, chunk: str | None = None, move_off: str | None = None,
               ops: str | None = None, delay: str | None = None, machine: str | None = None,
               steps: list | None = None) -> dict:
        """The step time of a change, predicted by replaying each step's graph across ranks: the dict
        ``tracekit whatif --json`` prints (:func:`tracekit.report.whatif.whatif_answer`). Edits:
        ``link`` (a preset: collective transfer times from the α–β model; ``algo``, ``ops``),
        ``scale`` ('gemm=0.5,compute=0.9'), ``no_stragglers``, ``chunk`` ('all_reduce=4', needs
        ``link``), ``move_off`` (a collective pattern), ``delay`` ('1:200@all_reduce': a straggler),
        ``machine`` (a preset or TOML file: NCCL's own model there, not with ``link``).
        Per step and rank: ``measured_ns``, ``replayed_ns``, ``edited_ns`` (None with ``edited_range_ns`` and the step's ``limits`` where
        the trace cannot support one number), the critical path's parts before and after (ns).
        Raises BadInputError for no edit, an unknown preset or a malformed edit."""
        from tracekit.report.whatif import whatif_answer

        return whatif_answer(self.con, self.run_id, link=link, algo=algo, scale=scale, no_stragglers=no_stragglers,
                             chunk=chunk, move_off=move_off, ops=ops, delay=delay, machine=machine,
                             steps=steps)

    def report(self) -> dict:
        """The report as data: the dict ``tracekit analyze --json`` prints (:func:`tracekit.report.data.build_report`)."""
        from tracekit.report.data import build_report

        return build_report(self.store, self.run_id, self.link, con=self.con)

    def html(self, path: str | os.PathLike) -> Path:
        """Write the self-contained HTML report (``tracekit analyze --html``) to ``path``; returns it."""
        from tracekit.report.html import write_html_report

        return write_html_report(self.store, path, run_id=self.run_id, link=self.link,
                                 report=self.report(), con=self.con)

    def export_perfetto(self, path: str | os.PathLike):
        """Write the run as one Chrome/Perfetto JSON (``tracekit export --perfetto``); returns ExportStats."""
        from tracekit.report.perfetto import export_perfetto

        return export_perfetto(self.store, path, run_id=self.run_id)
