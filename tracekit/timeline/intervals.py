"""Union lengths of two interval sets per window, from spans streamed in start order; one rank's
overlap summaries built on them (:func:`rank_overlap_summary`, made at ingest); and the
innermost range enclosing each of a set of points (:func:`innermost_enclosing`).

For windows w (a key: here (rank, step) or (rank, whole trace)) and intervals tagged A or
B (communication or compute), :class:`UnionLengths` gives per window

    a_ns  = |∪A|,   b_ns = |∪B|,   ab_ns = |∪A ∩ ∪B| = |∪A| + |∪B| − |∪A ∪ ∪B|

(ns, exact int64). The method is the sweep of DESIGN.md's overlap definitions: taken in
order of start, an interval adds to a union the part of it past the latest end seen
before it, max(e − max(s, prev_end), 0); a union's length is the sum of those parts. So
one pass over intervals sorted by start gives all three lengths, with per window only
three running maxima and three sums kept — the memory does not grow with the number of
intervals, only with the number of windows.

Input comes in batches (numpy arrays of equal length): ``keys`` (a tuple of int64 arrays,
together naming the window), ``s``/``e`` (int64 ns, e >= s) and ``in_a`` (bool). Within
every window the intervals must arrive in non-decreasing start order over the whole stream
(batches included); windows may interleave. :meth:`UnionLengths.add` raises ValueError when a window's start
goes backwards, so an unsorted input never gives a silently wrong length.
"""

from __future__ import annotations

import numpy as np

_MIN = np.iinfo(np.int64).min


def _segment_running_max(v: np.ndarray, first: np.ndarray, sid: np.ndarray) -> np.ndarray:
    """Inclusive running maximum of ``v`` restarted at every segment (``first``: True at a
    segment's first row; ``sid``: the segment number of each row, non-decreasing from 0)."""
    n = len(v)
    lo = int(v.min())
    span = int(v.max()) - lo + 1
    nseg = int(sid[-1]) + 1
    if span * nseg < 2**62:
        # lift segment k by k·span: a later segment's values are all above an earlier one's,
        # so one running maximum never carries a value across a segment boundary
        off = sid * span
        return np.maximum.accumulate((v - lo) + off) - off + lo
    out = np.empty_like(v)  # values too far apart to lift: one segment at a time
    bounds = np.flatnonzero(first).tolist() + [n]
    for a, z in zip(bounds[:-1], bounds[1:]):
        out[a:z] = np.maximum.accumulate(v[a:z])
    return out


class UnionLengths:
    """Streaming |∪A|, |∪B| and |∪A ∩ ∪B| per window (see the module docstring).

    ``add(keys, s, e, in_a)`` takes one batch; ``result()`` → (rows, a_ns, b_ns, ab_ns):
    ``rows`` the window keys as tuples of ints, ascending, the lengths int64 arrays (ns), one
    entry per window that had an interval.
    """

    def __init__(self):
        # per window: [a_sum, b_sum, all_sum, a_max, b_max, all_max, last_start]
        self._state: dict[tuple, list[int]] = {}

    def add(self, keys: tuple, s: np.ndarray, e: np.ndarray, in_a: np.ndarray) -> None:
        if len(s) == 0:
            return
        order = np.lexsort(tuple(reversed(keys)))  # by window; within one, the input (start) order
        keys = tuple(k[order] for k in keys)
        s, e, in_a = s[order], e[order], in_a[order]
        first = np.zeros(len(s), dtype=bool)
        first[0] = True
        for k in keys:
            first[1:] |= k[1:] != k[:-1]
        if len(s) > 1 and (~first[1:] & (s[1:] < s[:-1])).any():
            raise ValueError("intervals out of start order within a window")
        heads = np.flatnonzero(first)
        wins = list(zip(*(k[heads].tolist() for k in keys)))
        state = [self._state.get(w) for w in wins]
        for w, st, s0 in zip(wins, state, s[heads].tolist()):
            if st is not None and s0 < st[6]:
                raise ValueError("intervals out of start order within a window")
        sid = np.cumsum(first) - 1
        nwin = len(wins)
        sums = np.zeros((3, nwin), dtype=np.int64)
        maxes = np.full((3, nwin), _MIN, dtype=np.int64)
        for k, m in enumerate((in_a, ~in_a, None)):
            ss, ee, sd = (s, e, sid) if m is None else (s[m], e[m], sid[m])
            if len(ee) == 0:
                continue
            f = np.ones(len(sd), dtype=bool)
            f[1:] = sd[1:] != sd[:-1]
            fi = np.flatnonzero(f)
            # the latest end of the window's earlier batches, carried into each segment's first row
            carry = np.array([_MIN if state[j] is None else state[j][3 + k] for j in sd[fi].tolist()], dtype=np.int64)
            v = ee.copy()
            v[fi] = np.maximum(v[fi], carry)
            inc = _segment_running_max(v, f, sd)
            prev = np.empty_like(ee)  # the latest end before each interval in its window
            prev[1:] = inc[:-1]
            prev[fi] = carry
            part = np.maximum(ee - np.maximum(ss, prev), 0)
            sums[k, sd[fi]] = np.add.reduceat(part, fi)
            maxes[k, sd[fi]] = inc[np.r_[fi[1:], len(ee)] - 1]
        last = s[np.r_[heads[1:], len(s)] - 1].tolist()
        for j, w in enumerate(wins):
            st = state[j]
            sa, sb, sab = (int(x) for x in sums[:, j])
            ma, mb, mab = (int(x) for x in maxes[:, j])
            if st is None:
                self._state[w] = [sa, sb, sab, ma, mb, mab, last[j]]
            else:
                st[0] += sa
                st[1] += sb
                st[2] += sab
                st[3], st[4], st[5] = max(st[3], ma), max(st[4], mb), max(st[5], mab)
                st[6] = last[j]

    def result(self) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        keys = sorted(self._state)
        rows = [self._state[k] for k in keys]
        a = np.array([r[0] for r in rows], dtype=np.int64)
        b = np.array([r[1] for r in rows], dtype=np.int64)
        both = np.array([r[2] for r in rows], dtype=np.int64)
        return keys, a, b, a + b - both


def innermost_enclosing(s: np.ndarray, e: np.ndarray, t: np.ndarray, te: np.ndarray) -> np.ndarray:
    """For ranges [s, e) of one thread (int64 ns, e > s), the index of the innermost range that
    encloses each query [t, te) (s <= t and e >= te), −1 where none does; int64.

    In O((n + q) log n) without a range join: with the ranges ordered by (start, longer first,
    input order), a range's depth is its position in that order (1-based) minus the ranges that
    ended at or before its start (the ranges open at its start, itself included: its nesting depth
    when ranges nest); the number open at t is D = #{start <= t} − #{end <= t}; the innermost
    enclosing range is the last range of depth D, in that order, starting at or before t. It is
    kept only if it really encloses the query, so ranges that do not nest properly give −1, never
    a wrong range.
    """
    out = np.full(len(t), -1, dtype=np.int64)
    n = len(s)
    if n == 0 or len(t) == 0:
        return out
    o = np.lexsort((np.arange(n), -e, s))
    so = s[o]
    ends = np.sort(e)
    started = np.searchsorted(so, t, side="right")  # #{start <= t}: the last such range is at started − 1
    d = started - np.searchsorted(ends, t, side="right")
    key = np.searchsorted(ends, so, side="right")  # ranges ended by each one's start
    del so, ends
    # depth = position (1-based) − key; (depth, position) as one key, built in place:
    # the answer is the last range of depth d at or before position started − 1
    pos = np.arange(n)
    np.subtract(pos + 1, key, out=key)
    key *= n
    key += pos
    del pos
    by = np.argsort(key, kind="stable")
    keys = key[by]
    del key
    j = np.searchsorted(keys, d * n + started - 1, side="right") - 1
    hit = (d > 0) & (j >= 0)
    j = np.where(hit, j, 0)
    r = o[by[j]]
    hit &= (keys[j] // n == d) & (s[r] <= t) & (e[r] >= te)
    out[hit] = r[hit]
    return out


SUMMARY_CHUNK = 65_536
"""Spans :func:`rank_overlap_summary` hands the sweep at once."""


def rank_overlap_summary(run_id: str, rank: int, ev, is_comm: np.ndarray, comm_names, recv_ids: np.ndarray):
    """One rank's overlap summaries from its comm and compute events: the per-window lengths that
    ``overlap_windows`` and ``pipeline_bubbles`` report and the per-span overlap that
    ``collective_overlap`` reports (analyses/overlap.sql), computed once per rank — at ingest by
    :func:`tracekit.ingest.assemble.assemble_rank` from the rows the link pass writes (the analyses
    read the stored rows only).

    ``ev``: a pyarrow table of the rank's events of class comm or compute, columns ``event_id``,
    ``ts_ns``, ``dur_ns``, ``step`` (events' types, any row order); ``is_comm``: bool per row (comm,
    else compute); ``comm_names``: the names of the comm rows, in row order (pyarrow strings);
    ``recv_ids``: int64 event ids of the rank's recv collectives (collectives.event_id where
    op = 'recv').

    A span is a row with ts_ns and dur_ns set and dur_ns >= 0 ([ts, ts + dur), as
    ``merge_intervals`` in analyses/intervals.sql keeps them). Windows: the whole trace (grp = −1,
    always present) and each profiler step of a row with a ts (grp = step). Returns
    (windows, spans): pyarrow tables of tracekit.store's OVERLAP_SUMMARY_SCHEMA and
    SPAN_OVERLAP_SCHEMA (``run_id``, ``rank`` first), holding:

    windows (one row per window, grp ascending): ``grp``; ``spans`` (spans in the window);
    ``comm_ns`` = |∪ comm|, ``compute_ns`` = |∪ compute|, ``overlap_ns`` = |∪ comm ∩ ∪ compute|
    (:class:`UnionLengths`, the sweep of DESIGN.md's overlap definitions); ``recv_ns`` =
    |∪ recv spans| and ``recv_hidden_ns`` = |∪ recv ∩ ∪ compute| (steps only, 0 for grp = −1; the
    same sweep with the recv spans as A); ``first_ns`` = min ts_ns and ``last_ns`` = max
    ts_ns + dur_ns of the window's rows (NULL when none has them). All int64 ns.

    spans (one row per comm row, event_id ascending): ``event_id``, ``name``, ``ts_ns``,
    ``dur_ns``, ``overlap_ns`` = C(ts + dur) − C(ts) with C(t) = |∪ compute ∩ (−∞, t]| over the
    whole trace (the covered-length prefix of intervals.sql's ``island_prefix``; C of a NULL is 0,
    as the view's ASOF join without a match gives).

    Lengths and C are shift-invariant: a clock offset added to every ts of the rank afterwards
    changes only ``first_ns``, ``last_ns`` and spans' ``ts_ns`` (the ingest shifts those three).
    Raises ValueError as :meth:`UnionLengths.add` (never for this input: it is sorted here).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from tracekit.store import OVERLAP_SUMMARY_SCHEMA, SPAN_OVERLAP_SCHEMA

    def ints(name):
        c = ev.column(name)
        return pc.fill_null(c, 0).to_numpy().astype(np.int64), c.is_valid().to_numpy(zero_copy_only=False)

    is_comm = np.asarray(is_comm, dtype=bool)
    eid = ints("event_id")[0]
    ts, ts_ok = ints("ts_ns")
    dur, dur_ok = ints("dur_ns")
    step, step_ok = ints("step")
    end = ts + dur
    span = ts_ok & dur_ok & (dur >= 0)
    in_step = span & step_ok
    recv = np.isin(eid, recv_ids) & is_comm & in_step

    o = np.flatnonzero(span)
    o = o[np.argsort(ts[o], kind="stable")]  # start order, as UnionLengths needs
    so = o[step_ok[o]]
    # one sweep, windows keyed (set, grp): set 0 = comm (A) and compute (B) over the whole trace and
    # each step; set 1 = the steps' recv spans (A) and compute spans (B). Each part is in start order.
    # Fed SUMMARY_CHUNK rows at a time (the sweep's temporaries: ~150 B per row fed at once).
    rv = o[(recv | (~is_comm & in_step))[o]]
    acc = UnionLengths()
    for kset, rows, flag in ((0, o, is_comm), (0, so, is_comm), (1, rv, recv)):
        for i in range(0, len(rows), SUMMARY_CHUNK):
            r = rows[i:i + SUMMARY_CHUNK]
            g = np.full(len(r), -1, dtype=np.int64) if rows is o else step[r]
            acc.add((np.full(len(r), kset, dtype=np.int64), g), ts[r], end[r], flag[r])
    keys, a_ns, b_ns, ab_ns = acc.result()
    sets = np.array([k[0] for k in keys], dtype=np.int64)
    wins = [(k[1],) for k in keys if k[0] == 0]
    cm, cp, ov = a_ns[sets == 0], b_ns[sets == 0], ab_ns[sets == 0]
    rwins = [(k[1],) for k in keys if k[0] == 1]
    rn, rh = a_ns[sets == 1], ab_ns[sets == 1]

    grps = np.unique(np.r_[-1, step[ts_ok & step_ok]]).astype(np.int64)
    n = len(grps)

    def put(keys, vals):
        out = np.zeros(n, dtype=np.int64)
        if len(keys):
            out[np.searchsorted(grps, np.array([k[0] for k in keys], dtype=np.int64))] = vals
        return out

    cnt = put([(-1,)], [int(span.sum())])
    if in_step.any():
        sg, sc = np.unique(step[in_step], return_counts=True)
        cnt += put([(g,) for g in sg.tolist()], sc)
    # first start / last end per window: the whole trace, then per step (reduceat over sorted steps)
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, _MIN, dtype=np.int64)
    both = ts_ok & dur_ok
    if ts_ok.any():
        first[0] = ts[ts_ok].min()
    if both.any():
        last[0] = end[both].max()
    for m, v, out, red in ((ts_ok & step_ok, ts, first, np.minimum), (both & step_ok, end, last, np.maximum)):
        if m.any():
            g, x = step[m], v[m]
            k = np.argsort(g, kind="stable")
            g, x = g[k], x[k]
            heads = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
            out[np.searchsorted(grps, g[heads])] = red.reduceat(x, heads)
    windows = pa.table({
        "grp": grps, "spans": cnt,
        "comm_ns": put(wins, cm), "compute_ns": put(wins, cp), "overlap_ns": put(wins, ov),
        "recv_ns": put(rwins, rn), "recv_hidden_ns": put(rwins, rh),
        "first_ns": pa.array(first, mask=first == np.iinfo(np.int64).max),
        "last_ns": pa.array(last, mask=last == _MIN),
    })

    # C(t) over the whole trace's compute islands (merged in start order, touching ones joined)
    c = o[~is_comm[o]]
    cs, ce = ts[c], np.maximum.accumulate(end[c]) if len(c) else end[c]
    heads = np.flatnonzero(np.r_[True, cs[1:] > ce[:-1]]) if len(c) else np.zeros(0, dtype=np.int64)
    i_s = cs[heads]
    i_e = ce[np.r_[heads[1:], len(c)] - 1] if len(c) else cs[heads]
    cum = np.r_[0, np.cumsum(i_e - i_s)[:-1]] if len(c) else i_s

    def covered(t, ok):
        j = np.searchsorted(i_s, t, side="right") - 1
        hit = ok & (j >= 0)
        jj = np.maximum(j, 0)
        if not len(i_s):
            return np.zeros(len(t), np.int64)
        return np.where(hit, cum[jj] + np.minimum(t, i_e[jj]) - i_s[jj], 0)

    k = np.flatnonzero(is_comm)
    by_id = np.argsort(eid[k], kind="stable")
    k = k[by_id]
    t0, t1 = ts[k], end[k]
    ok0, ok1 = ts_ok[k], both[k]
    spans = pa.table({
        "event_id": eid[k],
        "name": (comm_names if isinstance(comm_names, pa.ChunkedArray) else pa.chunked_array([comm_names]))
        .take(pa.array(by_id)).cast(pa.string()) if len(k) else pa.array([], pa.string()),
        "ts_ns": pa.array(t0, mask=~ok0),
        "dur_ns": pa.array(dur[k], mask=~(ok0 & dur_ok[k])),
        "overlap_ns": covered(t1, ok1) - covered(t0, ok0),
    })
    return (_with_rank(run_id, rank, windows, OVERLAP_SUMMARY_SCHEMA),
            _with_rank(run_id, rank, spans, SPAN_OVERLAP_SCHEMA))


def _with_rank(run_id: str, rank: int, t, schema):
    """``t`` with the columns run_id and rank in front, as a table of ``schema`` (whose other columns
    ``t`` has, in order, with their types)."""
    import pyarrow as pa

    n = t.num_rows
    fixed = [pa.array([run_id], pa.string()).take(pa.array(np.zeros(n, dtype=np.int32))),
             pa.array(np.full(n, rank, dtype=np.int32))]
    return pa.Table.from_arrays(fixed + [t.column(i) for i in range(t.num_columns)], schema=schema)
