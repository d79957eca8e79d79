"""The Parquet store: one directory per run, DuckDB views over all of them.

Layout (``<store>`` defaults to ``./tracekit-store``; ``--store`` or the
``TRACEKIT_STORE`` environment variable change it)::

    <store>/runs/<run_id>                      symbolic link to the current version, ../versions/<run_id>@<n>
    <store>/runs/<run_id>/run.parquet          1 row: the ``runs`` table
    <store>/runs/<run_id>/ranks.parquet        1 row per rank
    <store>/runs/<run_id>/events/rank=<r>.parquet
    <store>/runs/<run_id>/collectives.parquet  1 row per collective call per rank
    <store>/runs/<run_id>/overlap_summary.parquet  1 row per rank and window (whole trace, steps)
    <store>/runs/<run_id>/span_overlap.parquet     1 row per comm event: its overlap with compute
    <store>/runs/<run_id>/gpu_breakdown_summary.parquet, gpu_launcher_summary.parquet   GPU time per rank
    <store>/runs/<run_id>/gpu_op_durations.parquet  per rank: GPU ops counted per class, name and duration
    <store>/runs/<run_id>/collective_steps.parquet  per rank: the profiler step of each collective call's event
    <store>/runs/<run_id>/rank_critical_path.parquet, rank_critical_path_summary.parquet   a run of one rank: its
                                               critical paths (CRITICAL_PATH_TABLES)
    <store>/runs/<run_id>/critical_path_nodes.parquet  a run of several ranks: the critical path's nodes
    <store>/runs/<run_id>/rank_steps.parquet   per rank and profiler step: events, first start, last end
                                               (these ten in every run, SUMMARY_TABLES; maybe empty)
    <store>/runs/<run_id>/fr_entries.parquet   Flight Recorder entries (fr_groups, fr_dumps beside it); only runs with dumps
    <store>/versions/<run_id>@<n>/             the version directories (runs/* holds only the current ones)
    <store>/.staging/                          private to writers

Writes are atomic: a run is assembled in ``.staging``, renamed into ``runs/`` as a new
version and made current by one rename of its link (:meth:`Staging.commit`), so an
interrupted or failed ingest leaves the store as it was and a replace is seen by readers
as the old run or the new one, never none; the next writer cleans up after one that died
(:func:`recover`). Run directories of older stores (plain directories) are read too. Every run row carries ``schema_version``; a reader refuses a store whose
major version is newer than this tracekit's (``StoreError``).

The column contract is in ``../shared/DESIGN.md`` ("The store"); the Arrow
schemas below are its executable form.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterable

import pyarrow as pa

from tracekit.errors import FileError, StoreError

SCHEMA_VERSION = "1.2"
"""Store schema version, ``MAJOR.MINOR``; a reader refuses a newer MAJOR. 1.1 added the Flight
Recorder tables (fr_entries, fr_groups, fr_dumps); a 1.0 run reads them as empty. 1.2 added the
summary tables gpu_op_durations and collective_steps, and the critical path's tables
(CRITICAL_PATH_TABLES); the analyses refuse a run with events stored without them ("ingest it again
with --replace", :meth:`AnalysisConnection.require_stored`)."""

CLIP_TOLERANCE_NS = 100
"""Overlaps of consecutive GPU ops on one stream up to this are clock noise: kept and counted
(the ranks' ``same_stream_overlaps``), not clipped (tracekit.ingest.linkpass)."""

RUN_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # whole names: a trailing newline does not pass

RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("source", pa.string()),  # kineto / nsys / nccl_tests / collector name
        ("workload", pa.string()),  # tp / ep / pp / disagg_kv / sweep / external
        ("backend", pa.string()),  # nccl / rccl / gloo / unknown
        ("world_size", pa.int32()),
        ("torch_version", pa.string()),
        ("nccl_version", pa.string()),
        ("device_name", pa.string()),
        ("config", pa.string()),  # JSON text
        ("schema_version", pa.string()),
    ]
)

RANKS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("host", pa.string()),
        ("source_path", pa.string()),
        ("source_sha256", pa.string()),
        ("clock_offset_ns", pa.int64()),
        ("clock_offset_err_ns", pa.int64()),
        ("events", pa.int64()),
        ("events_quarantined", pa.int64()),
        ("warnings", pa.list_(pa.string())),
        ("gpu_events", pa.int64()),  # events on GPU streams; 0: the rank's trace has no GPU activity (CPU-only)
        ("same_stream_overlaps", pa.int64()),  # GPU ops kept whole over the next op on their stream (PDL, noise)
    ]
)

EVENTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("event_id", pa.int64()),  # unique within (run, rank); file order
        ("track_kind", pa.string()),  # gpu_stream / cpu_thread
        ("device", pa.int64()),  # GPU index, or process id for CPU threads
        ("track", pa.int64()),  # stream id or thread id
        ("category", pa.string()),  # kernel, memcpy, memset, sync, cpu_op, user_annotation, runtime, ...
        ("name", pa.string()),
        ("ts_ns", pa.int64()),  # start, ns on the run's common clock
        ("dur_ns", pa.int64()),  # duration, ns
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("launch_event_id", pa.int64()),  # GPU work -> the runtime launch call on the CPU
        ("class", pa.string()),  # compute / comm / memory / sync / cpu / other
        ("step", pa.int64()),  # profiler step number or null
        ("clipped", pa.bool_()),  # overlapped the next op on its GPU stream; cut to its start
        ("clipped_ns", pa.int64()),  # how much was cut, ns (0 when not clipped)
    ]
)

COLLECTIVES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("event_id", pa.int64()),  # the span that communicated (NCCL kernel / gloo span)
        ("pg_name", pa.string()),
        ("pg_ranks", pa.list_(pa.int32())),
        ("group_size", pa.int32()),
        ("seq", pa.int64()),
        ("op", pa.string()),  # canonical op, null when unattributed
        ("dtype", pa.string()),
        ("size_bytes", pa.int64()),  # nccl-tests S
        ("wire_bytes", pa.int64()),  # bytes this rank must put on the wire
        ("in_splits", pa.list_(pa.int64())),  # all-to-all input splits, elements per peer ([] = even)
        ("out_splits", pa.list_(pa.int64())),  # all-to-all output splits, elements per peer
        ("peer", pa.int32()),
        ("algo", pa.string()),
        ("proto", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("meta_source", pa.string()),  # kernel_args / record_param_comms / cpu_op_dims / name_only
        ("approx", pa.bool_()),
        ("issue_ts_ns", pa.int64()),  # when the CPU issued it (launch or op start); orders seq
        ("log_algbw_gbps", pa.float64()),  # nccl-tests runs: the log's own algbw, GB/s
        ("log_busbw_gbps", pa.float64()),  # nccl-tests runs: the log's own busbw, GB/s
        ("in_place", pa.bool_()),  # nccl-tests runs: the in-place column
        ("wrong", pa.int64()),  # nccl-tests runs: wrong values of the row (#wrong; see nccl_tests_run); else null
        ("cpu_side", pa.bool_()),  # a CPU span with no GPU kernel (gloo span or collective CPU call); null: nccl-tests
        # where group_size came from: metadata (Group size / Process Group Ranks), shapes (the call's
        # tensors: output = k × input...), membership (the group's recorded ranks), world (the world
        # size, a last resort); null: unknown k, or a nccl-tests log (k from the log)
        ("k_source", pa.string()),
    ]
)

SUMMARY_TABLES = ("overlap_summary", "span_overlap", "gpu_breakdown_summary", "gpu_launcher_summary",
                  "gpu_op_durations", "collective_steps", "rank_critical_path", "rank_critical_path_summary",
                  "critical_path_nodes", "rank_steps")
"""Tables every ingest path writes for every run (empty where there is nothing to summarise:
nccl-tests logs, Flight Recorder dumps alone, CPU-only ranks' GPU tables, and the GPU breakdown
tables (gpu_breakdown_summary, gpu_launcher_summary) of a run whose GPU work could not be swept,
with the reason in its ranks' warnings). They are computed at ingest only: the analyses read them
and nothing else (:meth:`AnalysisConnection.require_stored` refuses a run lacking one, or holding it
damaged, with "ingest it again with --replace")."""

# Per-rank overlap summaries, computed at ingest (tracekit.timeline.intervals.rank_overlap_summary, called by
# tracekit.ingest.assemble.assemble_rank) so that analyze need not scan the events for overlap.
# Runs without events (nccl-tests logs, Flight Recorder dumps alone) hold the files empty. These base
# views hold the stored rows only: query overlap_by_rank / overlap_by_step / collective_overlap. Timestamps are on the run's common clock (shifted by the rank's
# clock offset like the events); lengths are ns.
OVERLAP_SUMMARY_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("grp", pa.int64()),  # -1 = whole trace (a row for every rank), else the profiler step
        ("spans", pa.int64()),  # comm/compute spans in the window (0: no overlap_windows row unless grp = -1)
        ("comm_ns", pa.int64()),  # |∪ comm|
        ("compute_ns", pa.int64()),  # |∪ compute|
        ("overlap_ns", pa.int64()),  # |∪ comm ∩ ∪ compute|
        ("recv_ns", pa.int64()),  # |∪ recv spans| (steps only; 0 for grp = -1)
        ("recv_hidden_ns", pa.int64()),  # |∪ recv ∩ ∪ compute| (steps only)
        ("first_ns", pa.int64()),  # first start of the window's comm/compute events
        ("last_ns", pa.int64()),  # last end of them
    ]
)

SPAN_OVERLAP_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("event_id", pa.int64()),  # the comm span (events.event_id), one row per comm event
        ("name", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("overlap_ns", pa.int64()),  # |span ∩ ∪ compute| over the whole trace
    ]
)

# Per-rank GPU time summaries, computed at ingest (tracekit.timeline.gpu, called by
# tracekit.ingest.assemble.assemble_rank from the rows the link pass writes), so that analyze need
# not read the GPU ops and CPU ranges of every rank. Empty for runs without GPU work, and for a run
# one of whose ranks' GPU work could not be swept (GPU_NOT_SUMMARISED in that rank's warnings); the
# public views are gpu_time_breakdown and gpu_time_by_launcher. Window ends are on the run's common
# clock (shifted by the rank's clock offset like the events); lengths are ns.
GPU_BREAKDOWN_SUMMARY_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("rank", pa.int32()),
     ("grp", pa.int64())]  # -1 = whole trace, else the profiler step (a row per window with GPU work)
    + [(c, pa.int64()) for c in (
        "window_start_ns", "window_end_ns",  # first start, last end of the window's GPU work
        "compute_only_ns", "comm_exposed_ns", "comm_hidden_ns", "memory_ns", "sync_ns", "other_ns",
        "idle_ns",  # the seven parts, summing to window_end_ns − window_start_ns
        "idle_host_wait_ns", "idle_kernel_wait_ns", "idle_other_ns")]  # idle by class, summing to idle_ns
)

GPU_NOT_SUMMARISED = "GPU time breakdown not computed at ingest"
"""The start of the rank warning that says why a run's GPU summary tables are empty although it has
GPU work (tracekit.ingest.assemble: a stray timestamp makes the work too long to sweep)."""

GPU_LAUNCHER_SUMMARY_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("launcher_kind", pa.string()),  # cpu_op / annotation
        ("launcher", pa.string()),  # its name; null for the GPU ops without one (one row of its own)
        ("gpu_ops", pa.int64()),  # GPU ops of the rank launched under it
        ("gpu_total_ns", pa.int64()),  # sum of their durations
        ("compute_ns", pa.int64()),  # the part of gpu_total_ns in class compute
        ("comm_ns", pa.int64()),  # the part in class comm
    ]
)


# Per-rank summaries of the events the report would otherwise scan, computed at ingest from the rows
# the link pass writes (tracekit.ingest.assemble.assemble_rank), so that analyze opens no rank's
# events file. Empty for runs without events. Neither holds a timestamp (no clock shift applies).
#
# gpu_op_durations: the rank's GPU ops (events on GPU tracks, track_kind 'gpu_stream', other than
# Kineto's gpu_user_annotation ranges; durations as stored, after the ingest's stream clipping)
# counted per (class, name, duration): a histogram that merges exactly over ranks, so the kernel
# summary's counts, sums, means, exact quantiles and maxima over all ranks come from it
# (analyses/kernel_summary.sql). One row per distinct (class, name, dur_ns) of the rank.
GPU_OP_DURATIONS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("class", pa.string()),  # events.class of the ops (compute / comm / memory / sync / other)
        ("name", pa.string()),  # events.name (kernel name, "Memcpy HtoD ..."); null for ops without one
        ("dur_ns", pa.int64()),  # their duration, ns (events.dur_ns)
        ("ops", pa.int64()),  # the rank's GPU ops of this class, name and duration
        ("step_ops", pa.int64()),  # those of them in a profiler step (events.step not null)
    ]
)

# collective_steps: per collectives row's event (collectives.event_id) that lies in a profiler step,
# that step and whether the event is communication; one row per such event of the rank (an event
# without a step has none). measured_vs_model joins the calls on it instead of the events.
COLLECTIVE_STEPS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("event_id", pa.int64()),  # the collective's span (collectives.event_id = events.event_id)
        ("step", pa.int64()),  # events.step of that event: its profiler step number
        ("comm", pa.bool_()),  # events.class = 'comm' for that event
    ]
)



# The critical path's tables, written by each rank at ingest (tracekit.ingest.critical_path, called
# by tracekit.ingest.assemble.assemble_rank; the walk: tracekit.timeline.critical_path). A run of one
# rank stores its paths final (rank_critical_path, rank_critical_path_summary: the columns of the
# critical_path and critical_path_summary views, analyses/critical_path.py, but length_ns and
# window_ns); a run of several ranks stores its nodes instead (critical_path_nodes), which the
# analysis walks with the collective edges across ranks. rank_steps: every run with events. Times are
# ns on the run's common clock (shifted by the rank's clock offset like the events).
RANK_CRITICAL_PATH_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),  # the rank whose step the path explains
        ("step", pa.int64()),  # profiler step; null for the whole trace of a run without steps
        ("pos", pa.int32()),  # position on the path, 0 = the earliest event
        ("event_rank", pa.int32()),  # the rank the event ran on
        ("event_id", pa.int64()),
        ("name", pa.string()),
        ("class", pa.string()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("on_path_ns", pa.int64()),  # the part of the event credited to the path
        ("gap_ns", pa.int64()),  # the gap credited before it
        ("edge", pa.string()),  # how the next event on the path depends on this one ('end' for the last)
    ]
)

RANK_CRITICAL_PATH_SUMMARY_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("rank", pa.int32()), ("step", pa.int64()),
     ("start_ns", pa.int64()), ("end_ns", pa.int64())]  # the path's first credited piece, its end
    + [(c, pa.int64()) for c in ("compute_ns", "exposed_comm_ns", "memory_ns", "launch_cpu_ns", "sync_other_ns",
                                 "straggler_ns", "idle_ns")]  # the composition: sums to end_ns − start_ns
    + [("path_events", pa.int64()), ("other_ranks", pa.int32())]
)

CRITICAL_PATH_NODES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("step", pa.int64()),  # events.step
        ("event_id", pa.int64()),
        ("gpu", pa.bool_()),  # on a GPU stream
        ("tid", pa.int64()),  # the event's track (kind, device, track) as a number that sorts like it within the rank
        ("ts_ns", pa.int64()),
        ("end_ns", pa.int64()),  # ts_ns + dur_ns
        ("launch_event_id", pa.int64()),  # events.launch_event_id
        ("name", pa.string()),
        ("class", pa.string()),  # events.class
    ]
)

RANK_STEPS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("step", pa.int64()),  # profiler step; null: the rank's events in no step
        ("events", pa.int64()),  # the rank's events with that step
        ("first_ns", pa.int64()),  # first start of those with a start and a non-negative duration; null: none
        ("last_ns", pa.int64()),  # last end of those
    ]
)

CRITICAL_PATH_TABLES = ("rank_critical_path", "rank_critical_path_summary", "critical_path_nodes", "rank_steps")
"""The critical path's tables of SUMMARY_TABLES."""

# Flight Recorder dumps (tracekit.ingest.flight_recorder): one row per entry of each rank's ring
# buffer, the process groups' global ranks where a dump names them, one row per dump. A run without
# dumps has none of these files (its views are empty). Times are the dumping rank's wall clock, ns
# since the epoch (not shifted to the run's common clock).
FR_ENTRIES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),  # global rank that dumped it
        ("record_id", pa.int64()),  # position in the rank's recording (grows by one per entry)
        ("pg_id", pa.int64()),
        ("pg_name", pa.string()),  # process group name ("0" = the default group), as in collectives.pg_name
        ("pg_desc", pa.string()),  # its description ("default_pg", "undefined", a user's group_desc)
        ("collective_seq_id", pa.int64()),  # per process group, from 1; 0 for p2p
        ("p2p_seq_id", pa.int64()),  # per process group, p2p calls; 0 for collectives
        ("op_id", pa.int64()),
        ("profiling_name", pa.string()),  # as recorded ("gloo:all_reduce")
        ("op", pa.string()),  # canonical op (tracekit.model.ops), else the name without its backend
        ("is_p2p", pa.bool_()),
        ("input_sizes", pa.list_(pa.list_(pa.int64()))),  # one shape per input tensor
        ("output_sizes", pa.list_(pa.list_(pa.int64()))),
        ("input_dtypes", pa.list_(pa.string())),
        ("output_dtypes", pa.list_(pa.string())),
        ("in_bytes", pa.int64()),  # Σ numel × dtype bytes of the inputs; null when a dtype is unknown
        ("out_bytes", pa.int64()),
        ("state", pa.string()),  # scheduled / started / completed
        ("retired", pa.bool_()),
        ("time_created_ns", pa.int64()),  # when the rank issued it, wall clock ns
        ("time_started_ns", pa.int64()),  # when the watchdog saw it start; null when not seen
        ("time_completed_ns", pa.int64()),  # when the watchdog saw it complete; null when not seen
        ("duration_ns", pa.int64()),  # recorded duration (timing enabled, completed), else null
        ("timeout_ms", pa.int64()),
        ("thread_id", pa.string()),
        ("thread_name", pa.string()),
        ("frames", pa.list_(pa.string())),  # stack, innermost first: "function file:line"; null when not dumped
    ]
)

FR_GROUPS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),  # the rank whose dump names the group
        ("pg_name", pa.string()),
        ("pg_desc", pa.string()),
        ("ranks", pa.list_(pa.int32())),  # the group's global ranks
        ("source", pa.string()),  # pg_config (the dump's own) / tracekit (written by tracekit's agent)
    ]
)

FR_DUMPS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("source_path", pa.string()),
        ("source_sha256", pa.string()),
        ("version", pa.string()),  # the dump's schema version ("2.10")
        ("comm_lib_version", pa.string()),  # NCCL version; null on gloo
        ("entries", pa.int64()),
        ("pg_status", pa.string()),  # JSON: per pg, last enqueued / started / completed seq
        ("dumped_at_ns", pa.int64()),  # when it was dumped (wall clock ns), when the dumper said so
        ("world_size", pa.int32()),  # when the dumper said so
        ("reason", pa.string()),  # why it was dumped (timeout / signal / exception / exit), when known
    ]
)


def write_empty_summaries(stage: Path) -> None:
    """Write an empty file of each SUMMARY_TABLES table that the staged run ``stage`` lacks (a run
    without events: nccl-tests logs, Flight Recorder dumps alone). Errors of the writes propagate."""
    import pyarrow.parquet as pq

    for t in SUMMARY_TABLES:
        f = Path(stage) / TABLES[t][0]
        if not f.exists():
            pq.write_table(TABLES[t][1].empty_table(), f, **PARQUET_OPTS)


def _parquet_problem(path: Path, schema: pa.Schema) -> str | None:
    """Why ``path`` cannot be read as one of this table's files (not Parquet, cut short, a column
    the table does not have), or None. Reads the footer only."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowException) as exc:
        return f"not a readable Parquet file ({' '.join(str(exc).split())[:120]})"
    extra = sorted(set(names) - set(schema.names))
    return f"columns this table does not have ({', '.join(extra[:4])})" if extra else None


TABLES = {
    "runs": ("run.parquet", RUNS_SCHEMA),
    "ranks": ("ranks.parquet", RANKS_SCHEMA),
    "events": ("events/*.parquet", EVENTS_SCHEMA),
    "collectives": ("collectives.parquet", COLLECTIVES_SCHEMA),
    "overlap_summary": ("overlap_summary.parquet", OVERLAP_SUMMARY_SCHEMA),
    "span_overlap": ("span_overlap.parquet", SPAN_OVERLAP_SCHEMA),
    "gpu_breakdown_summary": ("gpu_breakdown_summary.parquet", GPU_BREAKDOWN_SUMMARY_SCHEMA),
    "gpu_launcher_summary": ("gpu_launcher_summary.parquet", GPU_LAUNCHER_SUMMARY_SCHEMA),
    "rank_critical_path": ("rank_critical_path.parquet", RANK_CRITICAL_PATH_SCHEMA),
    "rank_critical_path_summary": ("rank_critical_path_summary.parquet", RANK_CRITICAL_PATH_SUMMARY_SCHEMA),
    "critical_path_nodes": ("critical_path_nodes.parquet", CRITICAL_PATH_NODES_SCHEMA),
    "rank_steps": ("rank_steps.parquet", RANK_STEPS_SCHEMA),
    "fr_entries": ("fr_entries.parquet", FR_ENTRIES_SCHEMA),
    "fr_groups": ("fr_groups.parquet", FR_GROUPS_SCHEMA),
    "fr_dumps": ("fr_dumps.parquet", FR_DUMPS_SCHEMA),
    "gpu_op_durations": ("gpu_op_durations.parquet", GPU_OP_DURATIONS_SCHEMA),
    "collective_steps": ("collective_steps.parquet", COLLECTIVE_STEPS_SCHEMA),
}

PARQUET_OPTS = dict(compression="zstd", compression_level=3)
ANALYSIS_MEMORY_LIMIT = 48 * 2**20
"""DuckDB's memory budget for analyses, bytes (it spills beyond; see :class:`AnalysisConnection`).
No analysis holds a whole rank in one window (overlap_windows sweeps a sorted stream,
collective_instances is built in parts), so a small budget suffices (the peaks measured with it:
benchmarks/README.md, "Design measurements kept out of the code")."""

ANALYSIS_MEMORY_MAX = 8 * 2**30
"""The budget a statement that cannot run within ANALYSIS_MEMORY_LIMIT may grow to (×4 per retry)."""


class AnalysisConnection:
    """The connection analyses and reports run on: a DuckDB connection to a store's runs
    (:meth:`Store.connect`) whose ``execute`` retries a statement that ran out of memory.

    Sorts, joins and aggregations spill to disk within the budget; a window over one very
    large partition may not, and DuckDB then fails the statement. Instead of failing the
    report, the budget is raised ×4 (up to ANALYSIS_MEMORY_MAX) and the statement run again
    (a failed statement has no effect). Everything else is the wrapped connection's.

    ``duckdb``: the DuckDB connection itself (a statement run on it skips the budget retry and
    the analyses). ``analyses``: None on a bare store connection; ``tracekit.analyses.connect``
    sets it to the analyses' builder, whose ``prepare(statement)`` ``execute`` and ``sql`` call
    first, so that the analyses a statement names exist when it binds.
    """

    def __init__(self, con, limit: int):
        self.duckdb = con
        self.analyses = None
        self._pins: list[int] = []  # shared locks on the run versions the views read (Store.pin)
        self.bound_files: list[str] = []  # every Parquet file the store's views read (tracekit.sqlshell)
        self.run_tables: dict[str, set[str]] = {}  # run id → the TABLES it has files of
        self.damaged_runs: dict[str, str] = {}  # run id → why it was left out (Store.connect of every run)
        self.damaged_summaries: dict[tuple[str, str], str] = {}  # (run id, SUMMARY_TABLES name) → the refusal
        self.memory_limit = limit
        con.execute(f"SET memory_limit = '{limit}B'")

    def require_stored(self, tables) -> None:
        """Check that every run of this connection holds a readable file of each of ``tables`` (names
        of SUMMARY_TABLES, which the analyses read and never compute). Raises StoreError (exit 2, one
        line) for the first run, by id, that was stored without one ("run R was stored without T
        (T.parquet): ingest it again with --replace") or holds it damaged (the file and what is
        wrong with it, the same advice), naming the run's traces (:meth:`_sources`). A run without
        events (ranks.events = 0: an nccl-tests log, Flight Recorder dumps alone, also as stored before
        every run held the summary files) is not checked: its summaries are empty whatever its files, so a store's old
        calibration logs never block another run's report."""
        with_events = self._runs_with_events()
        for rid in sorted(set(self.run_tables) - set(self.damaged_runs)):
            if rid not in with_events:
                continue
            for t in tables:
                if (rid, t) in self.damaged_summaries:
                    raise StoreError(self.damaged_summaries[rid, t] + self._sources(rid))
                if t not in self.run_tables[rid]:
                    raise StoreError(f"run {rid!r} was stored without {t} ({TABLES[t][0]}): "
                                     "ingest it again with --replace" + self._sources(rid))

    def _runs_with_events(self) -> set[str]:
        """The runs whose ranks recorded events (ranks.events > 0); every run when the ranks view
        cannot be read (then each is checked)."""
        try:
            return {r for (r,) in self.duckdb.execute("SELECT run_id FROM ranks GROUP BY run_id "
                                                      "HAVING coalesce(sum(events), 0) > 0").fetchall()}
        except Exception:  # no ranks view: check every run
            return set(self.run_tables)

    def _sources(self, run_id: str) -> str:
        """`` (its traces: PATH, --run-id RUN)`` for a refusal's advice: the folder holding the run's
        rank files (ranks.source_path; the one file of a one-rank run); empty when none is recorded."""
        import os

        try:
            paths = [p for (p,) in self.duckdb.execute("SELECT DISTINCT source_path FROM ranks WHERE run_id = ? "
                                                     "AND source_path IS NOT NULL", [run_id]).fetchall()]
        except Exception:  # no ranks view (a store without ranks files): the advice without the path
            return ""
        if not paths:
            return ""
        where = paths[0] if len(paths) == 1 else os.path.commonpath(paths)
        return f" (its traces: {where}, --run-id {run_id})"

    def raise_budget(self) -> bool:
        """Raise the budget ×4 (up to ANALYSIS_MEMORY_MAX); False when it is already there."""
        if self.memory_limit >= ANALYSIS_MEMORY_MAX:
            return False
        self.memory_limit = min(self.memory_limit * 4, ANALYSIS_MEMORY_MAX)
        self.duckdb.execute(f"SET memory_limit = '{self.memory_limit}B'")
        return True

    def execute(self, query, *args, **kwargs):
        import duckdb

        if self.analyses is not None:
            self.analyses.prepare(query)
        while True:
            try:
                return self.duckdb.execute(query, *args, **kwargs)
            except duckdb.OutOfMemoryException:
                if not self.raise_budget():
                    raise

    def sql(self, query, *args, **kwargs):
        """A DuckDB relation of ``query`` (lazy: no budget retry), the analyses it names built."""
        if self.analyses is not None:
            self.analyses.prepare(query)
        return self.duckdb.sql(query, *args, **kwargs)

    def close(self) -> None:
        """Close the connection and release its runs (a replace may then remove their old files)."""
        try:
            self.duckdb.close()
        finally:
            _unpin(self._pins)

    def __del__(self):
        try:
            _unpin(self.__dict__.get("_pins", []))
        except Exception:  # interpreter shutdown: the fds go with the process
            pass

    def __getattr__(self, name):
        if name == "duckdb":  # not set yet (__init__ failed): no recursion
            raise AttributeError(name)
        return getattr(self.duckdb, name)


def _unpin(fds: list[int]) -> None:
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


def _lock_exclusive(version: Path) -> int | None:
    """An exclusive lock on a run version's run.parquet, without waiting: the fd, or None when a
    reader holds it (or the file is gone). Release with os.close."""
    import fcntl

    try:
        fd = os.open(version / "run.parquet", os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # a reader holds it
        os.close(fd)
        return None
    except OSError:  # a file system without flock: nobody can hold it
        pass
    return fd


_NS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}



@contextlib.contextmanager
def atomic_output(out: Path):
    """A temporary path beside ``out`` for the caller to write; renamed over ``out`` when the block
    ends without error, removed otherwise (so ``out`` is never half-written), with the default
    permissions (0666 & ~umask, not mkstemp's 0600). Raises FileError (one line naming ``out``) when
    ``out`` is a directory or its folder cannot be written; otherwise what the writing raises."""
    out = Path(out)
    if out.is_dir():
        raise FileError(out, "is a directory, not a file to write")
    try:
        fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    except OSError as exc:
        raise FileError(out, f"cannot write there: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        try:
            os.replace(tmp, out)
        except OSError as exc:
            raise FileError(out, f"cannot write there: {exc.strerror or exc}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

def default_store_path() -> Path:
    """The store directory: ``$TRACEKIT_STORE`` if set, else ``./tracekit-store``."""
    return Path(os.environ.get("TRACEKIT_STORE") or "tracekit-store")


_GLOB_CHARS = frozenset("*?[")


def glob_escape(path: str | os.PathLike) -> str:
    """``path`` as a DuckDB file pattern that matches that one file and nothing else.

    DuckDB treats every string handed to ``read_parquet``/``read_json``/``glob`` as a pattern when
    it holds ``*``, ``?`` or ``[`` (so ``exp[1]/run.parquet`` would read ``exp1/run.parquet``);
    each such character becomes a one-character class (``[*]``, ``[?]``, ``[[]``), which its
    matcher reads as that character literally. ``]``, ``{``, quotes, spaces and non-ASCII are not
    special to it and stay as they are (tests/store/test_paths.py).
    """
    return "".join(f"[{c}]" if c in _GLOB_CHARS else c for c in str(path))


def sql_string(s: str | os.PathLike) -> str:
    """``s`` as an SQL string literal (single quotes doubled)."""
    return "'" + str(s).replace("'", "''") + "'"


def _read_by_name(files: list[str]) -> str:
    """The SQL reading these Parquet files of a table, columns matched by name: one
    ``read_parquet(..., union_by_name = true)`` over them all, except that the files of one folder
    (one run's ``events/rank=R.parquet``: written by one ingest, one schema) are read by one
    ``read_parquet`` without ``union_by_name`` and the folders joined by ``UNION ALL BY NAME``.
    ``union_by_name`` reads every file's footer each time a statement binds the view (benchmarks/README.md)."""
    folders: dict[str, list[str]] = {}
    for f in files:
        folders.setdefault(os.path.dirname(f), []).append(f)
    if len(folders) == len(files):  # one file a folder: nothing to save
        return f"SELECT * FROM read_parquet({sql_file_list(files)}, union_by_name = true)"
    return " UNION ALL BY NAME ".join(f"SELECT * FROM read_parquet({sql_file_list(fs)})" for fs in folders.values())


def sql_file_list(paths: Iterable[str | os.PathLike]) -> str:
    """A DuckDB list literal naming exactly these files, never a pattern: ``['<escaped>', ...]``."""
    return "[" + ", ".join(sql_string(glob_escape(p)) for p in paths) + "]"


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe directory name, else raise StoreError."""
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise StoreError(
            f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-' (at most 128 characters)"
        )
    return run_id


def combined_digest(digests: Iterable[str]) -> str:
    """One sha256 standing for several source files (a run whose single rank row covers many files)."""
    import hashlib

    ds = sorted(digests)
    if len(ds) == 1:
        return ds[0]
    return hashlib.sha256("\n".join(ds).encode()).hexdigest()


def _major(version: str) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 10**6  # unparsable: treat as newer


class Store:
    """A tracekit store directory.

    ``Store(path)`` does not create anything; writers call :meth:`staging`.
    Raises StoreError when the path exists but is not a directory.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_store_path()
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path}: store path exists and is not a directory")

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    @property
    def versions_dir(self) -> Path:
        """Where the run versions live (``runs/<id>`` links to ``../versions/<id>@<n>``)."""
        return self.path / "versions"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / check_run_id(run_id)

    def run_ids(self) -> list[str]:
        """Run ids present in the store, sorted by name."""
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir()
                      if RUN_ID_RE.fullmatch(p.name) and p.is_dir() and (p / "run.parquet").exists())

    def has_run(self, run_id: str) -> bool:
        return (self.run_dir(run_id) / "run.parquet").exists()

    def missing_run(self, run_id: str, shown: int = 8) -> "StoreError":
        """The StoreError for a run id not in this store: it names up to ``shown`` of the runs
        present and how many more there are (``tracekit runs`` lists them all)."""
        ids = self.run_ids()
        known = ", ".join(ids[:shown]) or "none"
        if len(ids) > shown:
            known += f", and {len(ids) - shown} more: tracekit runs --store {self.path} lists them"
        return StoreError(f"run {run_id!r} is not in {self.path} (runs: {known})")

    # -- writing -----------------------------------------------------------------

    def staging(self) -> "Staging":
        """A private directory to assemble one run in; see :class:`Staging`."""
        return Staging(self)

    # -- reading -----------------------------------------------------------------

    def connect(self, *, run_ids: list[str] | None = None, read_only_check: bool = True,
                tables: Iterable[str] | None = None):
        """A DuckDB connection (:class:`AnalysisConnection`) with the store's tables as views.

        Views ``runs``, ``ranks``, ``events``, ``collectives``, ``overlap_summary``, ``span_overlap``,
        ``gpu_breakdown_summary``, ``gpu_launcher_summary``, ``gpu_op_durations``,
        ``collective_steps``, ``rank_critical_path``, ``rank_critical_path_summary``,
        ``critical_path_nodes``, ``rank_steps`` (the last ten: the stored per-rank summaries, SUMMARY_TABLES; a file of theirs that is damaged is not read, and ``con.damaged_summaries`` says
        why: :meth:`AnalysisConnection.require_stored`) read the Parquet
        files of every run, or only of ``run_ids`` (faster for one run's report);
        when there is no run they are empty with the right columns. The files are a literal
        list (:func:`sql_file_list`; also in ``con.bound_files``) of the version each run had
        when connecting, pinned (:meth:`pin`) until ``con.close()``: a replace meanwhile leaves
        it in place; ``con.run_tables``: run id → the tables it has files of. The analyses are not
        here: ``tracekit.analyses.connect(store, ...)`` adds them.
        A run whose run, ranks or collectives file is damaged (not readable Parquet, foreign
        columns) raises StoreError when it is named in ``run_ids``; with every run (``run_ids``
        None) it is left out, the others read, and ``con.damaged_runs`` says why (run id → message).
        Raises StoreError if a run was written by a newer major schema version. ``tables``: only
        these views (names of :data:`TABLES`; ``runs`` always), the runs checked as above.
        """
        import duckdb

        con = duckdb.connect(database=":memory:")
        con.execute("SET preserve_insertion_order = false")
        # Each view that reads a Parquet file binds its footer anew (the analyses bind the events
        # file some twenty times); cached, it is parsed once: on a 3 GB trace's store (408 row
        # groups) the analyses' views took +52 MiB uncached, +8 MiB cached.
        con.execute("SET parquet_metadata_cache = true")
        # Bounded memory for analyses of big runs: DuckDB spills to a temporary folder beyond this.
        con.execute("SET temp_directory = ?", [str(Path(tempfile.gettempdir()) / "tracekit-duckdb")])
        con = AnalysisConnection(con, ANALYSIS_MEMORY_LIMIT)
        ids = self.run_ids() if run_ids is None else [check_run_id(r) for r in run_ids]
        dirs = {}
        for rid in ids:
            pinned = self.pin(rid)
            if pinned is not None:
                dirs[rid], fd = pinned
                con._pins.append(fd)
        damaged: set[str] = set()
        for rid in ids:
            d = dirs.get(rid) or self.run_dir(rid).resolve()
            con.run_tables[rid] = {t for t, (pattern, _s) in TABLES.items() if next(d.glob(pattern), None)}
            for t in sorted(con.run_tables[rid] & set(SUMMARY_TABLES)):
                f = d / TABLES[t][0]
                if (why := _parquet_problem(f, TABLES[t][1])) is not None:  # not read; the analyses refuse the run
                    damaged.add(str(f))
                    con.run_tables[rid].discard(t)
                    con.damaged_summaries[rid, t] = f"{f}: {why}; the run {rid!r} cannot be analyzed: ingest it again with --replace"
            for t in ("run.parquet", "ranks.parquet", "collectives.parquet"):
                schema = next(s for pattern, s in TABLES.values() if pattern == t)
                if (d / t).exists() and (why := _parquet_problem(d / t, schema)) is not None:
                    msg = f"{d / t}: {why}; the run {rid!r} is damaged: ingest it again with --replace"
                    if run_ids is not None:  # asked for by name: that run cannot be read
                        raise StoreError(msg)
                    con.damaged_runs[rid] = msg  # every run: the others are read without it
                    break
        ids = [rid for rid in ids if rid not in con.damaged_runs]
        for table, files in self.table_files(ids, dirs).items():
            if tables is not None and table != "runs" and table not in tables:
                continue
            files = [f for f in files if f not in damaged]
            schema = TABLES[table][1]
            con.bound_files.extend(files)
            con.register(f"__empty_{table}", schema.empty_table())
            if files:
                # a literal file list (glob characters escaped): a store path is never a pattern.
                # By name after the empty table of this version's schema: a run written before a
                # column was added reads it as NULL (same major schema version, same meaning)
                con.execute(
                    f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM __empty_{table} UNION ALL BY NAME "
                    + _read_by_name(files)
                )
            else:
                con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM __empty_{table}")
        if read_only_check and ids:
            newest = con.execute("SELECT schema_version FROM runs").fetchall()
            mine = _major(SCHEMA_VERSION)
            for (ver,) in newest:
                if _major(ver) > mine:
                    raise StoreError(
                        f"{self.path}: written by a newer tracekit (schema {ver}, this one reads {SCHEMA_VERSION}); upgrade tracekit"
                    )
        return con

    def pin(self, run_id: str) -> tuple[Path, int] | None:
        """The directory of the run's current version and a shared lock on it (an fd; close it to
        release), or None when the run is missing. While the lock is held a replace leaves that
        version's files in place (the next writer removes them once no reader holds them), so a
        connection reads one version to the end, never a mix of two and never a file gone."""
        import fcntl

        for _ in range(1000):
            d = self.run_dir(run_id).resolve()
            try:
                fd = os.open(d / "run.parquet", os.O_RDONLY)
            except FileNotFoundError:
                if not self.has_run(run_id):
                    return None
                continue  # replaced between the two steps: look again
            except OSError as exc:
                raise StoreError(f"{d}: cannot read the run ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            except OSError:  # a file system without flock: read unpinned (a replace may remove it)
                pass
            if (d / "run.parquet").exists():
                return d, fd
            os.close(fd)  # removed while we waited for the lock: the link points elsewhere now
        raise StoreError(f"{self.path}: run {run_id!r} keeps changing under the reader")

    def table_files(self, run_ids: Iterable[str], dirs: dict[str, Path] | None = None) -> dict[str, list[str]]:
        """table name → the Parquet files of these runs that its view reads (plain paths, sorted
        within a run; listed by Python, so the store path is never taken as a pattern). ``dirs``:
        run id → the version directory to list (from :meth:`pin`), else the link resolved now."""
        out: dict[str, list[str]] = {}
        for table, (pattern, _schema) in TABLES.items():
            files = out.setdefault(table, [])
            for rid in run_ids:
                d = (dirs or {}).get(rid) or self.run_dir(rid).resolve()
                files.extend(sorted(str(p) for p in d.glob(pattern)))
        return out

    def resolve_run(self, run_id: str | None = None) -> str:
        """``run_id``, or the newest run when None. Raises StoreError when the store is empty or the
        run is not in it (naming the runs it has)."""
        if run_id is None:
            return self.latest_run_id()
        if not self.has_run(run_id):
            raise self.missing_run(run_id)
        return run_id

    def latest_run_id(self, workload: str | None = None, required: bool = True) -> str | None:
        """The most recently created run (of ``workload`` if given; nccl-tests runs excluded then).

        StoreError when there is none and ``required``, else None.
        """
        import pyarrow.parquet as pq

        best = None
        for rid in self.run_ids():
            # ParquetFile, not read_table (which imports pyarrow.dataset and pandas at startup);
            # created_at compared as integer ns since the epoch, not as a Python datetime (converting
            # a tz-aware timestamp imports pandas too; a cast imports pyarrow.compute)
            try:
                t = pq.ParquetFile(self.run_dir(rid) / "run.parquet").read(columns=["created_at", "workload", "source"])
                t.column("created_at")[0]
            except (OSError, pa.ArrowException, IndexError, KeyError):  # a damaged run: not the newest of anything
                continue
            if workload is not None and (t.column("workload")[0].as_py() != workload
                                         or t.column("source")[0].as_py() == "nccl_tests"):
                continue
            ts = t.column("created_at")[0]
            created = None if ts.value is None else ts.value * _NS_PER_UNIT[ts.type.unit]
            if best is None or created > best[0]:
                best = (created, rid)
        if best is None:
            if not required:
                return None
            what = f"no {workload} runs" if workload else "no runs"
            raise StoreError(f"{self.path}: {what} in the store (run `tracekit ingest` or `tracekit collect` first)")
        return best[1]

    def find_by_sha256(self, digests: Iterable[str]) -> str | None:
        """The run whose ranks came from exactly these source files (by sha256), if any."""
        want = sorted(digests)
        import pyarrow.parquet as pq

        for rid in self.run_ids():
            f = self.run_dir(rid) / "ranks.parquet"
            if not f.exists():
                continue
            try:
                have = sorted(x for x in pq.ParquetFile(f).read(columns=["source_sha256"]).column(0).to_pylist() if x)
            except (OSError, pa.ArrowException, KeyError):  # a damaged run matches nothing
                continue
            if have and (have == want or have == [combined_digest(want)]):
                return rid
        return None


OWNER_FILE = ".owner-pid"
_LINK_TARGET = "../versions/"
_VERSION_RE = re.compile(r"^(?P<id>[A-Za-z0-9][A-Za-z0-9._-]{0,127})@(?P<n>[0-9]{1,18})$")
_LINK_RE = re.compile(r"^\.(?P<id>[A-Za-z0-9][A-Za-z0-9._-]{0,127})@(?P<n>[0-9]{1,18})\.link$")
_ASIDE_RE = re.compile(r"^\.(?P<id>[A-Za-z0-9][A-Za-z0-9._-]{0,127})\.old-[0-9a-f]{32}$")


def _exchange(a: str | os.PathLike, b: str | os.PathLike) -> None:
    """Swap two paths in one step: Linux ``renameat2(RENAME_EXCHANGE)`` (kernel 3.15, glibc 2.28).

    Raises NotImplementedError where the call or the file system lacks it (the caller falls back),
    OSError for any other failure.
    """
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        raise NotImplementedError("renameat2 is not available") from None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        if e in (errno.ENOSYS, errno.EINVAL):
            raise NotImplementedError(os.strerror(e))
        raise OSError(e, os.strerror(e), str(a))


class _FS:
    """Every file-system step a store writer takes, one method each, so that a test can stop a writer
    between any two of them (tests/store/test_store_atomic.py kills it before step k for every k)."""

    @staticmethod
    def mkdir(path: Path, **kw) -> None:
        Path(path).mkdir(**kw)

    @staticmethod
    def write_text(path: Path, text: str) -> None:
        Path(path).write_text(text)

    rename = staticmethod(os.rename)
    symlink = staticmethod(os.symlink)
    unlink = staticmethod(os.unlink)
    exchange = staticmethod(_exchange)

    @staticmethod
    def rmtree(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


fs = _FS()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(d: Path) -> int | None:
    """The pid in a directory's owner file, else the one its name starts with (a staging directory
    is named ``<pid>-<hex>``, so it has an owner from its first moment), else None."""
    try:
        return int((d / OWNER_FILE).read_text().strip())
    except (OSError, ValueError):
        pass
    head = d.name.split("-", 1)[0]
    return int(head) if "-" in d.name and head.isdigit() else None


def _abandoned(d: Path) -> bool:
    """A directory whose writer is gone: it names a pid that is not alive (never this process's)."""
    pid = _owner(d)
    return pid is not None and pid != os.getpid() and not _pid_alive(pid)


def _remove_abandoned(root: Path) -> None:
    """Delete staging directories left by writers that died (killed mid-ingest): their owner pid
    is gone. Directories of live writers (concurrent ingests) are left alone. A ``<hex>.old``
    directory is a run that tracekit < 0.x moved aside during ``--replace`` and never put back:
    it is restored when its run is missing, else removed."""
    for d in root.iterdir():
        if not d.is_dir():
            continue
        if d.name.endswith(".old"):
            _restore_legacy_aside(root.parent, d)
        elif _abandoned(d):
            fs.rmtree(d)


def _restore_legacy_aside(store_path: Path, d: Path) -> None:
    import pyarrow.parquet as pq

    try:
        rid = pq.ParquetFile(d / "run.parquet").read(columns=["run_id"]).column(0)[0].as_py()
        check_run_id(rid)
    except Exception:  # not a run: nothing to restore
        fs.rmtree(d)
        return
    store = Store(store_path)
    if store.has_run(rid):
        fs.rmtree(d)
        return
    fs.mkdir(store.runs_dir, parents=True, exist_ok=True)
    fs.mkdir(store.versions_dir, parents=True, exist_ok=True)
    name = _place_version(d, store.versions_dir, rid)
    try:
        fs.symlink(_LINK_TARGET + name, store.runs_dir / rid)
    except FileExistsError:  # someone wrote the run meanwhile: theirs stands
        fs.rmtree(store.versions_dir / name)


def _remove_unread(d: Path) -> None:
    """Remove a replaced run directory unless a reader holds it (:meth:`Store.pin`); then it stays
    for the next writer's :func:`recover`. (A directory without run.parquet is removed.)"""
    if (d / "run.parquet").exists():
        fd = _lock_exclusive(d)
        if fd is None:
            if (d / "run.parquet").exists():
                return  # being read
        try:
            fs.rmtree(d)
        finally:
            if fd is not None:
                os.close(fd)
    else:
        fs.rmtree(d)


def _next_version(runs: Path, run_id: str) -> int:
    n = 0
    for p in runs.iterdir():
        m = _VERSION_RE.fullmatch(p.name)
        if m and m["id"] == run_id:
            n = max(n, int(m["n"]) + 1)
    return n


def _place_version(src: Path, versions: Path, run_id: str) -> str:
    """Rename ``src`` to ``versions/<run_id>@<n>`` (n one past the highest there); returns that name."""
    import errno

    while True:
        name = f"{run_id}@{_next_version(versions, run_id)}"
        try:
            fs.rename(src, versions / name)
            return name
        except OSError as exc:  # a concurrent writer took that number
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise


def recover(store: "Store") -> None:
    """Finish or undo what writers that died left in ``versions/`` (every step of
    :meth:`Staging.commit` leaves the store readable; this removes what is left over and puts back
    a run moved aside):

    - ``.<id>@<n>.link``: a pointer not yet renamed into place (removed), or, after an exchange, the
      run directory it replaced (removed);
    - ``.<id>.old-<hex>``: a run moved aside by the fallback replace: put back when ``<id>`` is
      missing, else removed;
    - ``<id>@<n>`` not pointed to by ``<id>``: a version never made current, or one replaced
      (removed unless its owner file names a live writer); the owner file left in the current one
      is removed.

    Errors are ignored (the next writer tries again).
    """
    runs, versions = store.runs_dir, store.versions_dir
    try:
        entries = list(versions.iterdir())
    except OSError:
        return
    for p in entries:
        name = p.name
        try:
            if _LINK_RE.fullmatch(name):
                if p.is_symlink():
                    fs.unlink(p)
                else:
                    _remove_unread(p)
            elif m := _ASIDE_RE.fullmatch(name):
                dest = runs / m["id"]
                if os.path.lexists(dest):
                    fs.rmtree(p)
                else:
                    fs.rename(p, dest)
        except OSError:
            pass
    for p in entries:
        m = _VERSION_RE.fullmatch(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        try:
            current = os.readlink(runs / m["id"])
        except OSError:
            current = None
        try:
            if current == _LINK_TARGET + p.name:
                if _abandoned(p):
                    fs.unlink(p / OWNER_FILE)
            elif _owner(p) is None or _abandoned(p):
                _remove_unread(p)
        except OSError:
            pass


class Staging:
    """A staging directory for one run, made the current version of the run on :meth:`commit`.

    Use as a context manager: leaving the block without ``commit`` (an error, an
    interrupt) deletes the staging directory and leaves the store unchanged. Entering also
    cleans up after writers that died (:func:`recover`).
    """

    def __init__(self, store: Store):
        self.store = store
        self.dir: Path | None = None

    def __enter__(self) -> "Staging":
        self._created_store = not self.store.path.exists()
        root = self.store.path / ".staging"
        try:
            fs.mkdir(root, parents=True, exist_ok=True)
            _remove_abandoned(root)
            recover(self.store)
            d = root / f"{os.getpid()}-{uuid.uuid4().hex}"
            fs.mkdir(d)
            self.dir = d
            fs.write_text(d / OWNER_FILE, f"{os.getpid()}\n")
        except OSError as exc:
            raise StoreError(f"{self.store.path}: cannot write to the store ({exc.strerror or exc})") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.dir is not None and self.dir.exists():
            fs.rmtree(self.dir)
        root = self.store.path / ".staging"
        try:
            root.rmdir()  # only when empty
        except OSError:
            pass
        if self._created_store and self.store.path.exists() and not any(self.store.path.iterdir()):
            try:
                self.store.path.rmdir()  # we created it for nothing
            except OSError:
                pass

    def commit(self, run_id: str, *, replace: bool = False) -> Path:
        """Make the staged run the store's run ``run_id`` in one atomic step; returns its path.

        ``runs/<run_id>`` is a symbolic link to a version directory ``versions/<run_id>@<n>``. The
        staged directory is first renamed to a new version (invisible to readers), then the
        link is created (a new run) or a new link renamed over the old one (``replace``: rename(2)
        replaces it atomically, so readers see the old run or the new one, never none), then the old
        version is removed. A run stored as a plain directory (stores written before) is swapped
        with the link by ``renameat2(RENAME_EXCHANGE)``, or where that is missing moved aside
        and the link renamed in (a writer that dies between the two leaves ``.<id>.old-<hex>``,
        which the next writer puts back: :func:`recover`).

        Raises StoreError if the id exists and ``replace`` is false, or on an OS error.
        """
        assert self.dir is not None
        dest = self.store.run_dir(run_id)
        versions = self.store.versions_dir
        try:
            fs.mkdir(dest.parent, parents=True, exist_ok=True)
            fs.mkdir(versions, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.store.path}: cannot write to the store ({exc.strerror or exc})") from None
        exists_msg = f"run {run_id!r} already exists in {self.store.path} (use --replace or another --run-id)"
        if os.path.lexists(dest) and not replace:
            raise StoreError(exists_msg)
        try:
            name = _place_version(self.dir, versions, run_id)
            self.dir = versions / name  # ours until the link points to it: removed by __exit__ on failure
            old = self._point(dest, versions, name, replace)
            if old is None:
                raise StoreError(exists_msg)
            self.dir = None
            fs.unlink(versions / name / OWNER_FILE)
            if old:
                _remove_unread(Path(old))
        except OSError as exc:
            raise StoreError(f"{self.store.path}: cannot write the run into the store ({exc.strerror or exc})") from None
        return dest

    @staticmethod
    def _point(dest: Path, versions: Path, name: str, replace: bool) -> Path | str | None:
        """Point ``dest`` at the version ``name``. Returns what to remove afterwards ('' for nothing),
        or None when ``dest`` exists and ``replace`` is false."""
        target = _LINK_TARGET + name  # relative: the same from runs/ and from versions/
        try:
            fs.symlink(target, dest)  # a new run: created atomically, or FileExistsError
            return ""
        except FileExistsError:
            if not replace:
                return None
        link = versions / f".{name}.link"
        fs.symlink(target, link)
        if dest.is_symlink():
            old = os.readlink(dest)
            fs.rename(link, dest)  # atomic: readers see the old target or the new one
            old_name = old[len(_LINK_TARGET):] if old.startswith(_LINK_TARGET) else ""
            return versions / old_name if _VERSION_RE.fullmatch(old_name) else ""
        try:
            fs.exchange(link, dest)  # a plain run directory (older stores) swapped with the link
            return link  # now the old directory
        except NotImplementedError:
            aside = versions / f".{dest.name}.old-{uuid.uuid4().hex}"
            fs.rename(dest, aside)
            fs.rename(link, dest)
            return aside
