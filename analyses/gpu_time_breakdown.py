"""gpu_time_breakdown: where each rank's GPU time goes, per whole trace and per profiler step, as
parts that sum exactly to the window, and which CPU op / record_function range launched each GPU
op — a Python analysis.

Reads: events, ranks

GPU work = events on GPU tracks (track_kind = 'gpu_stream') with dur_ns > 0, every stream of the
rank together, except Kineto's ``gpu_user_annotation`` ranges (a record_function label drawn on
the GPU track, spanning the work it names: not GPU work of its own). A window (grp) is the whole trace (grp = -1: all of the rank's GPU work) or one
profiler step (grp = step: the GPU work launched in that step, events.step); it spans from the
first start to the last end of that work, as HTA's temporal breakdown does ("kernel time" = end of
the last kernel − start of the first; HTA 0.5, BreakdownAnalysis._get_idle_time_for_kernels). So a
window never begins or ends idle: its idle time is the gaps between its GPU work.

Every instant of the window gets exactly one label, by a sweep over the start/end boundaries of the
window's spans (+1/−1 counters per class; the segment between consecutive boundaries is labelled by
the counters after the first of them), first rule that applies:
  comm ∧ compute                    → comm_hidden   (communication hidden behind compute)
  compute                           → compute_only
  comm                              → comm_exposed  (the overlap module's exposed_comm, on GPU work)
  memory (memcpy/memset)            → memory
  sync                              → sync
  any other GPU event (class other) → other
  nothing                           → idle
so compute_only + comm_hidden = |∪ compute| (HTA's compute_time), comm_hidden + comm_exposed =
|∪ comm|, and the seven parts sum to window_ns exactly (int64 ns, no rounding). A span whose class
is NULL bounds segments but counts in no class.

Idle is split as HTA's idle-time breakdown does (HTA 0.5 docs, "Idle Time Breakdown";
BreakdownAnalysis._analyze_idle_time_for_stream), applied to the gaps of the rank's union of
streams rather than per stream: a gap [s, e) is
  host_wait   when the CPU launch of the work that ends the gap (events.launch_event_id → the
              runtime call's ts_ns; the earliest such launch when several spans start at e)
              started after the gap began (launch ts > s): the host was not enqueuing fast enough;
  kernel_wait otherwise, when e − s < 30 ns (HTA's default consecutive_kernel_delay, 30 ns): the
              overhead of launching back-to-back kernels;
  other       otherwise (waiting on another stream, an event, a sync, or work without a launch link).
A run without GPU tracks (CPU-only gloo traces) has no rows.

Launchers (gpu_launchers): GPU ops = events on GPU tracks (track_kind = 'gpu_stream': kernels,
memcpy, memset, sync), one row each, whatever their duration. Their launch call is
events.launch_event_id (the runtime call); the launchers are the innermost cpu_op and the innermost
user_annotation other than ProfilerStep#N (record_function) that enclose that call on the launch's
thread (same track; ranges of positive length), each kind on its own, found by
tracekit.intervals.innermost_enclosing (binary searches over the thread's ranges sorted once; a
range that does not nest properly gives NULL, never a wrong op).

How: per chunk of consecutive ranks (up to CHUNK_EVENTS events), one scan of the events reads the
GPU ops and the candidate launchers together, and, only when some GPU op has a launch link, one
join reads their launch calls. Then numpy, all ranks of the chunk at once: the windows swept
(:func:`sweep`, each (rank, window) a window of its own, each rank's times taken from its own
first GPU work: the boundaries sorted once, running class counters as cumulative sums, the
segments' lengths summed per window and label); the launchers searched in one
innermost_enclosing call per kind (:func:`_enclosing`: every (rank, thread) on a stretch of the
time axis of its own) and named by taking the names read with the ranges. Memory grows with one
chunk's GPU ops and CPU ranges, not with the whole store (benchmarks/README.md has the figures).

gpu_idle_gaps: one row per idle gap of a window (a table).

run_id      VARCHAR  run
rank        INTEGER  global rank
grp         BIGINT   -1 = whole trace, else the profiler step number
s           BIGINT   gap start (end of the GPU work before it), ns
e           BIGINT   gap end (start of the GPU work after it), ns
idle_ns     BIGINT   e − s, ns
launch_ts_ns BIGINT  earliest CPU launch (runtime call start) of the spans starting at e, ns; NULL when none is linked
idle_class  VARCHAR  host_wait / kernel_wait / other (header above)

gpu_launchers: one row per GPU op (a table).

run_id          VARCHAR  run
rank            INTEGER  global rank
event_id        BIGINT   the GPU op (events.event_id)
launch_event_id BIGINT   its runtime launch call; NULL when not linked
cpu_op_id       BIGINT   innermost cpu_op enclosing the launch (events.event_id); NULL when none
cpu_op          VARCHAR  its name
annotation_id   BIGINT   innermost user_annotation (record_function) enclosing the launch; NULL when none
annotation      VARCHAR  its name

gpu_time_breakdown: one row per rank and window; the seven parts before idle_host_wait_ns sum to
window_ns, and the three idle classes sum to idle_ns.

run_id              VARCHAR  run
rank                INTEGER  global rank
grp                 BIGINT   -1 = whole trace, else the profiler step number
window_start_ns     BIGINT   start of the window's first GPU work, ns
window_end_ns       BIGINT   end of its last GPU work, ns
window_ns           BIGINT   window_end_ns − window_start_ns, ns
compute_only_ns     BIGINT   compute and no communication, ns
comm_exposed_ns     BIGINT   communication with no compute under it, ns
comm_hidden_ns      BIGINT   communication overlapped by compute, ns
memory_ns           BIGINT   memcpy/memset and no compute or communication, ns
sync_ns             BIGINT   sync events only, ns
other_ns            BIGINT   other GPU events only, ns
idle_ns             BIGINT   no GPU activity, ns
idle_host_wait_ns   BIGINT   idle gaps classed host_wait (gpu_idle_gaps), ns
idle_kernel_wait_ns BIGINT   idle gaps classed kernel_wait, ns
idle_other_ns       BIGINT   idle gaps classed other, ns
idle_fraction       DOUBLE   idle_ns / window_ns; NULL when window_ns = 0
"""

from __future__ import annotations

import numpy as np

LABELS = ("compute_only", "comm_exposed", "comm_hidden", "memory", "sync", "other", "idle")
"""Segment labels, in the order of gpu_time_breakdown's parts (index = label code)."""

IDLE_CLASSES = ("host_wait", "kernel_wait", "other")
"""gpu_idle_gaps.idle_class values (index = class code)."""

KERNEL_WAIT_NS = 30
"""A gap shorter than this (and not host_wait) is kernel_wait: HTA's consecutive_kernel_delay."""

_CLASSES = ("compute", "comm", "memory", "sync")  # counter k; every other non-NULL class → counter 4
_NONE = np.iinfo(np.int64).max  # "no value" in the int64 arrays: no launch linked, a NULL

_READ = """
SELECT rank, CASE WHEN track_kind = 'gpu_stream' THEN 2 ELSE (category = 'user_annotation')::INTEGER END::TINYINT AS kind,
       event_id, track, ts_ns AS s, dur_ns,
       CASE class WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 WHEN 'memory' THEN 2 WHEN 'sync' THEN 3
                  ELSE CASE WHEN class IS NULL THEN 5 ELSE 4 END END::TINYINT AS k,
       step, launch_event_id, CASE WHEN track_kind = 'cpu_thread' THEN name END AS name
FROM events
WHERE run_id = $1 AND rank BETWEEN $2 AND $3
  AND ((track_kind = 'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation')
       OR (track_kind = 'cpu_thread' AND dur_ns > 0 AND ts_ns IS NOT NULL
           AND (category = 'cpu_op' OR (category = 'user_annotation' AND name NOT LIKE 'ProfilerStep#%'))))
"""
"""One scan of ranks $2..$3: their GPU ops (kind 2; class code k as :func:`sweep` takes it) and their
candidate launchers (kind 0 = cpu_op, 1 = user_annotation other than ProfilerStep#N, with a name),
in no particular order."""

_LAUNCH = """
SELECT q.i, l.track, l.ts_ns AS l_s, l.ts_ns + l.dur_ns AS l_e
FROM _gpu_launch_q q JOIN events l ON l.rank = q.rank AND l.event_id = q.launch_event_id
WHERE l.run_id = $1 AND l.rank BETWEEN $2 AND $3
"""
"""The launch calls (track, start, end) of the linked GPU ops ``_gpu_launch_q`` (i = their row in the
chunk's GPU ops, rank, launch_event_id), read only when some GPU op has a launch link."""


CHUNK_SPANS = 1 << 18
"""Spans swept at once: windows are taken together up to this many spans (a larger one alone), so
the sweep's arrays (~30 B per span boundary) stay small beside the rank's own columns."""


def sweep(grp: np.ndarray, s: np.ndarray, e: np.ndarray, k: np.ndarray, launch: np.ndarray):
    """Label the windows of one rank. Spans: window ``grp``, start ``s`` < end ``e`` (int64 ns),
    class code ``k`` (0–3 = _CLASSES, 4 other, 5 NULL), ``launch`` the launch call's start
    (int64 ns, _NONE when not linked).

    Returns (windows, parts, gaps): ``windows`` = (grp, start, end) int64 arrays, one entry per
    window ascending; ``parts`` an int64 array (windows × LABELS) of labelled lengths (ns);
    ``gaps`` = (window index, s, e, launch, idle class code) arrays, one entry per idle gap in
    (window, s) order. Raises ValueError when the rank's spans cover 2^53 ns (104 days) or more.
    """
    if (grp[1:] < grp[:-1]).any():
        order = np.argsort(grp, kind="stable")
        grp, s, e, k, launch = (x[order] for x in (grp, s, e, k, launch))
    wfirst = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
    wgrp = grp[wfirst]
    bounds = np.r_[wfirst, len(grp)].tolist()
    tmin = int(s.min())
    span = int(e.max()) - tmin + 1
    if span >= 2**53:
        raise ValueError(f"GPU work spans {span} ns, too long to sweep")
    per_key = 2**58 // span  # windows whose (window, time) keys fit one int64 beside 4 bits of code
    outs, a = [], 0
    while a < len(wgrp):
        z = a + 1
        while z < len(wgrp) and z - a < per_key and bounds[z + 1] - bounds[a] <= CHUNK_SPANS:
            z += 1
        lo, hi = bounds[a], bounds[z]
        wid = np.searchsorted(wfirst[a:z], np.arange(lo, hi), side="right") - 1
        lz = launch[lo:hi]
        lz = np.where(lz == _NONE, _NONE, lz - tmin)
        w, parts, g = _sweep_chunk(wid, s[lo:hi] - tmin, e[lo:hi] - tmin, k[lo:hi], lz, span)
        outs.append(((w[0] + tmin, w[1] + tmin), parts, (g[0] + a, g[1] + tmin, g[2] + tmin,
                                                         np.where(g[3] == _NONE, _NONE, g[3] + tmin), g[4])))
        a = z
    start = np.concatenate([o[0][0] for o in outs])
    end = np.concatenate([o[0][1] for o in outs])
    parts = np.concatenate([o[1] for o in outs])
    gaps = tuple(np.concatenate([o[2][j] for o in outs]) for j in range(5))
    return (wgrp, start, end), parts, gaps


def _sweep_chunk(wid, s, e, k, launch, span):
    """:func:`sweep` over windows 0..W−1 (``wid`` per span, non-decreasing), times in [0, span)
    (``launch`` on the same origin, _NONE when not linked).
    Returns ((start, end), parts, (window, s, e, launch, class)) as :func:`sweep`."""
    n = len(s)
    base = wid * span
    # one int64 per boundary: (window, time) above 4 bits of code (class × 2 + is_end)
    pts = np.empty(2 * n, dtype=np.int64)
    pts[:n] = ((base + s) << 4) | (k.astype(np.int64) * 2)
    pts[n:] = ((base + e) << 4) | (k.astype(np.int64) * 2 + 1)
    pts.sort()
    low = (pts & 15).astype(np.int8)
    tk = pts >> 4
    del pts
    head = np.ones(2 * n, dtype=bool)
    np.not_equal(tk[1:], tk[:-1], out=head[1:])
    hi = np.flatnonzero(head)
    del head
    last = np.r_[hi[1:], 2 * n] - 1
    # the counters after a boundary = the running sum up to its last point; every window closes
    # all its spans, so one running sum serves all the windows
    open_ = [np.cumsum((low == 2 * c).astype(np.int8) - (low == 2 * c + 1), dtype=np.int32)[last] > 0
             for c in range(5)]
    del low, last
    label = np.full(len(hi), 6, dtype=np.int8)  # the rules of the module docstring, last one first
    for code, c in ((5, 4), (4, 3), (3, 2), (1, 1), (0, 0)):
        label[open_[c]] = code
    label[open_[0] & open_[1]] = 2
    del open_
    bk = tk[hi]
    del tk, hi
    bw, bt = bk // span, bk % span
    # segment i = [bt[i], bt[i+1]) when both boundaries are in one window
    inside = np.zeros(len(bk), dtype=bool)
    inside[:-1] = bw[1:] == bw[:-1]
    seg_len = np.zeros(len(bk), dtype=np.int64)
    seg_len[:-1] = np.where(inside[:-1], bt[1:] - bt[:-1], 0)
    wi = np.flatnonzero(np.r_[True, ~inside[:-1]])
    wend = bt[np.r_[wi[1:], len(bk)] - 1]
    # sums of int64 ns as float64: exact, every window being shorter than 2^53 ns
    nl = len(LABELS)
    parts = np.bincount(bw * nl + label, weights=seg_len, minlength=len(wi) * nl).astype(np.int64).reshape(-1, nl)
    # gaps: idle segments; the earliest linked launch of the spans starting at the gap's end
    gi = np.flatnonzero(inside & (label == 6))
    gs, ge = bt[gi], bt[gi + 1]
    sk = base + s
    o = np.argsort(sk, kind="stable")
    sks, ls = sk[o], launch[o]
    first = np.flatnonzero(np.r_[True, sks[1:] != sks[:-1]])
    lmin = np.minimum.reduceat(ls, first)
    gl = lmin[np.searchsorted(sks[first], bk[gi + 1])]
    gclass = np.where((gl != _NONE) & (gl > gs), 0, np.where(ge - gs < KERNEL_WAIT_NS, 1, 2))
    return (bt[wi], wend), parts, (bw[gi], gs, ge, gl, gclass)


def _read_chunk(con, params) -> "pa.Table":
    """_READ's rows, streamed, each batch's names dictionary-encoded as it comes: a chunk holds a
    rank's CPU ranges with their names, which as plain strings were most of the module's peak."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for b in con.sql(_READ, params=params).to_arrow_reader(1 << 16):
        i = b.schema.get_field_index("name")
        parts.append(b.set_column(i, "name", pc.dictionary_encode(b.column(i))))
    if not parts:
        return con.sql(_READ, params=params).to_arrow_table()
    return pa.Table.from_batches(parts)


def _col(tab, name: str, fill=None) -> np.ndarray:
    """A column of a pyarrow table as int64 numpy (nulls → ``fill``; no copy when it has none)."""
    import pyarrow.compute as pc

    c = tab.column(name)
    if c.null_count and fill is not None:
        c = pc.fill_null(c, fill)
    return c.to_numpy().astype(np.int64, copy=False)


def _group_ids(rank: np.ndarray, track: np.ndarray):
    """Dense ids of the (rank, track) pairs, numbered in (rank, track) order, and their count."""
    if len(rank) == 0:
        return np.zeros(0, dtype=np.int64), 0
    o = np.lexsort((track, rank))
    ro, to = rank[o], track[o]
    new = np.r_[True, (ro[1:] != ro[:-1]) | (to[1:] != to[:-1])]
    del ro, to
    gid = np.empty(len(rank), dtype=np.int64)
    gid[o] = np.cumsum(new) - 1
    return gid, int(new.sum())


def _enclosing(rank, track, s, e, qrank, qtrack, qs, qe) -> np.ndarray:
    """:func:`tracekit.intervals.innermost_enclosing` of each query [qs, qe) among the ranges [s, e)
    of its own (rank, track) — every thread of every rank in one call: each thread's ranges and
    queries are moved onto a stretch of the time axis of their own (its earliest time to 0, then
    after the previous thread's stretch and a 1 ns gap), so no range of one thread starts, ends or
    encloses within another's; indices into the ranges, −1 where none encloses. The int64 arrays
    ``s``, ``e``, ``qs``, ``qe`` are shifted in place (pass copies)."""
    from tracekit.intervals import innermost_enclosing

    n = len(s)
    gid, ng = _group_ids(np.r_[rank, qrank], np.r_[track, qtrack])
    if ng <= 1:  # one thread: as it is
        return innermost_enclosing(s, e, qs, qe)
    lo = np.full(ng, _NONE, dtype=np.int64)
    hi = np.full(ng, np.iinfo(np.int64).min, dtype=np.int64)
    for x, g in ((s, gid[:n]), (qs, gid[n:])):
        np.minimum.at(lo, g, x)
    for x, g in ((e, gid[:n]), (qe, gid[n:])):
        np.maximum.at(hi, g, x)
    width = hi - lo + 1
    if float(width.sum()) >= 2.0**62:  # the stretches would not fit one int64 axis: thread by thread
        out = np.full(len(qs), -1, dtype=np.int64)
        for g in range(ng):
            sel, q = np.flatnonzero(gid[:n] == g), np.flatnonzero(gid[n:] == g)
            hit = innermost_enclosing(s[sel], e[sel], qs[q], qe[q])
            out[q[hit >= 0]] = sel[hit[hit >= 0]]
        return out
    shift = (np.cumsum(width) - width - lo)  # thread g's times move by −lo[g] + its stretch's start
    for x, g in ((s, gid[:n]), (e, gid[:n]), (qs, gid[n:]), (qe, gid[n:])):
        x += shift[g]
    del gid
    return innermost_enclosing(s, e, qs, qe)


def _launcher_tables(gpu, rg, lt, ls, le):
    """gpu_launchers' columns after run_id (rank, event_id, launch_event_id, cpu_op_id, cpu_op,
    annotation_id, annotation) for the GPU ops ``gpu`` (_READ rows, kind 2) among the candidate
    launchers ``rg`` (_READ rows, kind 0 / 1), their launch calls' track ``lt``, start ``ls``, end
    ``le`` (int64, _NONE when not linked), as a pyarrow table."""
    import pyarrow as pa

    kind, rrank, track = rg.column("kind").to_numpy(), rg.column("rank").to_numpy(), _col(rg, "track", _NONE)
    s = _col(rg, "s")
    e = s + _col(rg, "dur_ns")
    grank = gpu.column("rank").to_numpy()
    q = np.flatnonzero((ls != _NONE) & (le != _NONE) & (lt != _NONE))
    cols = {"rank": gpu.column("rank"), "event_id": gpu.column("event_id"),
            "launch_event_id": gpu.column("launch_event_id")}
    found = {}
    for kd in (0, 1):
        # a range without a thread encloses nothing (NULL = NULL is not true in SQL either)
        sel = np.flatnonzero((kind == kd) & (track != _NONE))
        found[kd] = f = np.full(len(grank), -1, dtype=np.int64)
        hit = _enclosing(rrank[sel], track[sel], s[sel], e[sel], grank[q], lt[q], ls[q], le[q])
        f[q[hit >= 0]] = sel[hit[hit >= 0]]
        del sel, hit
    del kind, rrank, track, s, e
    rid = np.r_[_col(rg, "event_id", _NONE), 0]  # index −1 (none found) picks this placeholder, masked to NULL
    for kd, name, label in ((0, "cpu_op_id", "cpu_op"), (1, "annotation_id", "annotation")):
        f = found[kd]
        null = (f < 0) | (rid[f] == _NONE)
        cols[name] = pa.array(rid[f], mask=null)
        cols[label] = rg.column("name").take(pa.array(np.where(null, 0, f), mask=null)).cast(pa.string())
    return pa.table(cols)


def _breakdown_tables(gpu, ls):
    """(windows, gaps) of the GPU ops ``gpu`` (_READ rows, kind 2, sorted by rank, then step with
    NULL first), ``ls`` their launch calls' starts (_NONE when not linked), as pyarrow tables of
    the columns after run_id; None, None without GPU work. All ranks are swept together: each rank's
    times are taken from its first GPU work (so the keys stay as small as one rank's) and every
    (rank, window) is a window of :func:`sweep`."""
    import pyarrow as pa

    dur = _col(gpu, "dur_ns", 0)
    w = np.flatnonzero(dur > 0)  # GPU work (ts_ns is set on every GPU op)
    if len(w) == 0:
        return None, None
    rank = _col(gpu, "rank")[w]
    s = _col(gpu, "s")[w]
    e = s + dur[w]
    k = gpu.column("k").to_numpy()[w].astype(np.int8)
    launch = ls[w]
    m = gpu.column("step").is_valid().to_numpy(zero_copy_only=False)[w]
    step = _col(gpu, "step", 0)[w]
    rfirst = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    ridx = np.cumsum(np.r_[True, rank[1:] != rank[:-1]]) - 1  # dense rank index of each span
    t0 = np.minimum.reduceat(s, rfirst)  # each rank's origin
    off = t0[ridx]
    s, e = s - off, e - off
    launch = np.where(launch == _NONE, _NONE, launch - off)
    # the whole trace (a window per rank), then the steps (a window per rank and step)
    wins = [(ridx[rfirst], np.full(len(rfirst), -1, dtype=np.int64), sweep(ridx, s, e, k, launch))]
    if m.any():
        sr, ss = ridx[m], step[m]
        first = np.r_[True, (sr[1:] != sr[:-1]) | (ss[1:] != ss[:-1])]
        sw = np.cumsum(first) - 1
        wins.append((sr[first], ss[first], sweep(sw, s[m], e[m], k[m], launch[m])))
    parts, gaps = [], []
    nc = len(IDLE_CLASSES)
    ranks = rank[rfirst].astype(np.int32)
    while wins:  # each sweep's gaps to a table at once (the gaps can outnumber the spans)
        wr, wg, ((_, ws, we), p, (gw, gs, ge, gl, gc)) = wins.pop(0)
        o = t0[wr]
        # float64 sums of ns, exact below 2^53 (sweep)
        idle = np.bincount(gw * nc + gc, weights=ge - gs, minlength=len(wr) * nc).astype(np.int64).reshape(-1, nc)
        parts.append((ranks[wr], wg, ws + o, we + o, p, idle))
        go = o[gw]
        gs += go
        ge += go
        gl[gl != _NONE] += go[gl != _NONE]
        gaps.append(pa.table({"rank": ranks[wr[gw]], "grp": wg[gw], "s": gs, "e": ge,
                              "launch_ts_ns": pa.array(gl, mask=gl == _NONE),
                              "idle_class": pa.DictionaryArray.from_arrays(gc.astype(np.int8), list(IDLE_CLASSES))}))
        del gw, gs, ge, gl, gc, go
    wr, wg, ws, we, p, idle = (np.concatenate([x[j] for x in parts]) for j in range(6))
    cols = {"rank": wr, "grp": wg, "window_start_ns": ws, "window_end_ns": we}
    cols.update({f"{lab}_ns": p[:, j] for j, lab in enumerate(LABELS)})
    cols.update({f"idle_{c}_ns": idle[:, j] for j, c in enumerate(IDLE_CLASSES)})
    return pa.table(cols), pa.concat_tables(gaps)


CHUNK_EVENTS = 1 << 22
"""Events whose ranks are read together (ranks are taken together up to this many events; a larger
rank alone), so that a job of many small ranks costs a few statements, not several per rank."""


def _rank_chunks(keys):
    """(run_id, first rank, last rank) of consecutive ranks of one run holding up to CHUNK_EVENTS
    events together, from (run_id, rank, events) rows sorted by run and rank."""
    out, cur, n = [], None, 0
    for run_id, rank, cnt in keys:
        if cur is not None and cur[0] == run_id and n + cnt <= CHUNK_EVENTS:
            cur[2], n = rank, n + cnt
            continue
        if cur is not None:
            out.append(tuple(cur))
        cur, n = [run_id, rank, rank], cnt
    if cur is not None:
        out.append(tuple(cur))
    return out


def _by_rank(tab) -> dict[int, tuple[int, int]]:
    """rank → (first row, end row) of a table grouped by its ``rank`` column."""
    r = tab.column("rank").to_numpy()
    b = np.flatnonzero(np.r_[True, r[1:] != r[:-1], True]) if len(r) else np.zeros(1, np.int64)
    return {int(r[x]): (int(x), int(y)) for x, y in zip(b[:-1], b[1:])}


def create(con) -> None:
    """Create the tables ``gpu_idle_gaps``, ``gpu_time_breakdown`` and ``gpu_launchers`` on ``con``
    from its ``events``."""
    con.execute("""
        CREATE OR REPLACE TABLE gpu_idle_gaps (run_id VARCHAR, rank INTEGER, grp BIGINT, s BIGINT, e BIGINT,
            idle_ns BIGINT, launch_ts_ns BIGINT, idle_class VARCHAR)""")
    con.execute("""
        CREATE OR REPLACE TABLE gpu_launchers (run_id VARCHAR, rank INTEGER, event_id BIGINT,
            launch_event_id BIGINT, cpu_op_id BIGINT, cpu_op VARCHAR, annotation_id BIGINT, annotation VARCHAR)""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _gpu_windows (run_id VARCHAR, rank INTEGER, grp BIGINT,
            window_start_ns BIGINT, window_end_ns BIGINT, compute_only_ns BIGINT, comm_exposed_ns BIGINT,
            comm_hidden_ns BIGINT, memory_ns BIGINT, sync_ns BIGINT, other_ns BIGINT, idle_ns BIGINT,
            idle_host_wait_ns BIGINT, idle_kernel_wait_ns BIGINT, idle_other_ns BIGINT)""")
    import pyarrow as pa

    # chunks by the ranks' event counts as stored (ranks.events; a scan counting them cost 0.4 s at
    # 1,024 ranks), widened to cover every rank number of the run: each events row is read once
    keys = con.execute("SELECT run_id, rank, coalesce(events, 0) FROM ranks ORDER BY run_id, rank").fetchall()
    chunks = _rank_chunks(keys)
    for j, (run_id, lo, hi) in enumerate(chunks):
        lo = chunks[j - 1][2] + 1 if j and chunks[j - 1][0] == run_id else -2**31
        hi = hi if j + 1 < len(chunks) and chunks[j + 1][0] == run_id else 2**31 - 1
        # a chunk's ranks in one scan (a statement per rank cost ~0.1 s apiece at 1,024 ranks)
        t = _read_chunk(con, [run_id, lo, hi])
        kind = t.column("kind").to_numpy()
        rg = t.select(["rank", "kind", "event_id", "track", "s", "dur_ns", "name"]).filter(pa.array(kind < 2))
        gpu = t.select(["rank", "event_id", "s", "dur_ns", "k", "step", "launch_event_id"])
        del t
        # GPU ops by rank, then step (NULL first): the step windows come grouped
        g = np.flatnonzero(kind == 2)
        del kind
        step = gpu.column("step").take(pa.array(g))
        order = g[np.lexsort((_col(pa.table({"step": step}), "step", 0),
                              step.is_valid().to_numpy(zero_copy_only=False),
                              gpu.column("rank").take(pa.array(g)).to_numpy()))]
        del g, step
        gpu = gpu.take(pa.array(order))
        del order
        n = len(gpu)
        lt, ls, le = (np.full(n, _NONE, dtype=np.int64) for _ in range(3))
        linked = np.flatnonzero(gpu.column("launch_event_id").is_valid().to_numpy(zero_copy_only=False))
        if len(linked):
            con.register("_gpu_launch_q", pa.table({"i": linked, "rank": gpu.column("rank").take(pa.array(linked)),
                                                    "launch_event_id": gpu.column("launch_event_id").take(pa.array(linked))}))
            lc = con.sql(_LAUNCH, params=[run_id, lo, hi]).to_arrow_table()
            con.unregister("_gpu_launch_q")
            i = _col(lc, "i")
            lt[i], ls[i], le[i] = _col(lc, "track", _NONE), _col(lc, "l_s", _NONE), _col(lc, "l_e", _NONE)
        wins, gaps = _breakdown_tables(gpu, ls)
        launchers = _launcher_tables(gpu, rg, lt, ls, le)
        del gpu, rg
        for table, tab, src in (
                ("_gpu_windows", wins, "SELECT * FROM _gpu_rank_part"),
                ("gpu_idle_gaps", gaps, "SELECT rank, grp, s, e, e - s, launch_ts_ns, idle_class::VARCHAR FROM _gpu_rank_part"),
                ("gpu_launchers", launchers, "SELECT * FROM _gpu_rank_part")):
            if tab is None or len(tab) == 0:
                continue
            con.register("_gpu_rank_part", tab)
            con.execute(f"INSERT INTO {table} SELECT $1, * FROM ({src})", [run_id])
            con.unregister("_gpu_rank_part")
    con.execute("""
        CREATE OR REPLACE TABLE gpu_time_breakdown AS
        SELECT run_id, rank, grp, window_start_ns, window_end_ns,
               (window_end_ns - window_start_ns)::BIGINT AS window_ns,
               compute_only_ns, comm_exposed_ns, comm_hidden_ns, memory_ns, sync_ns, other_ns, idle_ns,
               idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns,
               CASE WHEN window_end_ns > window_start_ns
                    THEN idle_ns / (window_end_ns - window_start_ns) END AS idle_fraction
        FROM _gpu_windows ORDER BY run_id, rank, grp""")
    con.execute("DROP TABLE _gpu_windows")
