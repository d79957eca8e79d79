"""Second pass of an ingest: link, classify and step-assign events; write the run's tables.

Per rank, :func:`tracekit.ingest.linkpass.link_rank` turns the staging rows the
reader wrote into the final events file, and :func:`tracekit.ingest.attribute.build_collectives`
gives its collectives rows:

* ``launch_event_id``: a GPU event's runtime launch call on the CPU (the
  ``cudaLaunchKernel``/``hipLaunchKernel``... event with the same correlation id);
* ``class`` (DESIGN.md, "Classifying events"): ``comm`` for communication
  kernels (metadata or name) and, on CPU-only traces, the ``gloo:*`` spans (or,
  without any, the collective CPU calls: linkpass ``_CpuCalls``);
  ``compute`` for other kernels and, on CPU-only traces, the ``cpu_op`` events
  of threads that do no communication; ``memory`` for memcpy/memset; ``sync``
  for ``cuda_sync`` and Stream/Event/Device synchronize calls; ``cpu`` for other
  CPU events; ``other`` for the rest of the GPU tracks;
* ``step``: the ``ProfilerStep#N`` window holding the event (GPU work: the
  window holding its launch).
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq

from tracekit.store import SCHEMA_VERSION
from tracekit.errors import FileError
from tracekit.ingest import pg_attribution
from tracekit.ingest.attribute import build_collectives
from tracekit.ingest.linkpass import CLASSES, CLIP_TOLERANCE_NS, link_rank, supports_pdl
from tracekit.ingest.seq import number_seq
from tracekit.ingest.staging import _BatchWriter
from tracekit.timeline.intervals import rank_overlap_summary
from tracekit.store import (COLLECTIVE_STEPS_SCHEMA, COLLECTIVES_SCHEMA, CRITICAL_PATH_NODES_SCHEMA,
                            CRITICAL_PATH_TABLES, GPU_BREAKDOWN_SUMMARY_SCHEMA, GPU_LAUNCHER_SUMMARY_SCHEMA,
                            GPU_NOT_SUMMARISED, GPU_OP_DURATIONS_SCHEMA, OVERLAP_SUMMARY_SCHEMA, PARQUET_OPTS,
                            RANK_CRITICAL_PATH_SCHEMA, RANK_CRITICAL_PATH_SUMMARY_SCHEMA, RANK_STEPS_SCHEMA, RANKS_SCHEMA,
                            RUNS_SCHEMA, SPAN_OVERLAP_SCHEMA, glob_escape)


def _sql_str(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


@dataclass
class RankTask:
    """One rank's second ingest phase (:func:`assemble_rank`); picklable, sent to a worker.

    ``rf``: the reader's :class:`~tracekit.ingest.staging.RankFile`; ``raw``: its staging file;
    ``out``: the events file to write; ``world_size``, ``pg_config``: from every rank's metadata;
    ``user_kernels``: the ``--comm-pattern`` kernels (made active in the worker)."""

    rf: object
    rank: int
    raw: str
    out: str
    run_id: str
    world_size: int
    pg_config: dict
    user_kernels: tuple = ()
    declared_world: int | None = None  # the largest distributedInfo.world_size, None when no file gives one
    world_known: bool = True  # False: no trace declares world_size and one file was given (k unknown, not 1)
    parts: str | None = None
    """The directory receiving the rank's staged tables (:func:`part_path`): its collectives and
    summaries, written by :func:`assemble_rank` and read back by :func:`finish_run`."""
    alone: bool = True
    """The run has this one rank: its critical paths are final at ingest (no collective edge to
    another rank) unless its own calls may meet in one instance (:func:`_may_meet_itself`), else
    its nodes are stored for the analysis (tracekit.ingest.critical_path)."""


@dataclass
class RankResult:
    """What :func:`assemble_rank` sends back to the driver: small, not growing with the rank's
    collectives or events (its tables are staged files, :func:`part_path`).

    ``extent``: (first start, last end) ns of its events, (None, None) when it has none; ``host``: its
    host name or None; ``row``: its ranks.parquet row (offsets 0); ``facts``: per collectives row,
    what :func:`tracekit.ingest.pg_attribution.attribute` needs (or None), empty when every row's is
    None (a rank with no gloo call that lacks a process group: all but CPU-only gloo traces);
    ``pg_sizes``: the distinct (pg_name, group_size) pairs of its collectives; ``algo_proto``: the
    distinct (algo, proto) pairs; ``gpu_ok``: whether its GPU summaries were made (False: the run
    stores both GPU summary files empty)."""

    rank: int
    extent: tuple
    host: str | None
    row: dict
    facts: list
    pg_sizes: set
    algo_proto: set
    gpu_ok: bool = True


PART_TABLES = (("collectives", COLLECTIVES_SCHEMA, ("ts_ns", "issue_ts_ns")),
               ("overlap_summary", OVERLAP_SUMMARY_SCHEMA, ("first_ns", "last_ns")),
               ("span_overlap", SPAN_OVERLAP_SCHEMA, ("ts_ns",)),
               ("gpu_breakdown_summary", GPU_BREAKDOWN_SUMMARY_SCHEMA, ("window_start_ns", "window_end_ns")),
               ("gpu_launcher_summary", GPU_LAUNCHER_SUMMARY_SCHEMA, ()),
               ("gpu_op_durations", GPU_OP_DURATIONS_SCHEMA, ()),
               ("collective_steps", COLLECTIVE_STEPS_SCHEMA, ()),
               ("rank_critical_path", RANK_CRITICAL_PATH_SCHEMA, ("start_ns", "end_ns")),
               ("rank_critical_path_summary", RANK_CRITICAL_PATH_SUMMARY_SCHEMA, ("start_ns", "end_ns")),
               ("critical_path_nodes", CRITICAL_PATH_NODES_SCHEMA, ("ts_ns", "end_ns")),
               ("rank_steps", RANK_STEPS_SCHEMA, ("first_ns", "last_ns")))
"""The run tables staged per rank: (name, schema, the timestamp columns a clock offset shifts). A run
whose GPU work could not be swept stores the GPU_SWEPT_TABLES empty."""

GPU_SWEPT_TABLES = ("gpu_breakdown_summary", "gpu_launcher_summary")
"""The tables of the GPU sweep (tracekit.timeline.gpu): all ranks' rows or, when one rank's GPU work
could not be swept (GPU_NOT_SUMMARISED), none (sums over ranks would be partial)."""


def unstaged(alone: bool) -> frozenset:
    """The critical-path tables that a run of several ranks never fills (its final paths:
    tracekit.ingest.critical_path.rank_tables): not staged per rank; the run stores them empty. A
    run of one rank (``alone``) stages all three: its final paths, or its nodes where its own calls
    may meet in one collective instance (:func:`_may_meet_itself`)."""
    return frozenset() if alone else frozenset({"rank_critical_path", "rank_critical_path_summary"})


def _may_meet_itself(table: pa.Table, facts: list) -> bool:
    """Whether two of a rank's calls (its collectives ``table``) may be one collective instance:
    two with one (pg_name, seq), or calls whose process group is attributed later (``facts`` of
    unnamed gloo calls, :func:`finish_run`). Such a rank's critical path can have a collective edge
    to its own later call, so even alone in its run it is walked at analyze time from its nodes,
    with the instances' last arrivals (tracekit.analyses.critical_path)."""
    if any(f and f["unnamed"] for f in facts):
        return True
    keyed = table.select(["pg_name", "seq"]).filter(pc.is_valid(table.column("seq")))
    return keyed.group_by(["pg_name", "seq"]).aggregate([]).num_rows < keyed.num_rows


def part_path(parts, name: str, rank: int) -> Path:
    """Where a rank's staged table ``name`` (one of PART_TABLES) lies under ``parts``:
    ``parts/<name>/rank=<rank>.arrow`` (an Arrow IPC file of the table's schema, LZ4-compressed;
    timestamps not yet shifted)."""
    return Path(parts) / name / f"rank={rank}.arrow"


PART_COMPRESSION = "lz4"
"""Compression of the staged per-rank tables (Arrow IPC files, feather v2: written once, read back by
the driver column by column; a small rank's table reads faster than from Parquet, whose footer and
page decoding dominate at that size: benchmarks/README.md)."""


def _write_part(parts, name: str, schema: pa.Schema, rank: int, table: pa.Table) -> None:
    feather.write_feather(table.cast(schema), part_path(parts, name, rank), compression=PART_COMPRESSION)


def _write_parts(parts, name: str, schema: pa.Schema, rank: int, tables) -> None:
    """A rank's staged table ``name`` written from an iterator of tables of its schema, one after
    the other (the file :func:`_write_part` writes, for a table too long to hold at once)."""
    opts = pa.ipc.IpcWriteOptions(compression=PART_COMPRESSION)
    with pa.OSFile(str(part_path(parts, name, rank)), "wb") as sink, pa.ipc.new_file(sink, schema, options=opts) as w:
        for t in tables:
            w.write_table(t.cast(schema))


def _part_error(f: Path, name: str, rank: int, exc: Exception) -> FileError:
    """The one-line error for a staged table that is missing or cannot be read."""
    if isinstance(exc, FileNotFoundError):
        return FileError(f, f"rank {rank}'s staged {name} table is missing (removed while the ingest ran?)")
    return FileError(f, f"rank {rank}'s staged {name} table cannot be read ({' '.join(str(exc).split())[:200]})")


def check_part(parts, name: str, rank: int) -> Path:
    """The path of rank ``rank``'s staged table ``name`` after reading its footer: FileError naming
    it when it is missing, is no Arrow IPC file, or its columns are not the table's."""
    f = part_path(parts, name, rank)
    schema = dict((n, s) for n, s, _ in PART_TABLES)[name]
    try:
        with pa.OSFile(str(f)) as fh:
            got = pa.ipc.open_file(fh).schema
        if not got.equals(schema):
            raise ValueError(f"its columns are not {name}'s")
        return f
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise _part_error(f, name, rank, exc) from None


def read_part(parts, name: str, rank: int, columns=None) -> pa.Table:
    """Rank ``rank``'s staged table ``name`` (``columns``: only those, read column by column from
    the file); FileError naming the file when it is missing or cannot be read as that table."""
    f = part_path(parts, name, rank)
    schema = dict((n, s) for n, s, _ in PART_TABLES)[name]
    try:
        t = feather.read_table(f, columns=columns, use_threads=False, memory_map=False)
        want = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        if not t.schema.equals(want):
            raise ValueError(f"its columns are not {name}'s")
        return t
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise _part_error(f, name, rank, exc) from None


_COMM_CODE, _COMPUTE_CODE = CLASSES.index("comm"), CLASSES.index("compute")
_TAP_COLUMNS = ("event_id", "ts_ns", "dur_ns", "step")


def _picked(col, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, validity) of the int64 Arrow array ``col`` (the events schema's: the batch is built
    with it) at the rows of the bool mask ``sel``, as numpy copies (a null's value: whatever its
    slot holds, masked by the validity)."""
    data = np.frombuffer(col.buffers()[1], dtype=np.int64, count=len(col) + col.offset)[col.offset:]
    valid = np.ones(int(sel.sum()), dtype=bool) if not col.null_count else \
        col.is_valid().to_numpy(zero_copy_only=False)[sel]
    return data[sel], valid


class _SummaryTap:
    """The link pass's writer (``writer_cls`` of :func:`tracekit.ingest.linkpass.link_rank`) that also
    keeps, from each batch it writes, what :func:`tracekit.timeline.intervals.rank_overlap_summary` reads: the
    comm and compute rows' event_id, ts_ns, dur_ns, step (numpy, ~37 B per row) and the comm rows'
    names.
    So the summaries come from the rows as written (after clipping, classes and steps), with no
    second read of the events file."""

    def __init__(self):
        self.parts: list = []
        self.comm: list = []
        self.names: list = []
        self.gpu = _GpuTap()

    def open(self, *args, **kwargs):
        self._w = _BatchWriter(*args, **kwargs)
        return self

    def __enter__(self):
        self._w.__enter__()
        return self

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)

    def write(self, batch) -> None:
        code = batch.column("class").indices.to_numpy(zero_copy_only=False)
        comm = code == _COMM_CODE
        sel = comm | (code == _COMPUTE_CODE)
        if sel.any():
            # numpy copies of the selected rows (values, and validity where a column has nulls):
            # no Arrow buffers kept from the batch
            self.parts.append([_picked(batch.column(c), sel) for c in _TAP_COLUMNS])
            self.comm.append(comm[sel])
            self.names.append(batch.column("name").filter(pa.array(comm)).cast(pa.string()))
        self.gpu.write(batch)
        self._w.write(batch)

    def summaries(self, run_id: str, rank: int, recv_ids: np.ndarray, call_ids: np.ndarray,
                  events_file) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(OVERLAP_SUMMARY_SCHEMA, SPAN_OVERLAP_SCHEMA, COLLECTIVE_STEPS_SCHEMA) tables of the rows
        kept; ``call_ids``: the event_id of each of the rank's collectives rows (:func:`call_steps`)."""
        cols, raw = {}, {}
        for j, c in enumerate(_TAP_COLUMNS):
            v = np.concatenate([p[j][0] for p in self.parts]) if self.parts else np.zeros(0, np.int64)
            ok = np.concatenate([p[j][1] for p in self.parts]) if self.parts else np.ones(0, bool)
            raw[c] = (v, ok)
            cols[c] = pa.array(v, pa.int64(), mask=None if ok.all() else ~ok)
        ev = pa.table(cols)
        is_comm = np.concatenate(self.comm) if self.comm else np.zeros(0, dtype=bool)
        names = pa.chunked_array(self.names, pa.string())
        self.parts, self.comm, self.names = [], [], []
        steps = call_steps(run_id, rank, call_ids, raw["event_id"], raw["step"], is_comm, events_file)
        return (*rank_overlap_summary(run_id, rank, ev, is_comm, names, recv_ids), steps)


def call_steps(run_id: str, rank: int, call_ids: np.ndarray, eid: tuple, step: tuple, is_comm: np.ndarray,
               events_file) -> pa.Table:
    """The rank's COLLECTIVE_STEPS_SCHEMA table: per distinct event of ``call_ids`` (its collectives
    rows' event_id, an int64 array; NULLs left out by the caller) that lies in a profiler step, that
    step and whether the event's class is comm, ascending by event_id.

    ``eid``, ``step``: (values, validity) of the comm and compute rows the link pass wrote (the tap's),
    ``is_comm``: which of them are comm. A collective's span is a comm row (its class: the link
    pass's, from the same spans the collectives are built on), so its step is found there; an event
    that is not (none known) is looked up in ``events_file``, the rank's events file just written
    (event_id, class, step), so the table holds exactly what the events say."""
    ids = np.unique(np.asarray(call_ids, dtype=np.int64))
    ce, (cs, cs_ok) = eid[0][is_comm], (step[0][is_comm], step[1][is_comm])
    o = np.argsort(ce, kind="stable")
    ce, cs, cs_ok = ce[o], cs[o], cs_ok[o]
    i = np.minimum(np.searchsorted(ce, ids), max(len(ce) - 1, 0))
    hit = (ce[i] == ids) if len(ce) else np.zeros(len(ids), dtype=bool)
    out_id, out_step = ids[hit], cs[i[hit]]
    keep = cs_ok[i[hit]]
    out_id, out_step, out_comm = out_id[keep], out_step[keep], np.ones(int(keep.sum()), dtype=bool)
    if not hit.all():  # not comm rows: read from the events file (their class and step)
        import pyarrow.parquet as pq

        rest = pq.ParquetFile(events_file).read(columns=["event_id", "class", "step"])
        rest = rest.filter(pc.and_(pc.is_in(rest.column("event_id"), pa.array(ids[~hit])),
                                   pc.is_valid(rest.column("step"))))
        out_id = np.concatenate([out_id, rest.column("event_id").to_numpy()])
        out_step = np.concatenate([out_step, rest.column("step").to_numpy()])
        out_comm = np.concatenate([out_comm, pc.equal(rest.column("class").cast(pa.string()), "comm")
                                   .to_numpy(zero_copy_only=False)])
        o = np.argsort(out_id, kind="stable")
        out_id, out_step, out_comm = out_id[o], out_step[o], out_comm[o]
    n = len(out_id)
    return pa.table([pa.array([run_id] * n, pa.string()), pa.array(np.full(n, rank, np.int32)),
                     pa.array(out_id, pa.int64()), pa.array(out_step, pa.int64()), pa.array(out_comm, pa.bool_())],
                    schema=COLLECTIVE_STEPS_SCHEMA)


# linkpass CLASSES code → tracekit.timeline.gpu's class code (compute 0, comm 1, memory 2, sync 3, other 4)
_GPU_K = np.array([{"compute": 0, "comm": 1, "memory": 2, "sync": 3}.get(c, 4) for c in CLASSES], dtype=np.int8)
# category → 1 cpu_op, 2 user_annotation, 3 a launch call (runtime / driver), 4 gpu_user_annotation, else 0
_CATEGORY = {"cpu_op": 1, "user_annotation": 2, "runtime": 3, "driver": 3, "gpu_user_annotation": 4}


def _codes(col, fn, dtype=np.int8) -> np.ndarray:
    """Per row of a dictionary-encoded string column, ``fn(value)`` (``fn(None)`` for a null), through
    one lookup per dictionary entry."""
    table = np.array([fn(v) for v in col.dictionary.to_pylist()] + [fn(None)], dtype=dtype)
    idx = col.indices
    i = idx.to_numpy(zero_copy_only=False) if not idx.null_count else \
        pc.fill_null(idx, len(col.dictionary)).to_numpy(zero_copy_only=False)
    return table[i]


class _GpuTap:
    """What :func:`tracekit.timeline.gpu.summaries` reads, kept from each batch the link pass writes
    (numpy copies): the GPU ops (events on GPU tracks other than gpu_user_annotation ranges: start,
    duration, class, step, launch call; ~45 B each), the candidate launchers (cpu_thread cpu_op and
    user_annotation ranges of positive length other than ProfilerStep#N: thread, start, duration,
    kind, name; ~30 B each) and the launch calls (runtime / driver rows: event_id, thread, start,
    duration; ~35 B each), so the rank's GPU summaries come from the rows as written; and, for
    gpu_op_durations (:meth:`op_durations`), each GPU op's class, name and whether it lies in a
    profiler step (~6 B more each; its duration is the one kept for the sweep)."""

    def __init__(self):
        self.ops: list = []
        self.ranges: list = []
        self.range_names: list = []  # per batch, the ranges' codes into self.names (−1: a null name)
        self.names: dict = {}  # name → code, in order of first use
        self.calls: list = []
        self.kinds: list = []  # per batch, the GPU ops' class (CLASSES code), name code, dur_ns, in a step
        self.op_names: dict = {}  # the GPU ops' names → code (their own: the ranges' stay apart)

    def _name_codes(self, col, sel: np.ndarray, names: dict | None = None) -> np.ndarray:
        """Codes (int32, into ``names``, default ``self.names``) of the names of the rows ``sel`` of a
        dictionary-encoded column: only the dictionary entries used are looked up (a batch's
        dictionary holds every name of the batch, kernel names included: kept per batch they were
        most of the tap)."""
        names = self.names if names is None else names
        idx = col.indices.filter(pa.array(sel))
        ok = idx.is_valid().to_numpy(zero_copy_only=False) if idx.null_count else None
        i = pc.fill_null(idx, 0).to_numpy(zero_copy_only=False) if idx.null_count else idx.to_numpy(zero_copy_only=False)
        if not len(i):
            return np.zeros(0, np.int32)
        used = np.flatnonzero(np.bincount(i, minlength=len(col.dictionary)))  # no sort: O(rows + entries)
        lut = np.full(len(col.dictionary), -1, dtype=np.int32)
        lut[used] = [names.setdefault(w, len(names)) for w in col.dictionary.take(pa.array(used)).to_pylist()]
        out = lut[i]
        return out if ok is None else np.where(ok, out, -1).astype(np.int32)

    def write(self, batch) -> None:
        kind = _codes(batch.column("track_kind"), lambda v: {"gpu_stream": 1, "cpu_thread": 2}.get(v, 0))
        cat = _codes(batch.column("category"), lambda v: _CATEGORY.get(v, 0))
        ts = batch.column("ts_ns")
        gpu = (kind == 1) & (cat != 4)
        if gpu.any():
            code = batch.column("class").indices.to_numpy(zero_copy_only=False)[gpu]
            dur, step_ok = _picked(batch.column("dur_ns"), gpu)[0], _picked(batch.column("step"), gpu)
            self.ops.append([_picked(ts, gpu)[0], dur, _GPU_K[code], *step_ok,
                             *_picked(batch.column("launch_event_id"), gpu)])
            self.kinds.append([code.astype(np.int8), self._name_codes(batch.column("name"), gpu, self.op_names),
                               dur, step_ok[1]])
        rng = (kind == 2) & ((cat == 1) | (cat == 2))
        if rng.any():
            # positive length, a start, and an annotation's name not ProfilerStep#N (NULL LIKE ... is not true)
            names = batch.column("name")
            # per dictionary entry, vectorised (a batch's dictionary holds its kernel names too)
            plain = pc.invert(pc.starts_with(names.dictionary, "ProfilerStep#")).to_numpy(zero_copy_only=False)
            idx = names.indices
            ok = np.r_[plain, False][pc.fill_null(idx, len(plain)).to_numpy(zero_copy_only=False)] if idx.null_count \
                else plain[idx.to_numpy(zero_copy_only=False)]
            rng &= (cat == 1) | ok
            rng &= pc.fill_null(batch.column("dur_ns"), 0).to_numpy() > 0
            if ts.null_count:
                rng &= ts.is_valid().to_numpy(zero_copy_only=False)
            if rng.any():
                self.ranges.append([*_picked(batch.column("track"), rng), _picked(ts, rng)[0],
                                    _picked(batch.column("dur_ns"), rng)[0], (cat[rng] == 2).astype(np.int8)])
                self.range_names.append(self._name_codes(batch.column("name"), rng))
        call = cat == 3
        if call.any():
            self.calls.append([_picked(batch.column("event_id"), call)[0], *_picked(batch.column("track"), call),
                               *_picked(ts, call), _picked(batch.column("dur_ns"), call)[0]])

    def op_durations(self, run_id: str, rank: int) -> pa.Table:
        """The rank's GPU_OP_DURATIONS_SCHEMA table: its GPU ops counted per (class, name, dur_ns),
        with how many of them lie in a profiler step; ordered by class, name (first use) and
        duration. Empty without GPU ops. Lets go of what it read."""
        if not self.kinds:
            return GPU_OP_DURATIONS_SCHEMA.empty_table()
        cls, name, dur, in_step = _columns(self.kinds, 4)
        names = list(self.op_names)
        self.op_names = {}
        o = np.lexsort((dur, name, cls))
        cls, name, dur, in_step = cls[o], name[o], dur[o], in_step[o]
        first = np.ones(len(o), dtype=bool)
        first[1:] = (cls[1:] != cls[:-1]) | (name[1:] != name[:-1]) | (dur[1:] != dur[:-1])
        starts = np.flatnonzero(first)
        ops = np.diff(starts, append=len(o))
        step_ops = np.add.reduceat(in_step.astype(np.int64), starts)
        cls, name, dur = cls[starts], name[starts], dur[starts]
        n = len(starts)
        return pa.table([pa.array([run_id] * n, pa.string()), pa.array(np.full(n, rank, np.int32)),
                         pa.array(np.array(CLASSES, dtype=object)[cls], pa.string()),
                         pa.DictionaryArray.from_arrays(pa.array(name, mask=name < 0), pa.array(names, pa.string()))
                         .cast(pa.string()),
                         pa.array(dur, pa.int64()), pa.array(ops, pa.int64()), pa.array(step_ops, pa.int64())],
                        schema=GPU_OP_DURATIONS_SCHEMA)

    def summaries(self, run_id: str, rank: int) -> tuple[pa.Table, pa.Table]:
        """(GPU_BREAKDOWN_SUMMARY_SCHEMA, GPU_LAUNCHER_SUMMARY_SCHEMA) tables of the rows kept;
        empty without GPU ops."""
        from tracekit.timeline.gpu import NONE, summaries

        if not self.ops:
            return GPU_BREAKDOWN_SUMMARY_SCHEMA.empty_table(), GPU_LAUNCHER_SUMMARY_SCHEMA.empty_table()
        # what the link pass left in Arrow's pool goes back to the system before the numpy below
        # (the summaries' arrays are malloc's, which cannot reuse the pool's)
        pa.default_memory_pool().release_unused()
        s, dur, k, step, step_ok, leid, leid_ok = _columns(self.ops, 7)
        n = len(s)
        # the launch calls by event_id (they ascend in the file, as every row's event_id; sorted if not)
        if self.calls:
            ceid, ctrk, ctrk_ok, cts, cts_ok, cdur = _columns(self.calls, 6)
        else:
            ceid = ctrk = cts = cdur = np.zeros(0, np.int64)
            ctrk_ok = cts_ok = np.zeros(0, bool)
        self.calls = []
        if len(ceid) > 1 and (ceid[1:] < ceid[:-1]).any():  # (a reader that wrote them out of order)
            o = np.argsort(ceid, kind="stable")
            ceid, ctrk, ctrk_ok, cts, cts_ok, cdur = (x[o] for x in (ceid, ctrk, ctrk_ok, cts, cts_ok, cdur))
        lt, ls, le = (np.full(n, NONE, dtype=np.int64) for _ in range(3))
        if len(ceid):
            i = np.minimum(np.searchsorted(ceid, leid), len(ceid) - 1)
            hit = leid_ok & (ceid[i] == leid)
            i = i[hit]
            lt[hit] = np.where(ctrk_ok[i], ctrk[i], NONE)
            ls[hit] = np.where(cts_ok[i], cts[i], NONE)
            le[hit] = np.where(cts_ok[i], cts[i] + cdur[i], NONE)
        del ceid, ctrk, ctrk_ok, cts, cts_ok, cdur
        # by step, NULL first (tracekit.timeline.gpu.breakdown's order)
        step = np.where(step_ok, step, 0)
        o = np.lexsort((step, step_ok))
        gpu = dict(rank=np.full(n, rank, dtype=np.int64), s=s[o], dur=dur[o], k=k[o], step=step[o], step_ok=step_ok[o])
        launch = (lt[o], ls[o], le[o])
        del s, dur, k, step, step_ok, leid, leid_ok, lt, ls, le, o
        if self.ranges:
            trk, trk_ok, rs, rdur, rkind = _columns(self.ranges, 5)
            code = np.concatenate(self.range_names)
            names = pa.DictionaryArray.from_arrays(pa.array(code, mask=code < 0),
                                                   pa.array(list(self.names), pa.string()))
        else:
            trk = rs = rdur = np.zeros(0, np.int64)
            trk_ok, rkind = np.zeros(0, bool), np.zeros(0, np.int8)
            names = pa.chunked_array([], pa.string())
        self.ranges, self.range_names, self.names = [], [], {}
        ranges = dict(kind=rkind, rank=np.full(len(rs), rank, dtype=np.int64), track=np.where(trk_ok, trk, NONE),
                      s=rs, e=rs + rdur, name=names)
        del trk, trk_ok, rs, rdur, rkind, names
        wins, sums = summaries(gpu, launch, ranges)
        out = []
        for t, schema in ((wins, GPU_BREAKDOWN_SUMMARY_SCHEMA), (sums, GPU_LAUNCHER_SUMMARY_SCHEMA)):
            if t is None:
                out.append(schema.empty_table())
                continue
            t = t.add_column(0, "run_id", pa.array([run_id] * len(t), pa.string()))
            out.append(t.cast(schema))
        return tuple(out)


def _columns(parts: list, ncols: int) -> list:
    """The ``ncols`` columns of ``parts`` (per batch, a list of arrays), each concatenated; a column's
    parts are let go as soon as it is built, and ``parts`` is emptied (the tap's copies and the
    whole columns never coexist)."""
    out = []
    for j in range(ncols):
        out.append(np.concatenate([p[j] for p in parts]))
        for p in parts:
            p[j] = None
    parts.clear()
    return out


def assemble_rank(task: RankTask) -> RankResult:
    """Phase two of one rank's ingest, in a worker or the driver (tracekit.ingest.engine): write
    ``task.out`` (events: link pass, classes, steps; :func:`tracekit.ingest.linkpass.link_rank`)
    from the staging file, build the rank's collectives (:func:`tracekit.ingest.attribute.build_collectives`,
    seq via :func:`rank_collectives`), its warnings and its summaries: overlap
    (:func:`tracekit.timeline.intervals.rank_overlap_summary` on the comm and compute rows the link pass
    writes, kept by :class:`_SummaryTap`; the driver later shifts their timestamps by the rank's
    clock offset, which leaves every length as it is), GPU time (:class:`_GpuTap`), GPU ops per
    class, name and duration (:meth:`_GpuTap.op_durations`) and the step of each collective's event
    (:func:`call_steps`); then delete the staging file and the comm-metadata table. Memory: one
    rank's link pass, plus ~37 B per comm or compute row and ~50 B per GPU op for the summaries.
    Errors of the staging file propagate."""
    from tracekit.ingest.comm_families import user_families

    rf, rank, raw, run_id = task.rf, task.rank, task.raw, task.run_id
    cpu_only = not rf.has_gpu
    tap = _SummaryTap()
    with user_families(task.user_kernels):
        lk = link_rank(raw, Path(task.out), run_id, rank, cpu_only, rf.steps, writer_cls=tap.open,
                       pdl=supports_pdl(rf.meta.get("deviceProperties")))
        # first, while the collectives' metadata is not loaded yet (the peak of memory is here)
        op_durations = tap.gpu.op_durations(run_id, rank)
        try:
            gpu_windows, gpu_launchers = tap.gpu.summaries(run_id, rank)
            gpu_note = None
        except ValueError as exc:  # GPU work too long to sweep (a stray timestamp): no stored summaries
            gpu_windows = gpu_launchers = None
            gpu_note = f"{GPU_NOT_SUMMARISED} ({exc}): the run's GPU time breakdown is none"
        meta = rf.meta_rows(lk.spans)
        rows = build_collectives(
            run_id, rank, meta, lk.launches, world_size=task.world_size if task.world_known else None,
            pg_config=task.pg_config, cpu_only=cpu_only,
            calls=lk.cpu_calls,
        )
        facts: list = []
        from tracekit.ingest.attribute import DECLARED_WORLD, GROUP_SIZE_NOTES, group_size_warnings

        k_notes: dict = {}
        k_token = GROUP_SIZE_NOTES.set(k_notes)  # contradicting group sizes, counted while the rows are built
        w_token = DECLARED_WORLD.set(task.declared_world)
        try:
            table = rank_collectives(pg_attribution.tap(rows, facts))
        finally:
            GROUP_SIZE_NOTES.reset(k_token)
            DECLARED_WORLD.reset(w_token)
    # the recv collectives' spans (an unattributed row, op NULL, is none)
    recv = pc.fill_null(pc.equal(table.column("op"), "recv"), False).to_numpy(zero_copy_only=False)
    eids = table.column("event_id")
    windows, spans, steps = tap.summaries(run_id, rank, eids.to_numpy(zero_copy_only=False)[recv],
                                          pc.drop_null(eids).to_numpy(zero_copy_only=False), task.out)
    del tap
    n_clipped, max_clip, n_skew, max_skew = lk.n_clipped, lk.max_clip_ns, lk.n_skew, lk.max_skew_ns
    gpu_events, same_stream = lk.gpu_events, lk.same_stream_overlaps
    extent = (lk.ts_lo, lk.ts_hi)
    del meta, lk, rows
    n_unattributed = table.column("op").null_count
    warnings = list(dict.fromkeys(rf.warnings)) + ([gpu_note] if gpu_note else []) + group_size_warnings(k_notes)
    if rf.quarantined:
        warnings.append(f"{rf.quarantined} event(s) quarantined in all (a missing or non-positive ts, a negative dur, "
                        "or a reason warned above)")
    if n_clipped:
        warnings.append(
            f"{n_clipped} GPU event(s) overlapped the next on their stream by more than {CLIP_TOLERANCE_NS} ns "
            f"and were clipped to its start (largest cut {max_clip / 1e3:.3f} µs; a clock defect: the device is not "
            "known to run programmatic dependent launch, sm_90+)"
        )
    if n_skew:
        warnings.append(
            f"{n_skew} GPU event(s) start before their own launch call (largest skew {max_skew / 1e3:.3f} µs): "
            "CPU and GPU clocks disagree"
        )
    if rf.events == 0:
        warnings.append("metadata only: the file holds no complete events")
    if n_unattributed:
        warnings.append(
            f"{n_unattributed} communication span(s) unattributed (no collective metadata anywhere)"
        )
    if not table.num_rows and rf.events:
        warnings.append("no communication in this rank's trace")
    di = rf.meta.get("distributedInfo") if isinstance(rf.meta.get("distributedInfo"), dict) else {}
    host = str(rf.meta.get("host_name") or di.get("host") or "") or None
    row = dict(
        run_id=run_id,
        rank=rank,
        host=host,
        source_path=str(Path(rf.path).resolve()),
        source_sha256=rf.sha256,
        clock_offset_ns=0,
        clock_offset_err_ns=0,
        events=rf.events,
        events_quarantined=rf.quarantined,
        warnings=warnings,
        gpu_events=gpu_events,
        same_stream_overlaps=same_stream,
    )
    algo_proto = set(zip(table.column("algo").to_pylist(), table.column("proto").to_pylist()))
    pg_sizes = set(zip(table.column("pg_name").to_pylist(), table.column("group_size").to_pylist()))
    # the tables go to the staging area, not to the driver (its memory stays flat with the run's size)
    from tracekit.ingest.critical_path import rank_tables

    streamed: set = set()

    def write(name, tables):
        _write_parts(task.parts, name, dict((n, sc) for n, sc, _ in PART_TABLES)[name], rank, tables)
        streamed.add(name)

    paths = rank_tables(Path(task.out), run_id, rank, task.alone and not _may_meet_itself(table, facts), write)
    for (name, schema, _), t in zip(PART_TABLES, (table, windows, spans, gpu_windows, gpu_launchers, op_durations,
                                                  steps)):
        if t is not None:
            _write_part(task.parts, name, schema, rank, t)
    for name, schema, _ in (p for p in PART_TABLES if p[0] in CRITICAL_PATH_TABLES):  # the long one not streamed: empty
        if name not in streamed and name not in unstaged(task.alone):
            _write_part(task.parts, name, schema, rank, paths.get(name, schema.empty_table()))
    Path(raw).unlink(missing_ok=True)
    rf.remove_meta()
    return RankResult(rank, extent, host, row, facts if any(f is not None for f in facts) else [], pg_sizes,
                      algo_proto, gpu_windows is not None)


def _on_system_pool(fn):
    """``fn`` run with Arrow's default memory pool set to the system allocator (malloc), then the
    pool as it was. The driver reads and frees thousands of small staged tables while it streams a
    run's tables; the bundled allocators (mimalloc, jemalloc) keep much of what is freed, so the
    process grows with the ranks; malloc gives it back (the `tracekit` command sets this pool for the
    whole process through ARROW_DEFAULT_MEMORY_POOL; a library caller gets it here)."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        prev = pa.default_memory_pool()
        pa.set_memory_pool(pa.system_memory_pool())
        try:
            return fn(*args, **kwargs)
        finally:
            pa.set_memory_pool(prev)

    return run


@_on_system_pool
def finish_run(
    stage: Path, run_id, results, ranks, raw_files, *, workload, config, source, align: str | None = None,
    engine=None, user_kernels=(), progress=None,
) -> None:
    """Write run.parquet, ranks.parquet, events/rank=R.parquet, collectives.parquet and the summary
    tables (tracekit.store.SUMMARY_TABLES: overlap_summary, span_overlap, gpu_breakdown_summary,
    gpu_launcher_summary, gpu_op_durations, collective_steps; every run holds them all) into ``stage``.

    Each rank's task (:func:`assemble_rank`, run by ``engine``) writes its collectives and summaries
    to ``stage/parts`` (:func:`part_path`) and returns a small :class:`RankResult`. The driver then
    reads back only what it needs across ranks: the full collectives of ranks with gloo calls
    lacking a process group (:func:`tracekit.ingest.pg_attribution.attribute`; rewritten when it
    changes them), the six columns the clock alignment reads (DuckDB over the staged files), and
    finally streams every staged table into the run's file, one rank at a time, its
    timestamps shifted by the rank's clock offset, gathered into row groups of
    COLLECTIVES_ROW_GROUP rows. The driver's memory: one rank's staged table and one row group;
    the alignment (:func:`tracekit.ingest.clocks.estimate_offsets_from_files`) runs in DuckDB
    within SHIFT_MEMORY_LIMIT, spilling to the staging directory.
    Arrow allocates from the system allocator meanwhile (:func:`_on_system_pool`).
    ``stage/parts`` is removed at the end; on an error the caller's staging directory (and it) is.

    ``align``: ``none`` | ``host`` | ``collectives`` (default: collectives when the
    ranks' hosts differ, else none); see :func:`tracekit.ingest.clocks.estimate_offsets`.
    ``engine``: runs :func:`assemble_rank` per rank (tracekit.ingest.engine; default: in this
    process); ``user_kernels``: the ``--comm-pattern`` kernels; ``progress``: advanced per rank.
    Raises FileError naming a staged file that is missing or unreadable.
    """
    from tracekit.ingest.clocks import choose_alignment, estimate_offsets, estimate_offsets_from_files
    from tracekit.ingest.engine import LocalEngine

    world_size = _world_size(results, ranks)
    pg_config = _pg_config(results)
    (stage / "events").mkdir()
    parts = stage / "parts"
    for name, _, _ in PART_TABLES:
        (parts / name).mkdir(parents=True)
    order = sorted(zip(results, ranks, raw_files), key=lambda t: t[1])
    tasks = [RankTask(rf, rank, str(Path(raw).resolve()), str((stage / "events" / f"rank={rank}.parquet").resolve()),
                      run_id, world_size, pg_config, tuple(user_kernels), _declared_world(results),
                      _world_known(results), str(parts.resolve()), len(order) == 1)
             for rf, rank, raw in order]
    names = [str(rf.path) for rf, _, _ in order]
    done = (engine or LocalEngine(1, False)).map(assemble_rank, tasks, names, progress)
    del tasks
    rank_order = [d.rank for d in done]
    rank_rows = [d.row for d in done]
    hosts = {d.rank: d.host for d in done}
    extent = {d.rank: d.extent for d in done}
    facts = {d.rank: d.facts for d in done if d.facts}  # rank → per collectives row, what pg_attribution needs
    pg_sizes = {d.rank: d.pg_sizes for d in done}
    algo_proto = set().union(*(d.algo_proto for d in done))
    no_gpu = not all(d.gpu_ok for d in done)
    del done
    mode = choose_alignment(align, hosts)
    if mode == "none" and align is None:  # an explicit --align none says the clocks are trusted
        _check_one_timeline(extent, results, ranks)
    # only the ranks with unnamed gloo calls are read whole (attribute leaves the others' tables alone)
    unnamed = {r for r, fs in facts.items() if any(f and f["unnamed"] for f in fs)}
    tables = [(r, read_part(parts, "collectives", r) if r in unnamed else None) for r in rank_order]
    attributed, pg_notes = pg_attribution.attribute(tables, facts, pg_config, same_clock=mode == "none")
    for (r, before), (_, after) in zip(tables, attributed):
        if after is not before:  # rewritten: its staged file and its (pg_name, group_size) pairs
            _write_part(parts, "collectives", COLLECTIVES_SCHEMA, r, after)
            pg_sizes[r] = set(zip(after.column("pg_name").to_pylist(), after.column("group_size").to_pylist()))
    del tables, attributed, facts
    from tracekit.ingest.attribute import group_size_disagreements

    # ranks that give one process group different sizes (it reads only these two columns)
    k_notes = group_size_disagreements([(r, _pairs_table(pg_sizes[r])) for r in rank_order])
    for rr in rank_rows:
        rr["warnings"].extend(pg_notes.get(rr["rank"], []) + k_notes.get(rr["rank"], []))
    con = None
    if mode != "none":  # from the staged files, in DuckDB (bounded, spilling): not the rows in Python
        con = _shift_connection(stage)
        files = {r: check_part(parts, "collectives", r) for r in rank_order}  # each one's footer and columns
        try:
            offsets = estimate_offsets_from_files(files, sorted(hosts), hosts, mode, con)
        except duckdb_error() as exc:
            con.close()
            raise FileError(parts / "collectives", f"staged collectives cannot be read for the clock alignment "
                                                   f"({' '.join(str(exc).split())[:200]})") from None
    else:
        offsets = estimate_offsets([], sorted(hosts), hosts, mode)
    for rr in rank_rows:
        off, err, note = offsets.get(rr["rank"], (0, 0, None))
        rr["clock_offset_ns"], rr["clock_offset_err_ns"] = off, err
        if note:
            rr["warnings"].append(note)
        if off:
            if con is None:
                con = _shift_connection(stage)
            f = stage / "events" / f"rank={rr['rank']}.parquet"
            tmp = f.with_suffix(".shifting")
            con.execute(
                f"COPY (SELECT * REPLACE (ts_ns + {int(off)} AS ts_ns) FROM read_parquet({_sql_str(glob_escape(f))})) "
                f"TO {_sql_str(tmp)} (FORMAT parquet, COMPRESSION zstd)"
            )
            tmp.replace(f)
    if con is not None:
        con.close()
    # the summaries' timestamps move with the rank's events; their lengths do not (a per-rank shift
    # moves comm and compute alike). A rank whose GPU summaries could not be made (GPU_NOT_SUMMARISED
    # in its warnings): the run stores both GPU files empty, no rank's rows (sums over ranks would be
    # partial)
    for name, schema, cols in PART_TABLES:
        if (no_gpu and name in GPU_SWEPT_TABLES) or name in unstaged(len(rank_order) == 1):
            pq.write_table(schema.empty_table(), stage / f"{name}.parquet", **PARQUET_OPTS)
            continue
        # ranks gathered into row groups of COLLECTIVES_ROW_GROUP rows or ROW_GROUP_BYTES (a row group
        # per rank makes a footer that grows with the ranks, read by every scan: benchmarks/README.md);
        # at most one rank's staged table and one row group's worth of shifted copies held at a time
        with pq.ParquetWriter(stage / f"{name}.parquet", schema, **PARQUET_OPTS) as w:
            buf, n, nbytes = [], 0, 0
            for k, r in enumerate(rank_order):
                buf.append(_shifted(read_part(parts, name, r), offsets.get(r, (0, 0, None))[0], cols))
                n += buf[-1].num_rows
                nbytes += buf[-1].nbytes
                if len(buf) >= STREAM_COMBINE_RANKS:  # many ranks' small tables: one contiguous table
                    buf = [pa.concat_tables(buf).combine_chunks()]
                if n >= COLLECTIVES_ROW_GROUP or nbytes >= ROW_GROUP_BYTES or k == len(rank_order) - 1:
                    w.write_table(pa.concat_tables(buf), row_group_size=COLLECTIVES_ROW_GROUP)
                    buf, n, nbytes = [], 0, 0
    shutil.rmtree(parts)
    pq.write_table(pa.Table.from_pylist(rank_rows, schema=RANKS_SCHEMA), stage / "ranks.parquet", **PARQUET_OPTS)
    algo_proto = sorted(algo_proto, key=str)
    run_row = _run_row(run_id, results, [dict(algo=a, proto=p) for a, p in algo_proto], world_size, workload,
                       config, source, lambda: _backend_from_names(stage / "events"))
    run_row["config"] = json.dumps(dict(config, clock_alignment=mode), sort_keys=True, default=str)
    pq.write_table(pa.Table.from_pylist([run_row], schema=RUNS_SCHEMA), stage / "run.parquet", **PARQUET_OPTS)
    shutil.rmtree(stage / "duckdb-tmp", ignore_errors=True)
    try:
        (stage / "raw").rmdir()
    except OSError:
        pass


COLLECTIVES_CHUNK = 4096
"""Collectives rows built as dicts before they become an Arrow table."""

COLLECTIVES_ROW_GROUP = 65_536
"""Rows per row group of collectives.parquet (at most; see ROW_GROUP_BYTES)."""

ROW_GROUP_BYTES = 2 << 20
"""While a run's table is streamed from the staged files: a row group is written once the ranks'
tables gathered for it hold this many bytes in memory (Arrow's ``nbytes``), even below
COLLECTIVES_ROW_GROUP rows. Rows whose ``pg_ranks`` lists name hundreds of ranks are kB each: a
row-count bound alone would let the driver hold tens of MB growing with the ranks."""

STREAM_COMBINE_RANKS = 64
"""While a run's table is streamed from the staged files: ranks' tables held apart before they are
combined into one (each small table read from a file holds its own buffers)."""


def rank_collectives(rows) -> pa.Table:
    """One rank's collectives rows (dicts, made into tables COLLECTIVES_CHUNK at a time, or
    COLLECTIVES_SCHEMA tables, as :func:`tracekit.ingest.attribute.build_collectives` yields them)
    → a COLLECTIVES_SCHEMA table, in the same order, with ``seq`` numbered where the trace gives none.

    A row without ``seq`` whose op is known gets its position in its pg_name group ordered by
    issue_ts_ns, then ts_ns, then event_id (then row order), counting from 0: the CPU's call
    order. A rank whose trace carries ``Seq`` keeps it; a row without an op gets none (it cannot
    be matched across ranks). Memory: the rank's table (~150 B per collective).
    """
    parts = []
    for is_table, run in itertools.groupby(rows, key=lambda r: isinstance(r, pa.Table)):
        if is_table:
            parts.extend(run)
        while not is_table and (chunk := list(itertools.islice(run, COLLECTIVES_CHUNK))):
            parts.append(pa.Table.from_pylist(chunk, schema=COLLECTIVES_SCHEMA))
    table = pa.concat_tables(parts) if parts else COLLECTIVES_SCHEMA.empty_table()
    seq = table.column("seq")
    need = pc.and_(seq.is_null(), table.column("op").is_valid()).to_numpy()
    if not need.any():
        return table.combine_chunks()
    return number_seq(table, need)


def _shifted(table: pa.Table, offset_ns: int, cols=("ts_ns", "issue_ts_ns")) -> pa.Table:
    """``table`` with ``offset_ns`` added to its columns ``cols`` (NULLs stay NULL)."""
    if not offset_ns:
        return table
    for name in cols:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), pc.add(table.column(i), pa.scalar(int(offset_ns), pa.int64())))
    return table


def _pairs_table(pairs: set) -> pa.Table:
    """The (pg_name, group_size) pairs of one rank as a two-column table (pg_name string, group_size
    int64), in a fixed order."""
    pairs = sorted(pairs, key=str)
    return pa.table(dict(pg_name=pa.array([p for p, _ in pairs], pa.string()),
                         group_size=pa.array([k for _, k in pairs], pa.int64())))


def duckdb_error():
    """DuckDB's base exception class (imported when needed)."""
    import duckdb

    return duckdb.Error


def _shift_connection(stage: Path):
    """An in-memory DuckDB for shifting events files by a clock offset: bounded memory, spilling to
    the staging directory."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET memory_limit = '{SHIFT_MEMORY_LIMIT}'")
    con.execute(f"SET temp_directory = {_sql_str(stage / 'duckdb-tmp')}")
    return con


SHIFT_MEMORY_LIMIT = "256MB"
"""DuckDB's memory budget when events files are rewritten with a clock offset (it spills beyond it)."""


def _check_one_timeline(extent: dict, results, ranks) -> None:
    """Ranks of one run on one clock were profiled over a common window: their spans must share
    some time. Files of different runs (or days) fail here instead of giving absurd waits.

    ``extent``: rank → (first start, last end) in ns, (None, None) for a rank with no rows.
    Raises FileError naming the rank file that starts after another one ended.
    """
    spans = []
    for rf, rank in zip(results, ranks):
        lo, hi = extent.get(rank, (None, None))
        if lo is not None:
            spans.append((lo, hi, rf.path))
    if len(spans) < 2:
        return
    late = max(spans, key=lambda t: t[0])
    early = min(spans, key=lambda t: t[1])
    if late[0] > early[1]:
        gap_s = (late[0] - early[1]) / 1e9
        raise FileError(
            late[2],
            f"starts {gap_s:,.3f} s after {Path(early[2]).name} ends: not the same run "
            "(or clocks of different hosts: try --align collectives)",
        )


def _declared_world(results) -> int | None:
    """The largest ``distributedInfo.world_size`` the files declare; None when none declares one
    (then the world is only what was ingested, no bound on a group's size)."""
    ws = [di["world_size"] for r in results if isinstance(di := r.meta.get("distributedInfo"), dict)
          and type(di.get("world_size")) is int and di["world_size"] > 0]
    return max(ws) if ws else None


def _world_known(results) -> bool:
    """Whether the world size is evidence: some trace declares it (distributedInfo.world_size), or
    several rank files were given. One file that declares none says nothing about its group."""
    return len(results) > 1 or any(isinstance(r.meta.get("distributedInfo"), dict)
                                   and isinstance(r.meta["distributedInfo"].get("world_size"), int) for r in results)


def _world_size(results, ranks) -> int:
    ws = 0
    for r in results:
        di = r.meta.get("distributedInfo")
        if isinstance(di, dict) and isinstance(di.get("world_size"), int):
            ws = max(ws, di["world_size"])
    return max(ws, max(ranks) + 1 if ranks else 1, len(results))


def _pg_config(results) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in results:
        di = r.meta.get("distributedInfo")
        if not isinstance(di, dict):
            continue
        for pg in di.get("pg_config") or []:
            if isinstance(pg, dict) and "pg_name" in pg and isinstance(pg.get("ranks"), list):
                out[str(pg["pg_name"])] = [x for x in pg["ranks"] if type(x) is int and 0 <= x < 2**31]
    return out


def _backend_from_names(events_dir: Path) -> str | None:
    """The backend the run's collective calls name (``nccl:*`` → nccl, ``rccl:*`` → rccl, ``gloo:*``
    → gloo; the most named), from the staged events files; None when they name none. Read only
    for a run whose traces declare no backend (legacy traces): one scan of the name column."""
    import duckdb

    from tracekit.store import sql_file_list

    files = sorted(str(f) for f in Path(events_dir).glob("*.parquet"))
    if not files:
        return None
    got = duckdb.connect().execute(
        f"SELECT split_part(name, ':', 1) AS b, count(*) AS n FROM read_parquet({sql_file_list(files)}) "
        "WHERE name LIKE 'nccl:%' OR name LIKE 'rccl:%' OR name LIKE 'gloo:%' GROUP BY b ORDER BY n DESC, b LIMIT 1"
    ).fetchone()
    return None if got is None else got[0]


def _run_row(run_id, results, rows, world_size, workload, config, source, names_backend=None) -> dict:
    from datetime import datetime, timezone

    meta = results[0].meta if results else {}
    di = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    dev = meta.get("deviceProperties")
    device_name = None
    if isinstance(dev, list) and dev and isinstance(dev[0], dict):
        device_name = dev[0].get("name")
    backend = di.get("backend")
    if isinstance(device_name, str) and ("AMD" in device_name or "Instinct" in device_name) and backend == "nccl":
        backend = "rccl"
    if (not isinstance(backend, str) or not backend) and names_backend is not None:
        backend = names_backend()  # the calls' own names (nccl:all_reduce...) before the guesses below
    if not isinstance(backend, str) or not backend:
        if any(r.get("algo") or r.get("proto") for r in rows):
            backend = "nccl"
        elif rows and all(r.get("algo") is None for r in rows) and not (isinstance(dev, list) and dev):
            backend = "gloo"
        else:
            backend = config.get("backend") or "unknown"
    return dict(
        run_id=run_id,
        created_at=datetime.now(timezone.utc),
        source=source,
        workload=workload or config.get("workload") or "external",
        backend=backend,
        world_size=world_size,
        torch_version=config.get("torch_version") or meta.get("pytorch_version"),
        nccl_version=di.get("nccl_version"),
        device_name=device_name or config.get("device_name"),
        config=json.dumps(config, sort_keys=True, default=str),
        schema_version=SCHEMA_VERSION,
    )
