"""The GPU time breakdown and the GPU ops' launchers of a rank (or of several ranks at once), in
numpy: used by the ingest (per rank, from the rows the link pass writes:
tracekit.ingest.assemble) and by the analyses (analyses/gpu_time_breakdown.py, for runs stored
without the summaries, and the per-op tables gpu_launchers / gpu_idle_gaps).

GPU work = the GPU ops (events on GPU tracks, track_kind = 'gpu_stream', other than Kineto's
``gpu_user_annotation`` ranges: a record_function label drawn on the GPU track, spanning the work it
names, not GPU work of its own) with dur_ns > 0, every stream of the rank together. A window (grp)
is the whole trace (grp = -1: all of the rank's GPU work) or one profiler step (grp = step: the GPU
work launched in that step, events.step); it spans from the first start to the last end of that
work, as HTA's temporal breakdown does ("kernel time" = end of the last kernel − start of the
first; HTA 0.5, BreakdownAnalysis._get_idle_time_for_kernels). So a window never begins or ends
idle: its idle time is the gaps between its GPU work.

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
|∪ comm|, and the seven parts sum to the window exactly (int64 ns, no rounding). A span whose class
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

Launchers: a GPU op's launch call is events.launch_event_id (the runtime call); its launchers are
the innermost cpu_op and the innermost user_annotation other than ProfilerStep#N (record_function)
that enclose that call on the launch's thread (same rank and track; ranges of positive length), each
kind on its own, found by tracekit.timeline.intervals.innermost_enclosing (binary searches over the thread's
ranges sorted once; a range that does not nest properly gives none, never a wrong op).

Every function takes the ranks' rows as numpy arrays, all ranks at once: the windows of every rank
are swept together (:func:`breakdown`: each rank's times taken from its own first GPU work, each
(rank, window) a window of :func:`sweep`), the launchers searched in one innermost_enclosing call per
kind (:func:`launchers`: every (rank, thread) on a stretch of the time axis of its own). Times are
int64 ns; a time shift of a whole rank (a clock offset) moves the windows' ends and nothing else.
"""

from __future__ import annotations

import numpy as np

from tracekit.timeline.intervals import innermost_enclosing

LABELS = ("compute_only", "comm_exposed", "comm_hidden", "memory", "sync", "other", "idle")
"""Segment labels, in the order of gpu_time_breakdown's parts (index = label code)."""

IDLE_CLASSES = ("host_wait", "kernel_wait", "other")
"""gpu_idle_gaps.idle_class values (index = class code)."""

KERNEL_WAIT_NS = 30
"""A gap shorter than this (and not host_wait) is kernel_wait: HTA's consecutive_kernel_delay."""

_CLASSES = ("compute", "comm", "memory", "sync")  # counter k; every other non-NULL class → counter 4
NONE = np.iinfo(np.int64).max
"""No value in the int64 arrays: no launch linked, no track, a NULL."""

CHUNK_SPANS = 1 << 18
"""Spans swept at once: windows are taken together up to this many spans (a larger one alone), so
the sweep's arrays (~30 B per span boundary) stay small beside the rank's own columns."""


def sweep(grp: np.ndarray, s: np.ndarray, e: np.ndarray, k: np.ndarray, launch: np.ndarray):
    """Label the windows of one rank. Spans: window ``grp``, start ``s`` < end ``e`` (int64 ns),
    class code ``k`` (0–3 = _CLASSES, 4 other, 5 NULL), ``launch`` the launch call's start
    (int64 ns, NONE when not linked).

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
        lz = np.where(lz == NONE, NONE, lz - tmin)
        w, parts, g = _sweep_chunk(wid, s[lo:hi] - tmin, e[lo:hi] - tmin, k[lo:hi], lz, span)
        outs.append(((w[0] + tmin, w[1] + tmin), parts, (g[0] + a, g[1] + tmin, g[2] + tmin,
                                                         np.where(g[3] == NONE, NONE, g[3] + tmin), g[4])))
        a = z
    start = np.concatenate([o[0][0] for o in outs])
    end = np.concatenate([o[0][1] for o in outs])
    parts = np.concatenate([o[1] for o in outs])
    gaps = tuple(np.concatenate([o[2][j] for o in outs]) for j in range(5))
    return (wgrp, start, end), parts, gaps


def _sweep_chunk(wid, s, e, k, launch, span):
    """:func:`sweep` over windows 0..W−1 (``wid`` per span, non-decreasing), times in [0, span)
    (``launch`` on the same origin, NONE when not linked).
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
    gclass = np.where((gl != NONE) & (gl > gs), 0, np.where(ge - gs < KERNEL_WAIT_NS, 1, 2))
    return (bt[wi], wend), parts, (bw[gi], gs, ge, gl, gclass)



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
    """:func:`tracekit.timeline.intervals.innermost_enclosing` of each query [qs, qe) among the ranges [s, e)
    of its own (rank, track) — every thread of every rank in one call: each thread's ranges and
    queries are moved onto a stretch of the time axis of their own (its earliest time to 0, then
    after the previous thread's stretch and a 1 ns gap), so no range of one thread starts, ends or
    encloses within another's; indices into the ranges, −1 where none encloses. The int64 arrays
    ``s``, ``e``, ``qs``, ``qe`` are shifted in place (pass copies)."""

    n = len(s)
    gid, ng = _group_ids(np.r_[rank, qrank], np.r_[track, qtrack])
    if ng <= 1:  # one thread: as it is
        return innermost_enclosing(s, e, qs, qe)
    lo = np.full(ng, NONE, dtype=np.int64)
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




def breakdown(rank, s, dur, k, step, step_ok, launch, gaps: bool = True):
    """The windows (and idle gaps) of the GPU ops of one or more ranks: ``rank``, start ``s``,
    duration ``dur`` (0 for none), class code ``k`` (int8, as :func:`sweep` takes it), ``step``
    with its validity ``step_ok`` (bool), ``launch`` the launch call's start (NONE when not linked);
    int64 numpy arrays, sorted by rank, then step (NULL first), then step.

    Returns (windows, gaps) as pyarrow tables: windows = (rank, grp, window_start_ns, window_end_ns,
    the seven LABELS as <label>_ns, idle_<class>_ns per IDLE_CLASSES), one row per rank and window
    (the whole trace, then its steps); gaps = (rank, grp, s, e, launch_ts_ns, idle_class) per idle
    gap, or None when ``gaps`` is false; (None, None) without GPU work (no op with dur > 0).
    Raises ValueError as :func:`sweep`."""
    import pyarrow as pa

    w = np.flatnonzero(dur > 0)  # GPU work
    if len(w) == 0:
        return None, None
    if len(w) < len(dur):  # (no copies when every op is GPU work)
        rank, s, dur, k, launch, step_ok, step = rank[w], s[w], dur[w], k[w], launch[w], step_ok[w], step[w]
    del w
    rfirst = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    ridx = np.cumsum(np.r_[True, rank[1:] != rank[:-1]]) - 1  # dense rank index of each span
    t0 = np.minimum.reduceat(s, rfirst)  # each rank's origin
    off = t0[ridx]
    s = s - off
    e = s + dur
    launch = np.where(launch == NONE, NONE, launch - off)
    del off
    ranks = rank[rfirst].astype(np.int32)
    parts, out_gaps = [], []
    nc = len(IDLE_CLASSES)

    def windows(wr, wg, swept) -> None:
        # one sweep's windows, its gaps summed per class (and, with ``gaps``, made a table) at once:
        # the gaps can outnumber the spans
        (_, ws, we), p, (gw, gs, ge, gl, gc) = swept
        o = t0[wr]
        # float64 sums of ns, exact below 2^53 (sweep)
        idle = np.bincount(gw * nc + gc, weights=ge - gs, minlength=len(wr) * nc).astype(np.int64).reshape(-1, nc)
        parts.append((ranks[wr], wg, ws + o, we + o, p, idle))
        if gaps:
            go = o[gw]
            gs += go
            ge += go
            gl[gl != NONE] += go[gl != NONE]
            out_gaps.append(pa.table({"rank": ranks[wr[gw]], "grp": wg[gw], "s": gs, "e": ge,
                                      "launch_ts_ns": pa.array(gl, mask=gl == NONE),
                                      "idle_class": pa.DictionaryArray.from_arrays(gc.astype(np.int8),
                                                                                   list(IDLE_CLASSES))}))

    # the whole trace (a window per rank), then the steps (a window per rank and step)
    windows(ridx[rfirst], np.full(len(rfirst), -1, dtype=np.int64), sweep(ridx, s, e, k, launch))
    m = step_ok
    if m.any():
        sr, ss = ridx[m], step[m]
        first = np.r_[True, (sr[1:] != sr[:-1]) | (ss[1:] != ss[:-1])]
        sw = np.cumsum(first) - 1
        wr, wg = sr[first], ss[first]
        del sr, ss, first
        if m.all():  # every op in a step (no copies)
            windows(wr, wg, sweep(sw, s, e, k, launch))
        else:
            windows(wr, wg, sweep(sw, s[m], e[m], k[m], launch[m]))
    wr, wg, ws, we, p, idle = (np.concatenate([x[j] for x in parts]) for j in range(6))
    cols = {"rank": wr, "grp": wg, "window_start_ns": ws, "window_end_ns": we}
    cols.update({f"{lab}_ns": p[:, j] for j, lab in enumerate(LABELS)})
    cols.update({f"idle_{c}_ns": idle[:, j] for j, c in enumerate(IDLE_CLASSES)})
    return pa.table(cols), (pa.concat_tables(out_gaps) if gaps else None)


FEW_THREADS = 64
"""A rank with up to this many threads holding launchers is searched thread by thread (the ingest's
case: less memory than one search over every thread's stretch, the same answers)."""


def _one_rank_threads(grank, rrank, track) -> np.ndarray | None:
    """The threads (tracks other than NONE) of the ranges when the GPU ops and ranges are of one
    rank and they are at most FEW_THREADS; else None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    r = np.r_[grank[:1], rrank[:1]]
    if not len(r) or (r != r[0]).any() or (len(grank) and (grank.min() != grank.max())) or \
            (len(rrank) and (rrank.min() != rrank.max())):
        return None
    t = pc.unique(pa.array(track)).to_numpy()
    t = np.sort(t[t != NONE])
    return t if len(t) <= FEW_THREADS else None


def launchers(grank, lt, ls, le, kind, rrank, track, s, e) -> dict[int, np.ndarray]:
    """The launchers of GPU ops (module docstring): per op (``grank``: its rank; ``lt``, ``ls``,
    ``le``: its launch call's track, start and end, NONE when not linked or unknown) among the
    candidate ranges (``kind`` 0 = cpu_op, 1 = user_annotation other than ProfilerStep#N; ``rrank``,
    ``track`` (NONE for none), start ``s``, end ``e``); int64 numpy arrays.

    Returns {0: cpu_op index, 1: annotation index}: per GPU op the index of its innermost
    enclosing range of that kind, −1 where none encloses (or the op has no launch call)."""
    q = np.flatnonzero((ls != NONE) & (le != NONE) & (lt != NONE))
    threads = _one_rank_threads(grank, rrank, track)
    if threads is not None:  # one rank, a few threads: thread by thread, no copies of the whole rank
        found = {kd: np.full(len(grank), -1, dtype=np.int64) for kd in (0, 1)}
        qt = lt[q]
        for t in threads:
            qq = q[qt == t]
            if not len(qq):
                continue
            for kd in (0, 1):
                sel = np.flatnonzero((track == t) & (kind == kd))
                hit = innermost_enclosing(s[sel], e[sel], ls[qq], le[qq])
                found[kd][qq[hit >= 0]] = sel[hit[hit >= 0]]
                del sel, hit
        return found
    found = {}
    for kd in (0, 1):
        # a range without a thread encloses nothing (NULL = NULL is not true in SQL either)
        sel = np.flatnonzero((kind == kd) & (track != NONE))
        found[kd] = f = np.full(len(grank), -1, dtype=np.int64)
        hit = _enclosing(rrank[sel], track[sel], s[sel], e[sel], grank[q], lt[q], ls[q], le[q])
        f[q[hit >= 0]] = sel[hit[hit >= 0]]
        del sel, hit
    return found


LAUNCHER_KINDS = ("cpu_op", "annotation")
"""launcher_kind values, in the order of :func:`launchers`' kinds (0, 1)."""


def launcher_sums(grank, dur, k, names: dict):
    """GPU time per rank and launcher, what gpu_time_by_launcher sums over ranks: ``grank``,
    ``dur`` (ns), ``k`` (class code: 0 compute, 1 comm) per GPU op, ``names`` {0: cpu_op name,
    1: annotation name} per GPU op (pyarrow string or dictionary arrays, null where it has none).

    Returns a pyarrow table (rank, launcher_kind, launcher, gpu_ops, gpu_total_ns, compute_ns,
    comm_ns), one row per rank, kind and launcher name (a null name one row of its own): the ops,
    the sum of their durations and its parts in class compute and comm (int64 ns; bincount sums,
    exact below 2^53 ns per launcher). Memory: ranks × distinct names counters per kind."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(grank) and grank.min() == grank.max():  # one rank (the ingest's case): no sort
        ranks, ri = grank[:1], np.zeros(len(grank), dtype=np.int64)
    else:
        ranks, ri = np.unique(grank, return_inverse=True)
        ri = ri.reshape(-1)
    out = []
    for kd, kname in enumerate(LAUNCHER_KINDS):
        codes, dictionary = _name_codes(names[kd])
        nd = len(dictionary) + 1  # code 0: no name
        key = ri * nd + codes + 1
        keys = None
        if len(ranks) * nd > 4 * len(key) + 4096:  # many ranks × names: counters only for the keys there are
            keys, key = np.unique(key, return_inverse=True)
            key = key.reshape(-1)
        size = len(ranks) * nd if keys is None else len(keys)
        # sums of int64 ns as float64: exact below 2^53 ns (104 days) per launcher
        n = np.bincount(key, minlength=size)
        present = np.flatnonzero(n)
        sums = [np.bincount(key, weights=w, minlength=size)[present].astype(np.int64)
                for w in (dur, np.where(k == 0, dur, 0), np.where(k == 1, dur, 0))]
        n = n[present]
        hit = present if keys is None else keys[present]  # the (rank, name) keys present
        code = hit % nd - 1
        out.append(pa.table({"rank": ranks[hit // nd].astype(np.int32),
                             "launcher_kind": pa.array([kname] * len(hit), pa.string()),
                             "launcher": dictionary.take(pa.array(np.maximum(code, 0), mask=code < 0)),
                             "gpu_ops": n.astype(np.int64), "gpu_total_ns": sums[0], "compute_ns": sums[1],
                             "comm_ns": sums[2]}))
    return pa.concat_tables(out)


def _name_codes(col):
    """(codes, dictionary) of a column of names (pyarrow string or dictionary array, chunked or not):
    int64 codes into ``dictionary`` (the distinct names, numbered by first occurrence, as
    ``pyarrow.compute.dictionary_encode`` of the plain strings numbers them), −1 for null. A
    dictionary array is read through its indices, so its names are never made one per row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(col.type):
        enc = pc.dictionary_encode(col)
        return pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary
    entry = pc.dictionary_encode(col.dictionary)  # a dictionary's entries may repeat
    raw = pc.fill_null(pc.take(entry.indices, col.indices), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    ok = raw >= 0
    u, first = np.unique(raw[ok], return_index=True)
    order = np.argsort(first, kind="stable")  # the distinct names by first occurrence
    renum = np.empty(len(u), dtype=np.int64)
    renum[order] = np.arange(len(u))
    raw[ok] = renum[np.searchsorted(u, raw[ok])]
    return raw, entry.dictionary.take(pa.array(u[order]))


def launcher_names(found: np.ndarray, names, null: np.ndarray | None = None, plain: bool = True):
    """Per GPU op the name of the range ``found`` (indices into ``names``, a pyarrow array of the
    candidate ranges' names, any string type; −1 for none) as a pyarrow string array, null where
    none was found or ``null`` (a bool mask) says so; with ``plain`` false, as ``names`` holds them
    (a dictionary array stays one: no string per op)."""
    import pyarrow as pa

    miss = found < 0 if null is None else (found < 0) | null
    got = names.take(pa.array(np.where(miss, 0, found), mask=miss))
    return got.cast(pa.string()) if plain else got


def summaries(gpu: dict, launch: tuple, ranges: dict):
    """The stored summaries of one or more ranks: (windows, launcher sums) as :func:`breakdown`'s
    windows table (None without GPU work) and :func:`launcher_sums`' table.

    ``gpu``: the GPU ops, sorted as :func:`breakdown` needs, numpy arrays rank, s, dur, k, step,
    step_ok; ``launch``: their launch calls' (track, start, end), NONE where unknown; ``ranges``:
    the candidate launchers, numpy arrays kind, rank, track, s, e and ``name`` (pyarrow); emptied
    once searched (pass the only references: they are let go before the sweep)."""
    lt, ls, le = launch
    found = launchers(gpu["rank"], lt, ls, le, ranges["kind"], ranges["rank"], ranges["track"], ranges["s"],
                      ranges["e"])
    names = {kd: launcher_names(f, ranges["name"], plain=False) for kd, f in found.items()}
    del found
    ranges.clear()  # the ranges go before the sweep (memory: the larger of the two, not both)
    sums = launcher_sums(gpu["rank"], gpu["dur"], gpu["k"], names)
    del names
    wins, _ = breakdown(gpu["rank"], gpu["s"], gpu["dur"], gpu["k"], gpu["step"], gpu["step_ok"], ls, gaps=False)
    return wins, sums
