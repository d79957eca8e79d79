"""The link pass of one rank: staging rows → final ``events`` rows, streamed batch by batch.

Input: the staging file a reader wrote (an Arrow IPC stream of ``staging.RAW_SCHEMA``
rows, in file order). Output: ``events/rank=R.parquet`` (``store.EVENTS_SCHEMA``, same
order), plus what the collectives builder needs (:class:`LinkResult`). Per row:

* ``launch_event_id`` — a GPU-stream row's runtime launch call: among the rows of
  category ``runtime`` or ``driver`` with the same correlation id, a ``runtime`` one
  before a ``driver`` one, then the lowest event_id;
* ``clipped`` / ``clipped_ns`` / ``dur_ns`` — a kernel, memcpy or memset that runs
  past the start of the next such op on its GPU stream (order: ts, then event_id)
  by more than :data:`CLIP_TOLERANCE_NS` is cut to that start (a clock artefact:
  one stream runs one op at a time); ``dur_ns`` is the cut duration;
* ``class`` (DESIGN.md, "Classifying events"), first rule that holds: ``comm`` for
  communication rows (``is_comm``: comm kernels, ``gloo:*`` spans) and, on CPU-only
  traces, the blocking ``c10d::send``/``recv_`` calls; ``sync`` for category
  ``sync`` or a Stream/Event/Device/Context synchronize call (:data:`SYNC_NAME`);
  ``compute`` for kernels; ``memory`` for memcpy/memset; ``other`` for the rest of
  the GPU streams; on CPU-only traces ``compute`` for ``cpu_op`` rows of threads that
  run no gloo work, other than ``c10d::*``/``nccl:*``/``gloo:*``/``record_param_comms``;
  ``cpu`` for everything else;
* ``step`` — the ``ProfilerStep#N`` window ``[start, end)`` that starts last at or
  before the row's time (a GPU row's launch time when it has a launch), if the time
  is before that window's end; else null.

Memory: the staging file is scanned four times, a batch at a time (the reader's
batches, ~40k rows); what is kept between scans is never the rows but, per GPU op,
the next op's start (9 B) and, per GPU row with a correlation id, its launch call
(~32 B), each in a table of at most ``tracekit.spill.STATE_BUDGET`` bytes that spills to
the staging directory beyond it (:class:`_Tables`). The next starts need no sort when
every stream's ops are in start order in the file (they are resolved during the first
scan); when one is not, the ops' (stream, start, position) go through an external sort.
Scans: GPU ops; their launch calls; the rows written; the launch calls of the comm
kernels (their thread and duration). The comm rows' spans and launch calls, which the
collectives need, go to files (:class:`LinkResult`).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracekit import _arrow
from tracekit._memory import release_free_memory
from tracekit import spill
from tracekit.spill import ExternalSort, PositionStore, SortedColumns
from tracekit.store import EVENTS_SCHEMA

SYNC_NAME = re.compile(
    r"(stream|event|device|context)synchronize|cuda_sync|hip(stream|event|device)synchronize", re.I | re.A
)
"""CPU calls that wait for the GPU, by name (searched anywhere in the name; ASCII case folding only,
so ``ſ`` is not an ``s``)."""

CLIP_TOLERANCE_NS = 100
"""Overlaps of consecutive GPU ops on one stream up to this are clock noise, not clipped."""

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
_COLLECTIVE_CPU = ("c10d::", "nccl:", "gloo:")

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
}
# name → bits
_N_CPU_ONLY_COMM, _N_SYNC, _N_COLLECTIVE_CPU, _N_NULL, _N_GLOO_P2P = 1, 2, 4, 8, 16


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
    return bits


def _empty_sorted(ncols: int) -> SortedColumns:
    return SortedColumns([np.int64] * ncols, tempfile.gettempdir())  # never written: no file


@dataclass
class LinkResult:
    """What the link pass of one rank found besides the rows it wrote.

    ``spans``: comm rows by event_id → (ts_ns, dur_ns after clipping). ``launches``: comm
    GPU rows by event_id → (pid, tid, launch ts_ns, launch end ns) of their launch call. Both
    are :class:`tracekit.spill.SortedColumns` (in files beside the staging file: call
    :meth:`close` when done). ``n_clipped``/``max_clip_ns``: GPU ops cut to the next op's start,
    and the largest cut. ``n_skew``/``max_skew_ns``: GPU rows that start before their
    launch call, and the largest such gap. ``ts_lo``/``ts_hi``: the rank's first start
    and last end (ns), None when it has no rows.
    """

    spans: SortedColumns = field(default_factory=lambda: _empty_sorted(2))
    launches: SortedColumns = field(default_factory=lambda: _empty_sorted(4))
    n_clipped: int = 0
    max_clip_ns: int | None = None
    n_skew: int = 0
    max_skew_ns: int | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None

    def close(self) -> None:
        """Remove the files of ``spans`` and ``launches``."""
        self.spans.close()
        self.launches.close()


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
    idx, ok = _arrow.to_numpy(col.indices)
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
    dev, dev_ok = _arrow.to_numpy(b.column("device"))
    trk, trk_ok = _arrow.to_numpy(b.column("track"))
    dv, tv = _arrow.all_valid(dev_ok, n), _arrow.all_valid(trk_ok, n)
    return _stream_ids(streams, dev[g], dv[g], trk[g], tv[g]), _arrow.to_numpy(b.column("ts_ns"))[0][g]


def _gpu_ops(gpu: np.ndarray, cat: np.ndarray) -> np.ndarray:
    """Rows that are GPU ops for clipping: kernels, memcpy and memset on a GPU stream."""
    return gpu & ((cat & _C_GPU_OP) > 0)


_LAUNCH_BYTES_PER_ROW = 32
"""What the in-memory launch table costs per GPU row with a correlation id (ids, their sorted
copy, the best call's event_id, start and kind)."""


class _Tables:
    """What the first two scans keep for the writing scan, in at most about ``tracekit.spill.STATE_BUDGET`` bytes
    per table: per GPU op (in file order, the order the writing scan meets them again) the next
    op's start on its stream; per GPU row with a correlation id its launch call; and the comm
    threads (a few).

    Next starts (a :class:`~tracekit.spill.PositionStore` by GPU op): resolved during scan one
    when every stream's ops run in start order in the file (a stream's last op waits for the
    stream's next op, in a later batch or never), as in our TP fixture, the DLRM and B200
    traces; else (the HTA sample traces each have a stream that steps back once) by an
    external sort of (stream, start, position) (:meth:`_sorted_next`), fed from the first
    backward step on and by a re-read of the batches before it.

    Launch calls: while the GPU rows' correlation ids fit in the budget, scan two keeps, per
    distinct id, the best launch call in place (other runtime calls are never kept). Beyond
    it, scan two sorts the GPU rows and every launch call together by correlation id
    (:meth:`_sorted_launches`) and the best call per id goes to a PositionStore by GPU row.
    """

    def __init__(self, scan, cpu_only: bool, scratch: Path):
        cat_cache: dict = {}
        name_cache: dict = {}
        kind_cache: dict = {}
        streams: dict = {}
        gcorr: list = []
        n_gcorr = 0
        keep_gcorr = True
        threads: set = set()
        self.scratch = scratch
        self._launch = None  # a PositionStore when the launch calls did not fit the budget
        self._next = PositionStore([np.int64, np.bool_], spill.STATE_BUDGET, scratch, "next")
        self._sizes: list = []  # per batch: its GPU ops
        pending: dict = {}  # stream → (position, start) of its last op so far
        n_ops = 0
        in_order = True
        first_unsorted = 0  # the batch where a stream's starts first went backwards
        sort = None
        cols = ["track_kind", "device", "track", "category", "name", "ts_ns", "correlation", "is_comm"]
        for bi, b in enumerate(scan(cols)):
            n = b.num_rows
            cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
            gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), kind_cache).astype(bool)
            corr, corr_ok = _arrow.to_numpy(b.column("correlation"))
            gc = gpu & _arrow.all_valid(corr_ok, n)
            k = int(gc.sum())
            if k:
                n_gcorr += k
                if keep_gcorr:
                    gcorr.append(corr[gc])
                    if n_gcorr * _LAUNCH_BYTES_PER_ROW > spill.STATE_BUDGET:
                        keep_gcorr, gcorr = False, []
            dev, dev_ok = _arrow.to_numpy(b.column("device"))
            trk, trk_ok = _arrow.to_numpy(b.column("track"))
            g = _gpu_ops(gpu, cat)
            k = int(g.sum())
            self._sizes.append(k)
            if k:
                st, ts = _streams_and_starts(b, g, streams)
                pos = np.arange(n_ops, n_ops + k, dtype=np.int64)
                if in_order and not self._link_batch(st, ts, pos, pending):
                    in_order, first_unsorted = False, bi
                    self._next.close()
                    sort = ExternalSort([np.int32, np.int64, np.int64], 3, spill.STATE_BUDGET, scratch, "nextsort")
                if not in_order:  # from here on the ops go to the sort
                    sort.add(st, ts, pos)
                n_ops += k
            if cpu_only:
                comm = _arrow.to_numpy(b.column("is_comm"))[0]
                nb = _lut(b.column("name"), _name_bits, name_cache)
                t = comm & ~gpu & ((nb & (_N_GLOO_P2P | _N_NULL)) == 0)
                t &= _arrow.all_valid(dev_ok, n) & _arrow.all_valid(trk_ok, n)
                if t.any():
                    threads.update(zip(dev[t].tolist(), trk[t].tolist()))
        self.comm_threads = threads
        if not in_order:  # some stream's ops are out of start order in the file: sort them all
            try:
                self._next = PositionStore([np.int64, np.bool_], spill.STATE_BUDGET, scratch, "next")
                self._head_ops(scan, streams, first_unsorted, sort)
                self._sorted_next(sort)
            finally:
                sort.close()
        self._batch = 0  # batches handed out so far (see next_of)
        if not keep_gcorr:
            del gcorr
            self._sorted_launches(scan, cat_cache)
            return
        # launch calls: one per correlation id some GPU row carries (runtime before driver, then the lowest event_id)
        wanted = np.concatenate(gcorr) if gcorr else np.empty(0, dtype=np.int64)
        del gcorr
        wanted.sort()  # in place, then the distinct ids compacted in place: no second copy
        if len(wanted):
            keep = np.ones(len(wanted), dtype=bool)
            keep[1:] = wanted[1:] != wanted[:-1]
            m = int(keep.sum())
            wanted[:m] = wanted[keep]
            wanted = wanted[:m]
            del keep
        rank = np.full(len(wanted), 2, dtype=np.int8)  # 0 runtime, 1 driver, 2 none yet
        l_eid = np.zeros(len(wanted), dtype=np.int64)
        l_ts = np.zeros(len(wanted), dtype=np.int64)
        if len(wanted):
            for b in scan(["event_id", "category", "ts_ns", "correlation"]):
                cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
                m = (cat & _C_LAUNCH) > 0
                if not m.any():
                    continue
                corr, corr_ok = _arrow.to_numpy(b.column("correlation"))
                if corr_ok is not None:
                    m &= corr_ok
                pos = np.minimum(np.searchsorted(wanted, corr), len(wanted) - 1)
                m &= wanted[pos] == corr
                if not m.any():
                    continue
                # the batch's best row per id: rows are in event_id order, so a stable sort on (id, rank)
                r = np.where((cat[m] & _C_RUNTIME) > 0, 0, 1).astype(np.int8)
                p, e, t = pos[m], _arrow.to_numpy(b.column("event_id"))[0][m], _arrow.to_numpy(b.column("ts_ns"))[0][m]
                o = np.lexsort((r, p))
                p, r, e, t = p[o], r[o], e[o], t[o]
                first = np.ones(len(p), dtype=bool)
                first[1:] = p[1:] != p[:-1]
                p, r, e, t = p[first], r[first], e[first], t[first]
                better = r < rank[p]  # an earlier batch's row of the same rank has the lower event_id
                rank[p[better]], l_eid[p[better]], l_ts[p[better]] = r[better], e[better], t[better]
        keep = rank < 2
        self.l_corr, self.l_eid, self.l_ts = wanted[keep], l_eid[keep], l_ts[keep]

    def close(self) -> None:
        """Remove the tables' files (if they spilled)."""
        self._next.close()
        if self._launch is not None:
            self._launch.close()

    def launch_of(self, corr: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, launch event_id, launch ts) per correlation id (``ok``: rows to look up: a batch's
        GPU rows with a correlation id; batches must come in the order of the scans)."""
        if self._launch is not None:
            f, e, t = self._launch.take(int(ok.sum()))
            found = np.zeros(len(corr), dtype=bool)
            l_eid = np.zeros(len(corr), dtype=np.int64)
            l_ts = np.zeros(len(corr), dtype=np.int64)
            found[ok], l_eid[ok], l_ts[ok] = f, e, t
            return found, l_eid, l_ts
        n = len(self.l_corr)
        if n == 0:
            z = np.zeros(len(corr), dtype=np.int64)
            return np.zeros(len(corr), dtype=bool), z, z
        i = np.minimum(np.searchsorted(self.l_corr, corr), n - 1)
        found = ok & (self.l_corr[i] == corr)
        return found, self.l_eid[i], self.l_ts[i]

    def next_of(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(has a next op, its start) per row of a batch whose GPU ops are ``g``; batches must come
        in the order of the first scan."""
        k = int(g.sum())
        if self._batch >= len(self._sizes) or self._sizes[self._batch] != k:
            raise RuntimeError("the staging file's batches changed between scans")
        self._batch += 1
        nxt, has = self._next.take(k)
        has_next = np.zeros(len(g), dtype=bool)
        out = np.zeros(len(g), dtype=np.int64)
        has_next[g] = has
        out[g] = nxt
        return has_next, out

    def _link_batch(self, st: np.ndarray, ts: np.ndarray, pos: np.ndarray, pending: dict) -> bool:
        """Put the next starts of a batch's GPU ops (streams ``st``, starts ``ts``, positions
        ``pos``) that the batch holds, and those of the streams' pending ops from earlier
        batches; each stream's last op becomes its pending one. False (nothing put) when a
        stream's starts go backwards in file order."""
        order = np.argsort(st, kind="stable")  # by stream; within one, file order
        s, t = st[order], ts[order]
        same = s[1:] == s[:-1]
        if (t[1:][same] < t[:-1][same]).any():
            return False
        heads = np.flatnonzero(np.r_[True, ~same])
        tails = np.r_[heads[1:], len(order)] - 1
        patch_pos, patch_ts, tails_of = [], [], {}
        for h, e in zip(heads.tolist(), tails.tolist()):
            stream, first = int(s[h]), int(t[h])
            prev = pending.get(stream)
            if prev is not None:
                if first < prev[1]:
                    return False
                patch_pos.append(prev[0])
                patch_ts.append(first)
            tails_of[stream] = (int(pos[order[e]]), int(t[e]))
        nxt = np.zeros(len(st), dtype=np.int64)
        has = np.zeros(len(st), dtype=bool)
        inner = order[:-1][same]
        nxt[inner] = t[1:][same]
        has[inner] = True
        self._next.put(pos, nxt, has)
        if patch_pos:
            self._next.put(np.array(patch_pos, dtype=np.int64), np.array(patch_ts, dtype=np.int64),
                           np.ones(len(patch_pos), dtype=bool))
        pending.update(tails_of)
        return True

    def _head_ops(self, scan, streams: dict, upto: int, sort: ExternalSort) -> None:
        """Add to ``sort`` the (stream, start, position) of the GPU ops of the batches before
        ``upto`` (a re-read of five columns, stopped at batch ``upto``)."""
        at = 0
        for bi, b in enumerate(scan(["track_kind", "device", "track", "category", "ts_ns"])):
            if bi >= upto:
                break
            cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), {})
            gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), {}).astype(bool)
            g = _gpu_ops(gpu, cat)
            k = int(g.sum())
            if k != self._sizes[bi]:
                raise RuntimeError("the staging file's batches changed between scans")
            if k:
                st, ts = _streams_and_starts(b, g, streams)
                sort.add(st, ts, np.arange(at, at + k, dtype=np.int64))
            at += k

    def _sorted_next(self, sort: ExternalSort) -> None:
        """Next starts from the GPU ops in (stream, start, file order): an op's next op is the one
        after it in that order on the same stream (ties in start: file order)."""
        carry = None  # (stream, position) of the last op of the previous batch
        for st, ts, pos in sort.batches():
            same = st[1:] == st[:-1]
            nxt = np.zeros(len(st), dtype=np.int64)
            has = np.zeros(len(st), dtype=bool)
            nxt[:-1][same] = ts[1:][same]
            has[:-1][same] = True
            self._next.put(pos, nxt, has)
            if carry is not None and carry[0] == int(st[0]):
                self._next.put(np.array([carry[1]], dtype=np.int64), ts[:1], np.ones(1, dtype=bool))
            carry = (int(st[-1]), int(pos[-1]))

    def _sorted_launches(self, scan, cat_cache: dict) -> None:
        """The launch call of every GPU row with a correlation id, when their ids do not fit the
        budget: one scan adds (id, kind, tie, value) rows to an external sort — per GPU row
        (id, 2, its position among those rows, 0), per launch call (id, 0 for runtime or 1 for
        driver, event_id, start) — and in that order the first row of an id is its best call
        (runtime before driver, then the lowest event_id) when it is a call."""
        sort = ExternalSort([np.int64, np.int8, np.int64, np.int64], 3, spill.STATE_BUDGET, self.scratch, "launchsort")
        kind_cache: dict = {}
        self._launch = PositionStore([np.bool_, np.int64, np.int64], spill.STATE_BUDGET, self.scratch, "launch")
        try:
            at = 0
            for b in scan(["event_id", "track_kind", "category", "ts_ns", "correlation"]):
                n = b.num_rows
                cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
                gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), kind_cache).astype(bool)
                corr, corr_ok = _arrow.to_numpy(b.column("correlation"))
                ok = _arrow.all_valid(corr_ok, n)
                gc = gpu & ok
                k = int(gc.sum())
                if k:
                    sort.add(corr[gc], np.full(k, 2, dtype=np.int8), np.arange(at, at + k, dtype=np.int64),
                             np.zeros(k, dtype=np.int64))
                    at += k
                m = ((cat & _C_LAUNCH) > 0) & ok
                if m.any():
                    sort.add(corr[m], np.where((cat[m] & _C_RUNTIME) > 0, 0, 1).astype(np.int8),
                             _arrow.to_numpy(b.column("event_id"))[0][m], _arrow.to_numpy(b.column("ts_ns"))[0][m])
            cur = None  # (id, found, event_id, start) of the id open at the end of the previous batch
            for corr, kind, tie, val in sort.batches():
                n = len(corr)
                start = np.ones(n, dtype=bool)
                start[1:] = corr[1:] != corr[:-1]
                head = np.maximum.accumulate(np.where(start, np.arange(n), 0))
                found, e, t = kind[head] < 2, tie[head], val[head]
                if cur is not None and cur[0] == int(corr[0]):  # the first id continues from the previous batch
                    first = head == 0
                    found[first], e[first], t[first] = cur[1], cur[2], cur[3]
                g = kind == 2
                f = found[g]
                self._launch.put(tie[g], f, np.where(f, e[g], 0), np.where(f, t[g], 0))
                cur = (int(corr[-1]), bool(found[-1]), int(e[-1]), int(t[-1]))
        finally:
            sort.close()


def _scanner(raw: str | Path):
    """``scan(columns)`` → the record batches of a staging file (Arrow IPC stream), with only
    ``columns`` (all for None)."""

    def scan(columns):
        with pa.OSFile(str(raw)) as fh:
            for b in pa.ipc.open_stream(fh):
                yield b if columns is None else b.select(columns)

    return scan


def link_rank(raw: str | Path, out: Path, run_id: str, rank: int, cpu_only: bool, steps, writer_cls) -> LinkResult:
    """Write ``out`` (EVENTS_SCHEMA, zstd level 1, row groups of at most EVENTS_ROW_GROUP rows)
    from the staging file ``raw``; see the module docstring. Returns the :class:`LinkResult`.

    ``steps``: (step, event_id, start_ns, end_ns) of the rank's ProfilerStep windows.
    ``writer_cls``: a batch writer (``staging._BatchWriter``) called as
    ``writer_cls(path, schema, parquet_options, row_group_size=...)``, used as a context
    manager with ``write(batch)``. Tables beyond spill.STATE_BUDGET spill next to ``raw`` (removed
    before returning). Errors of the staging file (OSError, ArrowInvalid) propagate.
    """
    scan = _scanner(raw)
    tab = _Tables(scan, cpu_only, Path(raw).parent)
    try:
        return _write_rank(scan, tab, out, run_id, rank, cpu_only, steps, writer_cls)
    finally:
        tab.close()


def _write_rank(scan, tab: "_Tables", out: Path, run_id: str, rank: int, cpu_only: bool, steps, writer_cls) -> LinkResult:
    """The writing scan of :func:`link_rank` and the launch rows of its comm rows."""
    res = LinkResult()
    try:
        return _write_rows(scan, tab, res, out, run_id, rank, cpu_only, steps, writer_cls)
    except BaseException:
        res.close()
        raise


def _write_rows(scan, tab: "_Tables", res: LinkResult, out: Path, run_id: str, rank: int, cpu_only: bool, steps,
                writer_cls) -> LinkResult:
    release_free_memory()  # the tables' sort buffers, before the writing scan allocates
    order = sorted(steps, key=lambda s: (s[2], s[0]))
    st_num = np.array([s[0] for s in order], dtype=np.int64)
    st_start = np.array([s[2] for s in order], dtype=np.int64)
    st_end = np.array([s[3] for s in order], dtype=np.int64)
    scratch = tab.scratch
    comm_launch = ExternalSort([np.int64, np.int64], 2, spill.STATE_BUDGET, scratch, "commlaunch")
    # (launch event_id, event_id) of comm rows with a launch call
    res.spans = SortedColumns([np.int64, np.int64], scratch, "spans")  # (ts, dur) of comm rows
    cat_cache: dict = {}
    name_cache: dict = {}
    kind_cache: dict = {}
    class_dict = _arrow.string_array(list(CLASSES))
    run_dict = _arrow.string_array([run_id])
    with writer_cls(out, _WRITE_SCHEMA, dict(compression="zstd", compression_level=1, store_schema=False),
                    row_group_size=EVENTS_ROW_GROUP) as w:
        for b in scan(None):
            n = b.num_rows
            eid = _arrow.to_numpy(b.column("event_id"))[0]
            ts = _arrow.to_numpy(b.column("ts_ns"))[0]
            dur = _arrow.to_numpy(b.column("dur_ns"))[0]
            gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), kind_cache).astype(bool)
            cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
            nb = _lut(b.column("name"), _name_bits, name_cache)
            corr, corr_ok = _arrow.to_numpy(b.column("correlation"))
            comm = _arrow.to_numpy(b.column("is_comm"))[0]

            found, l_eid, l_ts = tab.launch_of(corr, gpu & _arrow.all_valid(corr_ok, n))
            has_next, nxt = tab.next_of(_gpu_ops(gpu, cat))
            end = ts + dur
            clipped = has_next & (end - nxt > CLIP_TOLERANCE_NS)
            clipped_ns = np.where(clipped, end - np.maximum(nxt, ts), 0)
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
            if cpu_only:
                on_thread = np.zeros(n, dtype=bool)
                if tab.comm_threads:
                    dev, dev_ok = _arrow.to_numpy(b.column("device"))
                    trk, trk_ok = _arrow.to_numpy(b.column("track"))
                    ok = ~gpu & _arrow.all_valid(dev_ok, n) & _arrow.all_valid(trk_ok, n)
                    for d, t in tab.comm_threads:
                        on_thread |= ok & (dev == d) & (trk == t)
                cpu_compute = ((cat & _C_CPU_OP) > 0) & ~on_thread & ((nb & (_N_COLLECTIVE_CPU | _N_NULL)) == 0)
            cls = np.select(
                [
                    comm | (cpu_only & ((nb & _N_CPU_ONLY_COMM) > 0)),
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
                res.spans.append(eid[is_comm_cls], ts[is_comm_cls], new_dur[is_comm_cls])  # event ids ascend
                cl = is_comm_cls & found
                if cl.any():
                    comm_launch.add(l_eid[cl], eid[cl])
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
                pa.DictionaryArray.from_arrays(_arrow.from_numpy(np.zeros(n, dtype=np.int32), pa.int32()), run_dict),
                _arrow.from_numpy(np.full(n, rank, dtype=np.int32), pa.int32()),
                b.column("event_id"),
                b.column("track_kind"),
                b.column("device"),
                b.column("track"),
                b.column("category"),
                b.column("name"),
                b.column("ts_ns"),
                _arrow.from_numpy(new_dur, pa.int64()),
                b.column("correlation"),
                b.column("external_id"),
                _arrow.from_numpy(l_eid, pa.int64(), found),
                pa.DictionaryArray.from_arrays(_arrow.from_numpy(cls, pa.int32()), class_dict),
                _arrow.from_numpy(step, pa.int64(), step_ok),
                _arrow.bool_array(clipped),
                _arrow.from_numpy(clipped_ns, pa.int64()),
            ]
            w.write(pa.RecordBatch.from_arrays(cols, schema=_WRITE_SCHEMA))
    try:
        if comm_launch.rows:
            _launch_rows(scan, comm_launch, res, scratch)
    finally:
        comm_launch.close()
    return res


def _launch_rows(scan, comm_launch: ExternalSort, res: LinkResult, scratch: Path) -> None:
    """Fill ``res.launches`` with the launch call (pid, tid, ts, end) of each comm GPU row: the
    (launch event_id, event_id) pairs, in launch order, are matched with a fourth scan of five
    columns (staging rows come in event_id order), and the launch rows sorted back by the comm
    row's event_id."""
    rows = ExternalSort([np.int64, np.int64, np.bool_, np.int64, np.bool_, np.int64, np.int64], 1,
                        spill.STATE_BUDGET, scratch, "commlaunchrows")
    try:
        pairs = comm_launch.batches()
        want = np.empty(0, dtype=np.int64)  # pairs read from the sort and not yet matched
        of = np.empty(0, dtype=np.int64)
        done = False
        for b in scan(["event_id", "device", "track", "ts_ns", "dur_ns"]):
            eid = _arrow.to_numpy(b.column("event_id"))[0]
            if not len(eid):
                continue
            hi = int(eid[-1])
            while not done and (not len(want) or want[-1] <= hi):
                got = next(pairs, None)
                if got is None:
                    done = True
                else:
                    want, of = np.concatenate([want, got[0]]), np.concatenate([of, got[1]])
            cut = int(np.searchsorted(want, hi, side="right"))
            w, k = want[:cut], of[:cut]
            want, of = want[cut:], of[cut:]
            if not len(w):
                continue
            i = np.minimum(np.searchsorted(eid, w), len(eid) - 1)
            hit = eid[i] == w
            i, k = i[hit], k[hit]
            dev, dev_ok = _arrow.to_numpy(b.column("device"))
            trk, trk_ok = _arrow.to_numpy(b.column("track"))
            ts = _arrow.to_numpy(b.column("ts_ns"))[0]
            dur = _arrow.to_numpy(b.column("dur_ns"))[0]
            n = len(eid)
            rows.add(k, dev[i], _arrow.all_valid(dev_ok, n)[i], trk[i], _arrow.all_valid(trk_ok, n)[i], ts[i],
                     ts[i] + dur[i])
        res.launches = SortedColumns([np.int64] * 4, scratch, "launches")
        for k, pid, pv, tid, tv, lts, lend in rows.batches():
            res.launches.append(k, pid, tid, lts, lend, valid=[pv, tv, None, None])
    finally:
        rows.close()
