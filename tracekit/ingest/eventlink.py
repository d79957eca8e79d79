"""The link pass of one rank: staging rows → final ``events`` rows, streamed batch by batch.

Input: the staging file a reader wrote (an Arrow IPC stream of ``kineto.RAW_SCHEMA``
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
batches, ~40k rows); what is kept between scans is, per GPU op, a few numbers (about
17 B, 28 B while the first scan runs) and, per launch call of a GPU op, 24 B, never
the rows. Scans: GPU ops; their launch calls; the rows written; the launch calls of
the comm kernels (their thread and duration).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit import _arrow
from tracekit.store import EVENTS_SCHEMA

SYNC_NAME = re.compile(r"(?i)(stream|event|device|context)synchronize|cuda_sync|hip(stream|event|device)synchronize")
"""CPU calls that wait for the GPU, by name (searched anywhere in the name)."""

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


@dataclass
class LinkResult:
    """What the link pass of one rank found besides the rows it wrote.

    ``spans``: comm row event_id → (ts_ns, dur_ns after clipping). ``launches``: comm
    GPU row event_id → (pid, tid, launch ts_ns, launch end ns) of its launch call.
    ``n_clipped``/``max_clip_ns``: GPU ops cut to the next op's start, and the largest
    cut. ``n_skew``/``max_skew_ns``: GPU rows that start before their launch call, and
    the largest such gap. ``ts_lo``/``ts_hi``: the rank's first start and last end (ns),
    None when it has no rows.
    """

    spans: dict = field(default_factory=dict)
    launches: dict = field(default_factory=dict)
    n_clipped: int = 0
    max_clip_ns: int | None = None
    n_skew: int = 0
    max_skew_ns: int | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None


def _ints(col: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """int64 column → (values with 0 for nulls, validity or None when all valid)."""
    return _arrow.to_numpy(col)


def _valid(v: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, dtype=bool) if v is None else v


def _lut(col: pa.Array, fn, cache: dict) -> np.ndarray:
    """A dictionary-encoded string column → int64 ``fn(value)`` per row (``fn(None)`` for nulls)."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
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


def _as_dict(col: pa.Array) -> pa.Array:
    return col if pa.types.is_dictionary(col.type) else pc.dictionary_encode(col)


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


class _Tables:
    """What the first two scans keep: next op per GPU op, launch calls by correlation, comm threads.

    Scan one: per GPU op (kernel, memcpy, memset on a GPU stream) its stream, start and
    event_id, and the correlation ids GPU rows carry; scan two: the launch calls whose
    correlation id some GPU row carries (other runtime calls are never kept).
    """

    def __init__(self, scan, cpu_only: bool):
        cat_cache: dict = {}
        name_cache: dict = {}
        kind_cache: dict = {}
        streams: dict = {}
        gp: list = []
        gcorr: list = []
        threads: set = set()
        cols = ["event_id", "track_kind", "device", "track", "category", "name", "ts_ns", "correlation", "is_comm"]
        for b in scan(cols):
            n = b.num_rows
            cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
            gpu = _lut(b.column("track_kind"), lambda k: int(k == "gpu_stream"), kind_cache).astype(bool)
            corr, corr_ok = _ints(b.column("correlation"))
            gc = gpu & _valid(corr_ok, n)
            if gc.any():
                gcorr.append(corr[gc])
            dev, dev_ok = _ints(b.column("device"))
            trk, trk_ok = _ints(b.column("track"))
            g = gpu & ((cat & _C_GPU_OP) > 0)
            if g.any():
                gp.append((_stream_ids(streams, dev[g], _valid(dev_ok, n)[g], trk[g], _valid(trk_ok, n)[g]),
                           _arrow.to_numpy(b.column("ts_ns"))[0][g], _arrow.to_numpy(b.column("event_id"))[0][g]))
            if cpu_only:
                comm = _arrow.to_numpy(b.column("is_comm"))[0]
                nb = _lut(b.column("name"), _name_bits, name_cache)
                t = comm & ~gpu & ((nb & (_N_GLOO_P2P | _N_NULL)) == 0) & _valid(dev_ok, n) & _valid(trk_ok, n)
                if t.any():
                    threads.update(zip(dev[t].tolist(), trk[t].tolist()))
        self.comm_threads = threads
        # the next op's start on the same GPU stream (order: ts, then event_id)
        if gp:
            stream, ts, eid = (np.concatenate(x) for x in zip(*gp))
            del gp
            if len(eid) > 1 and not (eid[1:] > eid[:-1]).all():  # staging rows are in event_id order
                o = np.argsort(eid, kind="stable")
                stream, ts, eid = stream[o], ts[o], eid[o]
            order = np.lexsort((eid, ts, stream))
            s_sorted = stream[order]
            has_next = np.zeros(len(eid), dtype=bool)
            has_next[order[:-1]] = s_sorted[1:] == s_sorted[:-1]
            nxt = np.zeros(len(eid), dtype=np.int64)
            nxt[order[:-1]] = ts[order[1:]]
            self.g_eid, self.g_next, self.g_has_next = eid, nxt, has_next
            del stream, ts, order, s_sorted
        else:
            self.g_eid = self.g_next = np.empty(0, dtype=np.int64)
            self.g_has_next = np.empty(0, dtype=bool)
        # launch calls: one per correlation id some GPU row carries (runtime before driver, then the lowest event_id)
        wanted = np.unique(np.concatenate(gcorr)) if gcorr else np.empty(0, dtype=np.int64)  # sorted
        del gcorr
        la: list = []
        if len(wanted):
            for b in scan(["event_id", "category", "ts_ns", "correlation"]):
                cat = _lut(b.column("category"), lambda c: _CATEGORY_BITS.get(c, 0), cat_cache)
                m = (cat & _C_LAUNCH) > 0
                if not m.any():
                    continue
                corr, corr_ok = _ints(b.column("correlation"))
                if corr_ok is not None:
                    m &= corr_ok
                m &= wanted[np.minimum(np.searchsorted(wanted, corr), len(wanted) - 1)] == corr
                if m.any():
                    la.append((corr[m], _arrow.to_numpy(b.column("event_id"))[0][m],
                               _arrow.to_numpy(b.column("ts_ns"))[0][m], (cat[m] & _C_RUNTIME) > 0))
        if la:
            corr, eid, ts, rt = (np.concatenate(x) for x in zip(*la))
            del la
            order = np.lexsort((eid, ~rt, corr))
            cs = corr[order]
            first = np.ones(len(cs), dtype=bool)
            first[1:] = cs[1:] != cs[:-1]
            pick = order[first]
            self.l_corr, self.l_eid, self.l_ts = corr[pick], eid[pick], ts[pick]
        else:
            self.l_corr = self.l_eid = self.l_ts = np.empty(0, dtype=np.int64)

    def launch_of(self, corr: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(found, launch event_id, launch ts) per correlation id (``ok``: rows to look up)."""
        n = len(self.l_corr)
        if n == 0:
            z = np.zeros(len(corr), dtype=np.int64)
            return np.zeros(len(corr), dtype=bool), z, z
        i = np.minimum(np.searchsorted(self.l_corr, corr), n - 1)
        found = ok & (self.l_corr[i] == corr)
        return found, self.l_eid[i], self.l_ts[i]

    def next_of(self, eid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(has a next op, its start) per event_id."""
        n = len(self.g_eid)
        if n == 0:
            return np.zeros(len(eid), dtype=bool), np.zeros(len(eid), dtype=np.int64)
        i = np.minimum(np.searchsorted(self.g_eid, eid), n - 1)
        return (self.g_eid[i] == eid) & self.g_has_next[i], self.g_next[i]


def _scanner(raw: str | Path):
    """``scan(columns)`` → the record batches of a staging file (Arrow IPC stream), with only
    ``columns`` (all for None)."""

    def scan(columns):
        with pa.OSFile(str(raw)) as fh:
            for b in pa.ipc.open_stream(fh):
                yield b if columns is None else b.select(columns)

    return scan


def link_rank(raw: str | Path, out: Path, run_id: str, rank: int, cpu_only: bool, steps, writer_cls) -> LinkResult:
    """Write ``out`` (EVENTS_SCHEMA, zstd level 1, row groups of EVENTS_ROW_GROUP) from the staging
    file ``raw``; see the module docstring.

    ``steps``: (step, event_id, start_ns, end_ns) of the rank's ProfilerStep windows.
    ``writer_cls``: a batch writer (``kineto._BatchWriter``) taking (path, schema, options).
    """
    scan = _scanner(raw)
    tab = _Tables(scan, cpu_only)
    order = sorted(steps, key=lambda s: (s[2], s[0]))
    st_num = np.array([s[0] for s in order], dtype=np.int64)
    st_start = np.array([s[2] for s in order], dtype=np.int64)
    st_end = np.array([s[3] for s in order], dtype=np.int64)
    res = LinkResult()
    comm_launch: list = []  # (event_id, launch event_id) of comm rows with a launch call
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
            corr, corr_ok = _ints(b.column("correlation"))
            comm = _arrow.to_numpy(b.column("is_comm"))[0]

            found, l_eid, l_ts = tab.launch_of(corr, gpu & _valid(corr_ok, n))
            has_next, nxt = tab.next_of(eid)
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
                    dev, dev_ok = _ints(b.column("device"))
                    trk, trk_ok = _ints(b.column("track"))
                    ok = ~gpu & _valid(dev_ok, n) & _valid(trk_ok, n)
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
                ce, cts, cd = eid[is_comm_cls], ts[is_comm_cls], new_dur[is_comm_cls]
                res.spans.update(zip(ce.tolist(), zip(cts.tolist(), cd.tolist())))
                cl = is_comm_cls & found
                if cl.any():
                    comm_launch.append((eid[cl], l_eid[cl]))
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
                _as_dict(b.column("track_kind")),
                b.column("device"),
                b.column("track"),
                _as_dict(b.column("category")),
                _as_dict(b.column("name")),
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
    if comm_launch:
        _launch_rows(scan, comm_launch, res)
    return res


def _launch_rows(scan, comm_launch: list, res: LinkResult) -> None:
    """Fill ``res.launches`` with the launch call (pid, tid, ts, end) of each comm GPU row (a third scan,
    of five columns, for the launch rows only)."""
    k_eid = np.concatenate([c[0] for c in comm_launch])
    l_eid = np.concatenate([c[1] for c in comm_launch])
    want = np.unique(l_eid)
    found: dict = {}
    for b in scan(["event_id", "device", "track", "ts_ns", "dur_ns"]):
        eid = _arrow.to_numpy(b.column("event_id"))[0]
        i = np.minimum(np.searchsorted(want, eid), len(want) - 1)
        m = want[i] == eid
        if not m.any():
            continue
        idx = np.flatnonzero(m)
        sub = b.take(_arrow.from_numpy(idx, pa.int64()))
        for e, d, t, s, du in zip(
            sub.column("event_id").to_pylist(), sub.column("device").to_pylist(), sub.column("track").to_pylist(),
            sub.column("ts_ns").to_pylist(), sub.column("dur_ns").to_pylist(),
        ):
            found[e] = (d, t, s, s + du)
    for k, l in zip(k_eid.tolist(), l_eid.tolist()):
        got = found.get(l)
        if got is not None:
            res.launches[k] = got
