"""gpu_time_breakdown: where each rank's GPU time goes, per whole trace and per profiler step, as
parts that sum exactly to the window — a Python analysis.

Reads: events

GPU work = events on GPU tracks (track_kind = 'gpu_stream') with dur_ns > 0, every stream of the
rank together. A window (grp) is the whole trace (grp = -1: all of the rank's GPU work) or one
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

How: per (run, rank), the GPU work is fetched once from DuckDB (start, end, class, step and the
launch call's start, a few columns per GPU op) and swept in numpy (:func:`sweep`): the boundaries
of every window sorted once, running class counters as cumulative sums, the segments' lengths summed
per window and label. Memory grows with one rank's GPU ops, not with the other events.

gpu_idle_gaps: one row per idle gap of a window (a table).

run_id      VARCHAR  run
rank        INTEGER  global rank
grp         BIGINT   -1 = whole trace, else the profiler step number
s           BIGINT   gap start (end of the GPU work before it), ns
e           BIGINT   gap end (start of the GPU work after it), ns
idle_ns     BIGINT   e − s, ns
launch_ts_ns BIGINT  earliest CPU launch (runtime call start) of the spans starting at e, ns; NULL when none is linked
idle_class  VARCHAR  host_wait / kernel_wait / other (header above)

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
_NONE = np.iinfo(np.int64).max  # "no launch linked" inside the sweep

_WORK = """
SELECT e.ts_ns AS s, e.ts_ns + e.dur_ns AS e,
       CASE e.class WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 WHEN 'memory' THEN 2 WHEN 'sync' THEN 3
                    ELSE CASE WHEN e.class IS NULL THEN 5 ELSE 4 END END::TINYINT AS k,
       e.step, l.ts_ns AS launch_ts_ns
FROM (SELECT * FROM events WHERE run_id = $1 AND rank = $2 AND track_kind = 'gpu_stream' AND dur_ns > 0) e
LEFT JOIN (SELECT event_id, ts_ns FROM events WHERE run_id = $1 AND rank = $2) l
       ON l.event_id = e.launch_event_id
"""


def sweep(grp: np.ndarray, s: np.ndarray, e: np.ndarray, k: np.ndarray, launch: np.ndarray):
    """Label the windows of one rank. Spans: window ``grp``, start ``s`` < end ``e`` (int64 ns),
    class code ``k`` (0–3 = _CLASSES, 4 other, 5 NULL), ``launch`` the launch call's start
    (int64 ns, _NONE when not linked).

    Returns (windows, parts, gaps): ``windows`` = (grp, start, end) int64 arrays, one entry per
    window ascending; ``parts`` an int64 array (windows × LABELS) of labelled lengths (ns);
    ``gaps`` = (window index, s, e, launch, idle class code) arrays, one entry per idle gap in
    (window, s) order.
    """
    n = len(s)
    order = np.lexsort((np.concatenate((s, e)), np.concatenate((grp, grp))))
    t = np.concatenate((s, e))[order]
    g = np.concatenate((grp, grp))[order]
    is_start = order < n
    kk = np.concatenate((k, k))[order]
    # one boundary per distinct (window, t); the counters after it = cumulative deltas up to its last point
    head = np.ones(len(t), dtype=bool)
    head[1:] = (t[1:] != t[:-1]) | (g[1:] != g[:-1])
    hi = np.flatnonzero(head)
    last = np.r_[hi[1:], len(t)] - 1
    delta = np.where(is_start, 1, -1).astype(np.int32)
    open_ = np.zeros((5, len(hi)), dtype=bool)
    for c in range(5):  # every window closes all its spans, so one running sum serves all windows
        open_[c] = np.cumsum(np.where(kk == c, delta, 0))[last] > 0
    cm, cp = open_[1], open_[0]
    label = np.select([cm & cp, cp, cm, open_[2], open_[3], open_[4]], [2, 0, 1, 3, 4, 5], default=6)
    bt, bg = t[hi], g[hi]
    # segment i = [bt[i], bt[i+1]) when both boundaries are in one window
    inside = np.zeros(len(hi), dtype=bool)
    inside[:-1] = bg[1:] == bg[:-1]
    seg_len = np.zeros(len(hi), dtype=np.int64)
    seg_len[:-1] = bt[1:] - bt[:-1]
    whead = np.ones(len(hi), dtype=bool)
    whead[1:] = bg[1:] != bg[:-1]
    wid = np.cumsum(whead) - 1
    wi = np.flatnonzero(whead)
    nwin = len(wi)
    wend = bt[np.r_[wi[1:], len(hi)] - 1]
    parts = np.zeros((nwin, len(LABELS)), dtype=np.int64)
    np.add.at(parts, (wid[inside], label[inside]), seg_len[inside])
    # gaps: idle segments; the spans starting at the gap's end give its launch (earliest linked)
    pl = np.where(is_start, np.concatenate((launch, launch))[order], _NONE)
    bmin = np.minimum.reduceat(pl, hi)
    gi = np.flatnonzero(inside & (label == 6))
    gs, ge, gl = bt[gi], bt[gi + 1], bmin[gi + 1]
    gclass = np.where((gl != _NONE) & (gl > gs), 0, np.where(ge - gs < KERNEL_WAIT_NS, 1, 2))
    return (bg[wi], bt[wi], wend), parts, (wid[gi], gs, ge, gl, gclass)


def _rank_tables(con, run_id: str, rank: int):
    """(windows table, gaps table) of one rank as pyarrow tables, or None without GPU work."""
    import pyarrow as pa
    import pyarrow.compute as pc

    w = con.sql(_WORK, params=[run_id, rank]).to_arrow_table()
    if w.num_rows == 0:
        return None
    s = w.column("s").to_numpy().astype(np.int64)
    e = w.column("e").to_numpy().astype(np.int64)
    k = w.column("k").to_numpy().astype(np.int8)
    launch = pc.fill_null(w.column("launch_ts_ns"), _NONE).to_numpy().astype(np.int64)
    step_ok = w.column("step").is_valid().to_numpy(zero_copy_only=False)
    step = pc.fill_null(w.column("step"), 0).to_numpy().astype(np.int64)
    m = step_ok
    grp = np.concatenate((np.full(len(s), -1, dtype=np.int64), step[m]))
    (wg, ws, we), parts, (gw, gs, ge, gl, gc) = sweep(
        grp, np.concatenate((s, s[m])), np.concatenate((e, e[m])), np.concatenate((k, k[m])),
        np.concatenate((launch, launch[m])))
    idle_by_class = np.zeros((len(wg), len(IDLE_CLASSES)), dtype=np.int64)
    np.add.at(idle_by_class, (gw, gc), ge - gs)
    wins = {"grp": wg, "window_start_ns": ws, "window_end_ns": we}
    wins.update({f"{lab}_ns": parts[:, j] for j, lab in enumerate(LABELS)})
    wins.update({f"idle_{c}_ns": idle_by_class[:, j] for j, c in enumerate(IDLE_CLASSES)})
    gaps = {"grp": wg[gw], "s": gs, "e": ge,
            "launch_ts_ns": pa.array(gl, mask=gl == _NONE),
            "idle_class": pa.DictionaryArray.from_arrays(gc.astype(np.int8), list(IDLE_CLASSES))}
    return pa.table(wins), pa.table(gaps)


def create(con) -> None:
    """Create the tables ``gpu_idle_gaps`` and ``gpu_time_breakdown`` on ``con`` from its ``events``."""
    con.execute("""
        CREATE OR REPLACE TABLE gpu_idle_gaps (run_id VARCHAR, rank INTEGER, grp BIGINT, s BIGINT, e BIGINT,
            idle_ns BIGINT, launch_ts_ns BIGINT, idle_class VARCHAR)""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _gpu_windows (run_id VARCHAR, rank INTEGER, grp BIGINT,
            window_start_ns BIGINT, window_end_ns BIGINT, compute_only_ns BIGINT, comm_exposed_ns BIGINT,
            comm_hidden_ns BIGINT, memory_ns BIGINT, sync_ns BIGINT, other_ns BIGINT, idle_ns BIGINT,
            idle_host_wait_ns BIGINT, idle_kernel_wait_ns BIGINT, idle_other_ns BIGINT)""")
    keys = con.execute("SELECT DISTINCT run_id, rank FROM events WHERE track_kind = 'gpu_stream' AND dur_ns > 0 "
                       "ORDER BY run_id, rank").fetchall()
    for run_id, rank in keys:
        got = _rank_tables(con, run_id, rank)
        if got is None:
            continue
        con.register("_gpu_rank_windows", got[0])
        con.register("_gpu_rank_gaps", got[1])
        con.execute("INSERT INTO _gpu_windows SELECT $run, $rank, * FROM _gpu_rank_windows",
                    {"run": run_id, "rank": rank})
        con.execute("INSERT INTO gpu_idle_gaps SELECT $run, $rank, grp, s, e, e - s, launch_ts_ns, "
                    "idle_class::VARCHAR FROM _gpu_rank_gaps", {"run": run_id, "rank": rank})
        con.unregister("_gpu_rank_windows")
        con.unregister("_gpu_rank_gaps")
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
