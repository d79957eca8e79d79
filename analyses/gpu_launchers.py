"""gpu_launchers: per GPU op, the CPU op and the record_function range that launched it — a Python
analysis.

Reads: events

GPU ops = events on GPU tracks (track_kind = 'gpu_stream': kernels, memcpy, memset, sync), one row
each. Their launch call is events.launch_event_id (the runtime call); the launchers are the
innermost cpu_op and the innermost user_annotation other than ProfilerStep#N (record_function) that
enclose that call on the launch's thread (same track), each kind on its own.

The innermost enclosing range of a point t on a thread, in O(n log n) without a range join: with the
thread's ranges of one kind ordered by (start, longer first, event_id), a range's depth is its
position in that order (1-based) minus the ranges that ended at or before its start (ranges open at
its start, itself included: its nesting depth when ranges nest); the number open at t is
D = #{start <= t} − #{end <= t}; the innermost enclosing range is the last range of depth D
starting at or before t (:func:`innermost`, binary searches in numpy). It is kept only if it really
encloses the launch (start <= t, end >= the launch's end), so ranges that do not nest properly give
NULL, never a wrong op. Zero-length ranges are left out: they enclose no launch of positive length,
and one that starts where a range starts would sort after it yet count as ended before it.

How: per (run, rank), the ranges (track, kind, start, end, event_id) and the distinct launch calls
of GPU ops (track, event_id, start, end) are fetched once from DuckDB and searched per (track,
kind) in numpy; the launchers' names are joined back in DuckDB. A table, built once per connection
(kernel_summary's gpu_time_by_launcher aggregates it).

gpu_launchers: one row per GPU op.

run_id          VARCHAR  run
rank            INTEGER  global rank
event_id        BIGINT   the GPU op (events.event_id)
launch_event_id BIGINT   its runtime launch call; NULL when not linked
cpu_op_id       BIGINT   innermost cpu_op enclosing the launch (events.event_id); NULL when none
cpu_op          VARCHAR  its name
annotation_id   BIGINT   innermost user_annotation (record_function) enclosing the launch; NULL when none
annotation      VARCHAR  its name
"""

from __future__ import annotations

import numpy as np

_RANGES = """
SELECT track, (category <> 'cpu_op')::TINYINT AS kind, ts_ns AS s, ts_ns + dur_ns AS e, event_id
FROM events
WHERE run_id = $1 AND rank = $2 AND track_kind = 'cpu_thread' AND dur_ns > 0 AND ts_ns IS NOT NULL
  AND (category = 'cpu_op' OR (category = 'user_annotation' AND name NOT LIKE 'ProfilerStep#%'))
"""
"""The candidate launchers of one rank: kind 0 = cpu_op, 1 = annotation."""

_LAUNCHES = """
SELECT DISTINCT l.track, l.event_id, l.ts_ns AS t, l.ts_ns + l.dur_ns AS te
FROM (SELECT DISTINCT launch_event_id FROM events
      WHERE run_id = $1 AND rank = $2 AND track_kind = 'gpu_stream' AND launch_event_id IS NOT NULL) g
JOIN (SELECT * FROM events WHERE run_id = $1 AND rank = $2) l ON l.event_id = g.launch_event_id
WHERE l.ts_ns IS NOT NULL AND l.dur_ns IS NOT NULL
"""
"""The launch calls of one rank's GPU ops."""


def innermost(s: np.ndarray, e: np.ndarray, t: np.ndarray, te: np.ndarray) -> np.ndarray:
    """For ranges [s, e) of one thread and kind, the index of the innermost range enclosing each
    launch [t, te) (module docstring), −1 where none does. int64 ns inputs; returns int64."""
    out = np.full(len(t), -1, dtype=np.int64)
    if len(s) == 0 or len(t) == 0:
        return out
    o = np.lexsort((np.arange(len(s)), -e, s))  # (start, longer first, input order)
    so, eo = s[o], e[o]
    ends = np.sort(e)
    depth = np.arange(1, len(s) + 1) - np.searchsorted(ends, so, side="right")
    d = np.searchsorted(so, t, side="right") - np.searchsorted(ends, t, side="right")
    # the last range of depth d with start <= t: (depth, start rank) as one key, ranks 1..n
    m = len(s) + 1
    key = depth * m + np.searchsorted(so, so, side="right")
    by = np.argsort(key, kind="stable")
    keys = key[by]
    q = d * m + np.searchsorted(so, t, side="right")
    j = np.searchsorted(keys, q, side="right") - 1
    hit = (d > 0) & (j >= 0)
    j = np.where(hit, j, 0)
    r = o[by[j]]
    hit &= (keys[j] // m == d) & (s[r] <= t) & (e[r] >= te)
    out[hit] = r[hit]
    return out


def _rank_table(con, run_id: str, rank: int):
    """(launch_event_id, cpu_op_id, annotation_id) of one rank's launch calls, a pyarrow table."""
    import pyarrow as pa

    rg = con.sql(_RANGES, params=[run_id, rank]).fetchnumpy()
    ln = con.sql(_LAUNCHES, params=[run_id, rank]).fetchnumpy()
    lt, lid = np.asarray(ln["track"], dtype=np.int64), np.asarray(ln["event_id"], dtype=np.int64)
    t, te = np.asarray(ln["t"], dtype=np.int64), np.asarray(ln["te"], dtype=np.int64)
    rt, rk = np.asarray(rg["track"], dtype=np.int64), np.asarray(rg["kind"], dtype=np.int8)
    rs, re_, rid = (np.asarray(rg[c], dtype=np.int64) for c in ("s", "e", "event_id"))
    found = {0: np.full(len(lid), -1, dtype=np.int64), 1: np.full(len(lid), -1, dtype=np.int64)}  # range index
    lorder = np.argsort(lt, kind="stable")
    ltracks, lstart = np.unique(lt[lorder], return_index=True)
    lbounds = dict(zip(ltracks.tolist(), zip(lstart.tolist(), np.r_[lstart[1:], len(lorder)].tolist())))
    for kind in (0, 1):
        for track in np.unique(rt[rk == kind]).tolist():
            if track not in lbounds:
                continue
            sel = np.flatnonzero((rt == track) & (rk == kind))
            a, z = lbounds[track]
            li = lorder[a:z]
            hit = innermost(rs[sel], re_[sel], t[li], te[li])
            ok = hit >= 0
            found[kind][li[ok]] = sel[hit[ok]]
    rid = np.r_[rid, 0]  # index -1 (none found) picks this placeholder, masked to NULL
    ids = {k: pa.array(rid[f], mask=f < 0) for k, f in found.items()}
    return pa.table({"launch_event_id": lid, "cpu_op_id": ids[0], "annotation_id": ids[1]})


def create(con) -> None:
    """Create the table ``gpu_launchers`` on ``con`` from its ``events``."""
    con.execute("""
        CREATE OR REPLACE TABLE gpu_launchers (run_id VARCHAR, rank INTEGER, event_id BIGINT,
            launch_event_id BIGINT, cpu_op_id BIGINT, cpu_op VARCHAR, annotation_id BIGINT, annotation VARCHAR)""")
    keys = con.execute("SELECT DISTINCT run_id, rank FROM events WHERE track_kind = 'gpu_stream' "
                       "ORDER BY run_id, rank").fetchall()
    for run_id, rank in keys:
        con.register("_gpu_rank_launchers", _rank_table(con, run_id, rank))
        con.execute("""
            INSERT INTO gpu_launchers
            WITH named AS (
                SELECT a.launch_event_id, a.cpu_op_id, c.name AS cpu_op, a.annotation_id, u.name AS annotation
                FROM _gpu_rank_launchers a
                LEFT JOIN (SELECT event_id, name FROM events
                           WHERE run_id = $1 AND rank = $2 AND category = 'cpu_op') c ON c.event_id = a.cpu_op_id
                LEFT JOIN (SELECT event_id, name FROM events
                           WHERE run_id = $1 AND rank = $2 AND category = 'user_annotation') u
                       ON u.event_id = a.annotation_id)
            SELECT g.run_id, g.rank, g.event_id, g.launch_event_id, n.cpu_op_id, n.cpu_op, n.annotation_id, n.annotation
            FROM (SELECT * FROM events WHERE run_id = $1 AND rank = $2 AND track_kind = 'gpu_stream') g
            LEFT JOIN named n ON n.launch_event_id = g.launch_event_id""", [run_id, rank])
        con.unregister("_gpu_rank_launchers")
