"""The link pass of one rank: staging rows → final ``events`` rows.

Input: the staging file a reader wrote (an Arrow IPC stream of ``staging.RAW_SCHEMA``
rows, in file order). Output: ``events/rank=R.parquet`` (``store.EVENTS_SCHEMA``, same
order), plus what the collectives need (:class:`LinkResult`). Per row:

* ``launch_event_id`` — a GPU-stream row's runtime launch call: among the rows of
  category ``runtime`` or ``driver`` with the same correlation id, a ``runtime`` one
  before a ``driver`` one, then the lowest event_id;
* ``clipped`` / ``clipped_ns`` / ``dur_ns`` — a kernel, memcpy or memset that runs
  past the start of the next such op on its GPU stream (order: ts, then event_id)
  by more than :data:`CLIP_TOLERANCE_NS` is cut to that start (a clock artefact:
  one stream runs one op at a time); ``dur_ns`` is the cut duration. Not on a GPU
  with programmatic dependent launch (:func:`supports_pdl`: sm_90 and later), where
  a kernel may start before the previous one ends: there, as for overlaps up to the
  tolerance anywhere, the op is kept whole (the overlap is counted once in the unions
  of the analyses) and counted in ``same_stream_overlaps``;
* ``class`` (DESIGN.md, "Classifying events"), first rule that holds: ``comm`` for
  communication rows (``is_comm``: comm kernels, ``gloo:*`` spans) and, on CPU-only
  traces, the blocking ``c10d::send``/``recv_`` calls; ``sync`` for category
  ``sync`` or a Stream/Event/Device/Context synchronize call (:data:`SYNC_NAME`);
  ``compute`` for kernels; ``memory`` for memcpy/memset; ``other`` for the rest of
  the GPU streams; on CPU-only traces ``compute`` for ``cpu_op`` rows of threads that
  run no gloo work, other than ``c10d::*``/``nccl:*``/``rccl:*``/``gloo:*``/``record_param_comms``
  and other than those that meet, on their thread, the time of such an op other than the
  ``gloo:*`` communication spans (:class:`_Blocked`:
  the thread is then blocked in a collective call or its wait, ``c10d::wait`` included): an op
  inside a call (its launch work) and an op around one (Megatron's ``ReduceFromTP`` around a
  blocking ``c10d::allreduce_``, whose wait the profiler records as no op of its own) are not
  compute, the ops they enclose that meet no call still are. CPU compute is thus the union of
  the compute ops of each thread without the time that thread spends in collective calls; a
  row is classed whole, never split, so an enclosing op's own time outside the call (where the
  unrecorded wait lies) goes with it, while its child ops keep theirs;
  on CPU-only traces without gloo spans the outermost collective CPU calls are ``comm``
  (:class:`_CpuCalls`); ``cpu`` for everything else;
* ``step`` — the ``ProfilerStep#N`` window ``[start, end)`` that starts last at or
  before the row's time (a GPU row's launch time when it has a launch), if the time
  is before that window's end; else null.

How: three scans of the staging file, a batch at a time (the reader's batches, ~40k rows).
Scan one keeps, in numpy, per GPU op its stream and start (12 B) and per launch call its
correlation id, kind, event_id and start (25 B); from them, in memory, each op's next start
on its stream (one stable sort by (stream, start); 9 B per op kept) and the best launch call
per correlation id (one sort; 24 B per id kept). Scan two writes the rows. Scan three reads
the launch calls of the comm kernels (their thread and duration). Memory is thus linear in
a rank's GPU ops and launch calls, about 50 B per such event, never the rows themselves
(DESIGN.md allows memory linear in a rank's events at a documented cost).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.ingest.staging import _BatchWriter
from tracekit.model.ops import canonical_op
from tracekit.store import CLIP_TOLERANCE_NS, EVENTS_SCHEMA

SYNC_NAME = re.compile(
    r"(stream|event|device|context)synchronize|cuda_sync|hip(stream|event|device)synchronize", re.I | re.A
)
"""CPU calls that wait for the GPU, by name (searched anywhere in the name; ASCII case folding only,
so ``ſ`` is not an ``s``)."""


PDL_PRESETS = frozenset({"nvlink4", "pcie5", "nvlink5"})
"""Intra-node link presets (tracekit.model.DEVICE_PRESETS) of the NVIDIA devices of sm_90 and later
(Hopper H100/H200/GH200, Blackwell B200/B300/GB200): the devices with programmatic dependent launch."""


def _amd_device(d: dict, name: str) -> bool:
    """Whether a ``deviceProperties`` entry is an AMD GPU: by its name (AMD, Instinct, MI<n>, Radeon,
    a ``gfx`` architecture), its ``gcnArchName`` (ROCm's Kineto writes it), or a warp 64 lanes wide
    (``warpSize``: AMD CDNA/GCN wavefronts; every NVIDIA GPU's warp is 32)."""
    if re.search(r"AMD|Instinct|\bMI\d|Radeon|\bgfx\d", name, re.I):
        return True
    if isinstance(d.get("gcnArchName"), str) and d["gcnArchName"].strip():
        return True
    return d.get("warpSize") == 64


def supports_pdl(device_properties) -> bool:
    """Whether a rank's GPUs run programmatic dependent launch (PDL, CUDA 11.8+ on sm_90 and later:
    a kernel may start before the previous one on its stream ends, so ops on one stream overlap
    legitimately). ``device_properties``: Kineto's ``deviceProperties`` list. True when every
    listed device is an NVIDIA GPU of compute capability 9 or more (``computeMajor``; AMD GPUs
    also report a ``computeMajor``, their gfx major, so an AMD device (:func:`_amd_device`: name,
    ``gcnArchName``, warp size 64) never counts, nor an unnamed device without a 32-wide warp), or,
    without ``computeMajor``, whose name maps to a Hopper/Blackwell link preset (:data:`PDL_PRESETS`).
    False for an empty or missing list (an unknown device keeps the clipping of clock defects)."""
    from tracekit.model.links import device_presets

    if not isinstance(device_properties, list) or not device_properties:
        return False
    for d in device_properties:
        if not isinstance(d, dict):
            return False
        name = str(d.get("name") or "")
        if _amd_device(d, name):
            return False
        major = d.get("computeMajor")
        if type(major) is int:
            # sm_90+ only for a device known to be NVIDIA's: a named one, or an unnamed one whose
            # warp is 32 wide (an unnamed device with computeMajor 9 may be an AMD gfx9 part)
            if major < 9 or (not name.strip() and d.get("warpSize") != 32):
                return False
            continue
        preset = device_presets(name)
        if preset is None or preset[0] not in PDL_PRESETS:
            return False
    return True

EVENTS_ROW_GROUP = 32_768
"""Rows per Parquet row group of events files."""


_WRITE_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if pa.types.is_string(f.type) else f
     for f in EVENTS_SCHEMA]
)
"""EVENTS_SCHEMA with its string columns dictionary-encoded: written as they are (no re-encoding),
and read back as plain strings (the file stores no Arrow schema)."""

CLASSES = ("comm", "sync", "compute", "memory", "other", "cpu")
_COMM, _SYNC, _COMPUTE, _MEMORY, _OTHER, _CPU = range(6)
_CPU_ONLY_COMM_CALLS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
_COLLECTIVE_CPU = ("c10d::", "nccl:", "rccl:", "gloo:")
_CALL_PREFIX = ("c10d::", "nccl:", "rccl:")  # with a collective's name: a CPU-only rank's collective calls

# category → bits
_C_LAUNCH, _C_RUNTIME, _C_GPU_OP, _C_KERNEL, _C_MEMORY, _C_SYNC, _C_CPU_OP = 1, 2, 4, 8, 16, 32, 64
_CATEGORY_BITS = {
    "runtime": _C_LAUNCH | _C_RUNTIME,
    "driver": _C_LAUNCH,
    "kernel": _C_GPU_OP | _C_KERNEL,
    "memcpy": _C_GPU_OP | _C_MEMORY,
    "memset": _C_GPU_OP | _C_MEMORY,
    "sync": _C_SYNC,
    "cpu_op": _C_CPU_OP,
    # no category at all (kineto's reader: "other"): a legacy autograd-profiler trace, whose events
    # are CPU ops without "cat"; classed by the same CPU-only rule as today's cpu_op rows
    "other": _C_CPU_OP,
}
# name → bits
_N_CPU_ONLY_COMM, _N_SYNC, _N_COLLECTIVE_CPU, _N_NULL, _N_GLOO_P2P, _N_CALL = 1, 2, 4, 8, 16, 32


def _name_bits(name: str | None) -> int:
    if name is None:
        return _N_NULL
    bits = 0
    if name in _CPU_ONLY_COMM_CALLS:
        bits |= _N_CPU_ONLY_COMM
    if SYNC_NAME.search(name):
        bits |= _N_SYNC
    if name.startswith(_COLLECTIVE_CPU) or name == "record_param_comms":
        bits |= _N_COLLECTIVE_CPU
    if name in ("gloo:send", "gloo:recv"):
        bits |= _N_GLOO_P2P
    if name == "record_param_comms" or (name.startswith(_CALL_PREFIX) and canonical_op(name, trace=True)):
        bits |= _N_CALL
    return bits




@dataclass
class ById:
    """Rows keyed by event_id: ``ids`` (int64, ascending, distinct), ``cols`` (one array per
    column, the same length) and ``valid`` (per column a bool mask, or None when all are present)."""

    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    cols: list = field(default_factory=list)
    valid: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, list, list]:
        """(found, values, valids) per key: whether it is there, per column its value (0 where
        not found) and its presence (None for a column without nulls)."""
        keys = np.asarray(keys, dtype=np.int64)
        if not len(self.ids):
            z = np.zeros(len(keys), dtype=np.int64)
            return np.zeros(len(keys), dtype=bool), [z] * len(self.cols), [None] * len(self.cols)
        i = np.minimum(np.searchsorted(self.ids, keys), len(self.ids) - 1)
        found = self.ids[i] == keys
        vals = [np.where(found, c[i], 0) for c in self.cols]
        return found, vals, [None if v is None else found & v[i] for v in self.valid]

    def to_dict(self) -> dict:
        """Every row as {event_id: tuple of Python values, None where absent} (for tests)."""
        cols = [[None if v is not None and not ok else x for x, ok in zip(c.tolist(), (v if v is not None else
                 np.ones(len(c), dtype=bool)).tolist())] for c, v in zip(self.cols, self.valid)]
        return {k: tuple(c[j] for c in cols) for j, k in enumerate(self.ids.tolist())}


def _empty(ncols: int) -> ById:
    z = np.empty(0, dtype=np.int64)
    return ById(z, [z] * ncols, [None] * ncols)


@dataclass
class LinkResult:
    """What the link pass of one rank found besides the rows it wrote.

    ``spans``: comm rows by event_id → (ts_ns, dur_ns after clipping). ``launches``: comm
    GPU rows by event_id → (pid, tid, launch ts_ns, launch end ns) of their launch call
    (:class:`ById`, in memory). ``n_clipped``/``max_clip_ns``: GPU ops cut to the next op's
    start, and the largest cut. ``same_stream_overlaps``: GPU ops that overlap the next op on their
    stream and were kept whole (by at most CLIP_TOLERANCE_NS, or any amount on a device with
    programmatic dependent launch). ``gpu_events``: rows on GPU streams (0: a CPU-only rank).
    ``cpu_calls``: event ids of the collective CPU calls of a CPU-only rank without gloo spans
    (:class:`_CpuCalls`; class ``comm``), ascending. ``n_skew``/``max_skew_ns``: GPU rows that start before their
    launch call, and the largest such gap. ``ts_lo``/``ts_hi``: the rank's first start
    and last end (ns), None when it has no rows.
    """

    spans: ById = field(default_factory=lambda: _empty(2))
    launches: ById = field(default_factory=lambda: _empty(4))
    n_clipped: int = 0
    max_clip_ns: int | None = None
    same_stream_overlaps: int = 0
    gpu_events: int = 0
    cpu_calls: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    n_skew: int = 0
    max_skew_ns: int | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None


def _ints(col) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, validity or None when there are no nulls) of an int or bool Arrow column; null
    slots hold 0 / False."""
    if col.null_count:
        return pc.fill_null(col, False if pa.types.is_boolean(col.type) else 0).to_numpy(zero_copy_only=False), \
            col.is_valid().to_numpy(zero_copy_only=False)
    return col.to_numpy(zero_copy_only=False), None


def _all_valid(valid: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, dtype=bool) if valid is None else valid


def _lut(col: pa.Array, fn, cache: dict) -> np.ndarray:
    """A dictionary-encoded string column → int64 ``fn(value)`` per row (``fn(None)`` for nulls)."""
    words = col.dictionary.to_pylist()
    table = np.empty(len(words) + 1, dtype=np.int64)
    for i, w in enumerate(words):
        got = cache.get(w)
        if got is None:
            got = cache[w] = fn(w)
        table[i] = got
    table[len(words)] = fn(None)
    idx, ok = _ints(col.indices)
    if ok is not None:
        idx = np.where(ok, idx, len(words))
    return table[idx]


def _stream_ids(streams: dict, dev, dev_ok, trk, trk_ok) -> np.ndarray:
    """Per GPU op, an int32 id of its stream ((device, track), a null being its own value), from
    ``streams`` (filled as new streams appear)."""
    du, di = np.unique(dev, return_inverse=True)
    tu, ti = np.unique(trk, return_inverse=True)
    code = (di.reshape(-1).astype(np.int64) * len(tu) + ti.reshape(-1)) * 4 + dev_ok * 2 + trk_ok
    cu, ci = np.unique(code, return_inverse=True)
    ids = np.empty(len(cu), dtype=np.int32)
    for k, c in enumerate(cu.tolist()):
        pair, flags = divmod(c, 4)
        d, t = divmod(pair, len(tu))
        key = (int(du[d]) if flags & 2 else None, int(tu[t]) if flags & 1 else None)
        ids[k] = streams.setdefault(key, len(streams))
    return ids[ci.reshape(-1)]


def _streams_and_starts(b: pa.RecordBatch, g: np.ndarray, streams: dict) -> tuple[np.ndarray, np.ndarray]:
    """(stream id, start ns) of the GPU ops ``g`` of batch ``b`` (ids from ``streams``, see :func:`_stream_ids`)."""
    n = b.num_rows
    dev, dev_ok = _ints(b.column("device"))
    trk, trk_ok = _ints(b.column("track"))
    dv, tv = _all_valid(dev_ok, n), _all_valid(trk_ok, n)
    return _stream_ids(streams, dev[g], dv[g], trk[g], tv[g]), _ints(b.column("ts_ns"))[0][g]


def _gpu_ops(gpu: np.ndarray, cat: np.ndarray) -> np.ndarray:
    """Rows that are GPU ops for clipping: kernels, memcpy and memset on a GPU stream."""
    return gpu & ((cat & _C_GPU_OP) > 0)



def _concat(parts: list, dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


class _CpuCalls:
    """The collective calls of a CPU-only rank without gloo spans: its outermost collective CPU ops.

    ``ops``: rows (device, track, ts_ns, dur_ns, event_id) of the rank's ``record_param_comms`` and
    ``c10d::*`` / ``nccl:*`` / ``rccl:*`` CPU ops that name a collective (``canonical_op``: not
    ``c10d::wait`` or the coalescing markers), or None (a GPU rank, or one with gloo spans). An
    op is a call when no earlier op on its thread (by start, the longer first) still runs at its
    start: ``c10d::allreduce_`` around ``record_param_comms`` around ``nccl:all_reduce`` is one
    call, the outer op. The calls are the rank's communication (class ``comm``).
    """

    def __init__(self, ops: np.ndarray | None):
        self.ids = np.empty(0, dtype=np.int64)
        if ops is None or not len(ops):
            return
        o = np.lexsort((ops[:, 4], -ops[:, 3], ops[:, 2], ops[:, 1], ops[:, 0]))
        ops = ops[o]
        root = np.ones(len(ops), dtype=bool)
        for key in {(int(d), int(t)) for d, t in ops[:, :2].tolist()}:
            m = np.flatnonzero((ops[:, 0] == key[0]) & (ops[:, 1] == key[1]))
            end = ops[m, 2] + ops[m, 3]
            running = np.maximum.accumulate(end)
            root[m[1:]] = ops[m[1:], 2] >= running[:-1]
        self.ids = np.sort(ops[root, 4])

    def is_call(self, eid: np.ndarray) -> np.ndarray:
        """Per row: whether it is one of the calls."""
        return np.isin(eid, self.ids) if len(self.ids) else np.zeros(len(eid), dtype=bool)



class _Blocked:
    """Per thread of a CPU-only rank, the time it spends in collective CPU calls and their waits:
    the union of its ``c10d::*`` / ``nccl:*`` / ``rccl:*`` / ``record_param_comms`` ops (``c10d::wait``
    and the issuing calls included; not the ``gloo:*`` spans, which are communication rows: gloo's
    ``gloo:send``/``recv`` on the caller's thread last while an async transfer is in flight, and the
    caller computes meanwhile), as islands ``[s, e)`` sorted by start.

    ``ops``: rows (device, track, ts_ns, end_ns). Islands merge only intervals that overlap
    (start < the running end), so touching ones stay apart and :meth:`meets` gives the same answer
    as testing every op.
    """

    def __init__(self, ops: np.ndarray):
        self.by_thread: dict = {}  # (device, track) → (starts, ends) of its islands
        if not len(ops):
            return
        ops = ops[np.lexsort((ops[:, 3], ops[:, 2], ops[:, 1], ops[:, 0]))]
        for key in {(int(d), int(t)) for d, t in ops[:, :2].tolist()}:
            m = np.flatnonzero((ops[:, 0] == key[0]) & (ops[:, 1] == key[1]))
            s, e = ops[m, 2], ops[m, 3]
            running = np.maximum.accumulate(e)
            new = np.ones(len(m), dtype=bool)
            new[1:] = s[1:] >= running[:-1]
            starts = s[new]
            ends = np.maximum.reduceat(running, np.flatnonzero(new))
            self.by_thread[key] = (starts, ends)

    def meets(self, dev, trk, ok, ts, end) -> np.ndarray:
        """Per row (``ok``: device and track known): whether ``[ts, end)`` meets an island of its
        thread, i.e. ``ts < island end`` and ``island start < end`` (an op inside a call, around
        it, or across one of its ends)."""
        out = np.zeros(len(ts), dtype=bool)
        for (d, t), (cs, ce) in self.by_thread.items():
            m = np.flatnonzero(ok & (dev == d) & (trk == t))
            if len(m):
                i = np.searchsorted(cs, end[m], side="left") - 1  # the last island starting before end
                out[m] = (i >= 0) & (ce[np.maximum(i, 0)] > ts[m])
        return out


class _Tables:
    """What scan one keeps for the writing scan: per GPU op (in file order, the order the writing
    scan meets them again) the next op's start on its stream; per correlation id its best launch
    call; and, on CPU-only traces, the comm threads (a few)."""

    def __init__(self, scan, cpu_only: bool):
        cat_cache: dict = {}
        name_cache: dict = {}
        kind_cache: dict = {}
        streams: dict = {}
        threads: set = set()
        self.has_gloo = False  # a CPU-only rank with gloo:* spans (then they are its communication)
        calls: list = []  # CPU-only: collective CPU ops (device, track, ts, dur, event_id)
        blocked: list = []  # CPU-only: collective CPU calls and waits (device, track, ts, end)
        self._sizes: list = []  # per batch: its GPU ops
        op_stream, op_ts = [], []  # per GPU op, in file order
        l_corr, l_kind, l_eid, l_ts = [], [], [], []  # per launch call with a correlation id
        cols = ["event_id", "track_kind", "device", "track", "category", "name", "ts_ns", "dur_ns", "correlation",
                "is_comm"]
        for b in scan(cols):
            n = b.num_rows
            cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
            gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), kind_cache).astype(bool)
            g = _gpu_ops(gpu, cat)
            k = int(g.sum())
            self._sizes.append(k)
            if k:
                st, ts = _streams_and_starts(b, g, streams)
                op_stream.append(st)
                op_ts.append(ts)
            corr, corr_ok = _ints(b.column("correlation"))
            m = ((cat & _C_LAUNCH) > 0) & _all_valid(corr_ok, n)
            if m.any():
                l_corr.append(corr[m])
                l_kind.append(np.where((cat[m] & _C_RUNTIME) > 0, 0, 1).astype(np.int8))
                l_eid.append(_ints(b.column("event_id"))[0][m])
                l_ts.append(_ints(b.column("ts_ns"))[0][m])
            if cpu_only:
                dev, dev_ok = _ints(b.column("device"))
                trk, trk_ok = _ints(b.column("track"))
                comm = _ints(b.column("is_comm"))[0]
                nb = _lut(b.column("name"), _name_bits, name_cache)
                t = comm & ~gpu & ((nb & (_N_GLOO_P2P | _N_NULL)) == 0)
                t &= _all_valid(dev_ok, n) & _all_valid(trk_ok, n)
                if t.any():
                    threads.update(zip(dev[t].tolist(), trk[t].tolist()))
                self.has_gloo |= bool((comm & ~gpu).any())
                known = ~gpu & _all_valid(dev_ok, n) & _all_valid(trk_ok, n)
                ts, dur = _ints(b.column("ts_ns"))[0], _ints(b.column("dur_ns"))[0]
                c = ~comm.astype(bool) & known & ((nb & _N_CALL) > 0)
                if c.any():
                    calls.append(np.stack([dev[c], trk[c], ts[c], dur[c],
                                           _ints(b.column("event_id"))[0][c]], axis=1).astype(np.int64))
                c = ~comm.astype(bool) & known & ((nb & _N_COLLECTIVE_CPU) > 0)
                if c.any():
                    blocked.append(np.stack([dev[c], trk[c], ts[c], ts[c] + dur[c]], axis=1).astype(np.int64))
        self.comm_threads = threads
        self.calls = _CpuCalls(_concat(calls, np.int64).reshape(-1, 5) if calls and not self.has_gloo else None)
        self.blocked = _Blocked(_concat(blocked, np.int64).reshape(-1, 4))
        # next starts: the ops in (stream, start, file order) — lexsort is stable — and an op's
        # next op is the one after it in that order on the same stream
        st, ts = _concat(op_stream, np.int32), _concat(op_ts, np.int64)
        del op_stream, op_ts
        order = np.lexsort((ts, st))
        same = st[order[1:]] == st[order[:-1]]
        self._next = np.zeros(len(st), dtype=np.int64)
        self._has = np.zeros(len(st), dtype=bool)
        self._next[order[:-1][same]] = ts[order[1:][same]]
        self._has[order[:-1][same]] = True
        del st, ts, order, same
        self._batch = self._at = 0  # batches and GPU ops handed out so far (see next_of)
        # launch calls: per correlation id, a runtime call before a driver one, then the lowest event_id
        corr, kind, eid, lts = (_concat(x, d) for x, d in ((l_corr, np.int64), (l_kind, np.int8),
                                                          (l_eid, np.int64), (l_ts, np.int64)))
        del l_corr, l_kind, l_eid, l_ts
        o = np.lexsort((eid, kind, corr))
        corr = corr[o]
        first = np.ones(len(o), dtype=bool)
        first[1:] = corr[1:] != corr[:-1]
        self.l_corr, self.l_eid, self.l_ts = corr[first], eid[o[first]], lts[o[first]]

    def launch_of(self, corr: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, launch event_id, launch ts) per correlation id (``ok``: rows to look up)."""
        n = len(self.l_corr)
        if n == 0:
            z = np.zeros(len(corr), dtype=np.int64)
            return np.zeros(len(corr), dtype=bool), z, z
        i = np.minimum(np.searchsorted(self.l_corr, corr), n - 1)
        found = ok & (self.l_corr[i] == corr)
        return found, np.where(found, self.l_eid[i], 0), np.where(found, self.l_ts[i], 0)

    def next_of(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(has a next op, its start) per row of a batch whose GPU ops are ``g``; batches must come
        in the order of scan one."""
        k = int(g.sum())
        if self._batch >= len(self._sizes) or self._sizes[self._batch] != k:
            raise RuntimeError("the staging file's batches changed between scans")
        self._batch += 1
        has_next = np.zeros(len(g), dtype=bool)
        out = np.zeros(len(g), dtype=np.int64)
        has_next[g] = self._has[self._at:self._at + k]
        out[g] = self._next[self._at:self._at + k]
        self._at += k
        return has_next, out


def _scanner(raw: str | Path):
    """``scan(columns)`` → the record batches of a staging file (Arrow IPC stream), with only
    ``columns`` (all for None)."""

    def scan(columns):
        with pa.OSFile(str(raw)) as fh:
            for b in pa.ipc.open_stream(fh):
                yield b if columns is None else b.select(columns)

    return scan


def link_rank(raw: str | Path, out: Path, run_id: str, rank: int, cpu_only: bool, steps,
              writer_cls=_BatchWriter, pdl: bool = False) -> LinkResult:
    """Write ``out`` (EVENTS_SCHEMA, zstd level 1, row groups of at most EVENTS_ROW_GROUP rows)
    from the staging file ``raw``; see the module docstring. Returns the :class:`LinkResult`.

    ``steps``: (step, event_id, start_ns, end_ns) of the rank's ProfilerStep windows.
    ``pdl``: the rank's GPU runs programmatic dependent launch (:func:`supports_pdl`): an op that
    overlaps the next on its stream is kept whole and counted, never clipped.
    ``writer_cls``: a batch writer (``staging._BatchWriter``) called as
    ``writer_cls(path, schema, parquet_options, row_group_size=...)``, used as a context
    manager with ``write(batch)``. Errors of the staging file (OSError, ArrowInvalid) propagate.
    """
    scan = _scanner(raw)
    tab = _Tables(scan, cpu_only)
    order = sorted(steps, key=lambda s: (s[2], s[0]))
    st_num = np.array([s[0] for s in order], dtype=np.int64)
    st_start = np.array([s[2] for s in order], dtype=np.int64)
    st_end = np.array([s[3] for s in order], dtype=np.int64)
    res = LinkResult()
    span_eid, span_ts, span_dur = [], [], []  # comm rows
    cl_launch, cl_eid = [], []  # comm rows with a launch call: (launch event_id, event_id)
    cat_cache: dict = {}
    name_cache: dict = {}
    kind_cache: dict = {}
    class_dict = pa.array(list(CLASSES), pa.string())
    run_dict = pa.array([run_id], pa.string())
    with writer_cls(out, _WRITE_SCHEMA, dict(compression="zstd", compression_level=1, store_schema=False),
                    row_group_size=EVENTS_ROW_GROUP) as w:
        for b in scan(None):
            n = b.num_rows
            eid = _ints(b.column("event_id"))[0]
            ts = _ints(b.column("ts_ns"))[0]
            dur = _ints(b.column("dur_ns"))[0]
            gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), kind_cache).astype(bool)
            cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
            nb = _lut(b.column("name"), _name_bits, name_cache)
            corr, corr_ok = _ints(b.column("correlation"))
            comm = _ints(b.column("is_comm"))[0].astype(bool)

            found, l_eid, l_ts = tab.launch_of(corr, gpu & _all_valid(corr_ok, n))
            has_next, nxt = tab.next_of(_gpu_ops(gpu, cat))
            end = ts + dur
            overlap = has_next & (end > nxt)
            clipped = overlap & (end - nxt > CLIP_TOLERANCE_NS) & (not pdl)
            clipped_ns = np.where(clipped, end - np.maximum(nxt, ts), 0)
            res.same_stream_overlaps += int((overlap & ~clipped).sum())
            res.gpu_events += int(gpu.sum())
            step_ts = np.where(found, l_ts, ts)

            if len(st_start):
                si = np.searchsorted(st_start, step_ts, side="right") - 1
                sc = np.maximum(si, 0)
                step_ok = (si >= 0) & (step_ts < st_end[sc])
                step = st_num[sc]
            else:
                step_ok = np.zeros(n, dtype=bool)
                step = np.zeros(n, dtype=np.int64)

            cpu_compute = np.zeros(n, dtype=bool)
            cpu_call = np.zeros(n, dtype=bool)
            if cpu_only:
                on_thread = np.zeros(n, dtype=bool)
                dev, dev_ok = _ints(b.column("device"))
                trk, trk_ok = _ints(b.column("track"))
                ok = ~gpu & _all_valid(dev_ok, n) & _all_valid(trk_ok, n)
                for d, t in tab.comm_threads:
                    on_thread |= ok & (dev == d) & (trk == t)
                if len(tab.calls.ids):
                    cpu_call = tab.calls.is_call(eid)
                on_thread |= tab.blocked.meets(dev, trk, ok, ts, ts + dur)
                cpu_compute = ((cat & _C_CPU_OP) > 0) & ~on_thread & ((nb & (_N_COLLECTIVE_CPU | _N_NULL)) == 0)
            cls = np.select(
                [
                    comm | cpu_call | (cpu_only & ((nb & _N_CPU_ONLY_COMM) > 0)),
                    ((cat & _C_SYNC) > 0) | ((nb & _N_SYNC) > 0),
                    (cat & _C_KERNEL) > 0,
                    (cat & _C_MEMORY) > 0,
                    gpu,
                    cpu_compute,
                ],
                [_COMM, _SYNC, _COMPUTE, _MEMORY, _OTHER, _COMPUTE],
                _CPU,
            ).astype(np.int32)

            new_dur = dur - clipped_ns
            is_comm_cls = cls == _COMM
            if is_comm_cls.any():
                span_eid.append(eid[is_comm_cls])
                span_ts.append(ts[is_comm_cls])
                span_dur.append(new_dur[is_comm_cls])
                cl = is_comm_cls & found
                if cl.any():
                    cl_launch.append(l_eid[cl])
                    cl_eid.append(eid[cl])
            if clipped.any():
                res.n_clipped += int(clipped.sum())
                mc = int(clipped_ns[clipped].max())
                res.max_clip_ns = mc if res.max_clip_ns is None else max(res.max_clip_ns, mc)
            skew = gpu & found & (ts < l_ts)
            if skew.any():
                res.n_skew += int(skew.sum())
                ms = int((l_ts[skew] - ts[skew]).max())
                res.max_skew_ns = ms if res.max_skew_ns is None else max(res.max_skew_ns, ms)
            if n:
                lo, hi = int(ts.min()), int((ts + new_dur).max())
                res.ts_lo = lo if res.ts_lo is None else min(res.ts_lo, lo)
                res.ts_hi = hi if res.ts_hi is None else max(res.ts_hi, hi)

            cols = [
                pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), run_dict),
                pa.array(np.full(n, rank, dtype=np.int32)),
                b.column("event_id"),
                b.column("track_kind"),
                b.column("device"),
                b.column("track"),
                b.column("category"),
                b.column("name"),
                b.column("ts_ns"),
                pa.array(new_dur, pa.int64()),
                b.column("correlation"),
                b.column("external_id"),
                pa.array(l_eid, pa.int64(), mask=~found),
                pa.DictionaryArray.from_arrays(pa.array(cls), class_dict),
                pa.array(step, pa.int64(), mask=~step_ok),
                pa.array(clipped),
                pa.array(clipped_ns, pa.int64()),
            ]
            w.write(pa.RecordBatch.from_arrays(cols, schema=_WRITE_SCHEMA))
    res.cpu_calls = tab.calls.ids
    del tab
    res.spans = ById(_concat(span_eid, np.int64), [_concat(span_ts, np.int64), _concat(span_dur, np.int64)],
                     [None, None])  # event ids ascend in the file
    res.launches = _launch_rows(scan, _concat(cl_launch, np.int64), _concat(cl_eid, np.int64))
    return res


def _launch_rows(scan, launch_eid: np.ndarray, of_eid: np.ndarray) -> ById:
    """The launch call (pid, tid, ts, end) of each comm GPU row ``of_eid`` (its call: ``launch_eid``),
    from a scan of five columns (staging rows come in event_id order), by the comm row's event_id."""
    if not len(launch_eid):
        return _empty(4)
    o = np.argsort(launch_eid, kind="stable")
    want, of = launch_eid[o], of_eid[o]
    got_of, pid, pv, tid, tv, lts, lend = [], [], [], [], [], [], []
    for b in scan(["event_id", "device", "track", "ts_ns", "dur_ns"]):
        eid = _ints(b.column("event_id"))[0]
        if not len(eid):
            continue
        a, z = np.searchsorted(want, eid[0], side="left"), np.searchsorted(want, eid[-1], side="right")
        if a >= z:
            continue
        w, k = want[a:z], of[a:z]
        i = np.minimum(np.searchsorted(eid, w), len(eid) - 1)
        hit = eid[i] == w
        i, k = i[hit], k[hit]
        n = len(eid)
        dev, dev_ok = _ints(b.column("device"))
        trk, trk_ok = _ints(b.column("track"))
        ts = _ints(b.column("ts_ns"))[0]
        dur = _ints(b.column("dur_ns"))[0]
        got_of.append(k)
        pid.append(dev[i])
        pv.append(_all_valid(dev_ok, n)[i])
        tid.append(trk[i])
        tv.append(_all_valid(trk_ok, n)[i])
        lts.append(ts[i])
        lend.append(ts[i] + dur[i])
    k = _concat(got_of, np.int64)
    o = np.argsort(k, kind="stable")
    cols = [_concat(x, np.int64)[o] for x in (pid, tid, lts, lend)]
    pv, tv = _concat(pv, bool)[o], _concat(tv, bool)[o]
    return ById(k[o], cols, [None if pv.all() else pv, None if tv.all() else tv, None, None])
