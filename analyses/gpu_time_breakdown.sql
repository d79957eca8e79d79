-- gpu_time_breakdown: where each rank's GPU time goes, per whole trace and per profiler step, as
-- parts that sum exactly to the window.
-- Reads: events
--
-- GPU work = events on GPU tracks (track_kind = 'gpu_stream') with dur_ns > 0, every stream of the
-- rank together. A window (grp) is the whole trace (grp = -1: all of the rank's GPU work) or one
-- profiler step (grp = step: the GPU work launched in that step, events.step); it spans from the
-- first start to the last end of that work, as HTA's temporal breakdown does ("kernel time" =
-- end of the last kernel − start of the first; HTA 0.5, BreakdownAnalysis._get_idle_time_for_kernels).
-- So a window never begins or ends idle: its idle time is the gaps between its GPU work.
--
-- Every instant of the window gets exactly one label, by a sweep over the start/end boundaries of
-- the window's spans (+1/−1 counters per class; the segment between consecutive boundaries is
-- labelled by the counters after the first of them), first rule that applies:
--   comm ∧ compute                    → comm_hidden   (communication hidden behind compute)
--   compute                           → compute_only
--   comm                              → comm_exposed  (the overlap module's exposed_comm, on GPU work)
--   memory (memcpy/memset)            → memory
--   sync                              → sync
--   any other GPU event (class other) → other
--   nothing                           → idle
-- so compute_only + comm_hidden = |∪ compute| (HTA's compute_time), comm_hidden + comm_exposed =
-- |∪ comm|, and the seven parts sum to window_ns exactly (int64 ns, no rounding).
--
-- Idle is split as HTA's idle-time breakdown does (HTA 0.5 docs, "Idle Time Breakdown";
-- BreakdownAnalysis._analyze_idle_time_for_stream), applied to the gaps of the rank's union of
-- streams rather than per stream: a gap [s, e) is
--   host_wait   when the CPU launch of the work that ends the gap (events.launch_event_id → the
--               runtime call's ts_ns; the earliest such launch when several spans start at e)
--               started after the gap began (launch ts > s): the host was not enqueuing fast enough;
--   kernel_wait otherwise, when e − s < 30 ns (HTA's default consecutive_kernel_delay, 30 ns): the
--               overhead of launching back-to-back kernels;
--   other       otherwise (waiting on another stream, an event, a sync, or work without a launch link).
-- A run without GPU tracks (CPU-only gloo traces) has no rows.
--
-- gpu_idle_gaps: one row per idle gap of a window.
--
-- run_id      VARCHAR  run
-- rank        INTEGER  global rank
-- grp         BIGINT   -1 = whole trace, else the profiler step number
-- s           BIGINT   gap start (end of the GPU work before it), ns
-- e           BIGINT   gap end (start of the GPU work after it), ns
-- idle_ns     BIGINT   e − s, ns
-- launch_ts_ns BIGINT  earliest CPU launch (runtime call start) of the spans starting at e, ns; NULL when none is linked
-- idle_class  VARCHAR  host_wait / kernel_wait / other (header above)
CREATE OR REPLACE VIEW _gpu_work AS
SELECT e.run_id, e.rank, e.class, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e, e.step, l.ts_ns AS launch_ts_ns
FROM events e
LEFT JOIN events l ON l.run_id = e.run_id AND l.rank = e.rank AND l.event_id = e.launch_event_id
WHERE e.track_kind = 'gpu_stream' AND e.dur_ns > 0;

CREATE OR REPLACE VIEW _gpu_work_windows AS
SELECT run_id, rank, -1::BIGINT AS grp, class, s, e, launch_ts_ns FROM _gpu_work
UNION ALL
SELECT run_id, rank, step, class, s, e, launch_ts_ns FROM _gpu_work WHERE step IS NOT NULL;

CREATE OR REPLACE VIEW _gpu_segments AS
WITH pts AS (
    SELECT run_id, rank, grp, s AS t,
           (class = 'compute')::INTEGER AS d_compute, (class = 'comm')::INTEGER AS d_comm,
           (class = 'memory')::INTEGER AS d_memory, (class = 'sync')::INTEGER AS d_sync,
           (class NOT IN ('compute', 'comm', 'memory', 'sync'))::INTEGER AS d_other
    FROM _gpu_work_windows
    UNION ALL
    SELECT run_id, rank, grp, e,
           -(class = 'compute')::INTEGER, -(class = 'comm')::INTEGER,
           -(class = 'memory')::INTEGER, -(class = 'sync')::INTEGER,
           -(class NOT IN ('compute', 'comm', 'memory', 'sync'))::INTEGER
    FROM _gpu_work_windows
),
agg AS (
    SELECT run_id, rank, grp, t, sum(d_compute) AS d_compute, sum(d_comm) AS d_comm,
           sum(d_memory) AS d_memory, sum(d_sync) AS d_sync, sum(d_other) AS d_other
    FROM pts GROUP BY run_id, rank, grp, t
),
sweep AS (
    SELECT run_id, rank, grp, t AS s,
           lead(t) OVER (PARTITION BY run_id, rank, grp ORDER BY t) AS e,
           sum(d_compute) OVER w AS n_compute, sum(d_comm) OVER w AS n_comm,
           sum(d_memory) OVER w AS n_memory, sum(d_sync) OVER w AS n_sync, sum(d_other) OVER w AS n_other
    FROM agg
    WINDOW w AS (PARTITION BY run_id, rank, grp ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT run_id, rank, grp, s, e,
       CASE WHEN n_comm > 0 AND n_compute > 0 THEN 'comm_hidden'
            WHEN n_compute > 0 THEN 'compute_only'
            WHEN n_comm > 0 THEN 'comm_exposed'
            WHEN n_memory > 0 THEN 'memory'
            WHEN n_sync > 0 THEN 'sync'
            WHEN n_other > 0 THEN 'other'
            ELSE 'idle' END AS label
FROM sweep WHERE e IS NOT NULL;

CREATE OR REPLACE VIEW gpu_idle_gaps AS
WITH gaps AS (SELECT run_id, rank, grp, s, e FROM _gpu_segments WHERE label = 'idle'),
nxt AS (
    SELECT g.run_id, g.rank, g.grp, g.s, g.e, min(w.launch_ts_ns) AS launch_ts_ns
    FROM gaps g JOIN _gpu_work_windows w
      ON w.run_id = g.run_id AND w.rank = g.rank AND w.grp = g.grp AND w.s = g.e
    GROUP BY g.run_id, g.rank, g.grp, g.s, g.e
)
SELECT run_id, rank, grp, s, e, e - s AS idle_ns, launch_ts_ns,
       CASE WHEN launch_ts_ns > s THEN 'host_wait'
            WHEN e - s < 30 THEN 'kernel_wait'
            ELSE 'other' END AS idle_class
FROM nxt;

-- gpu_time_breakdown: one row per rank and window; the seven parts before idle_host_wait_ns sum to
-- window_ns, and the three idle classes sum to idle_ns.
--
-- run_id              VARCHAR  run
-- rank                INTEGER  global rank
-- grp                 BIGINT   -1 = whole trace, else the profiler step number
-- window_start_ns     BIGINT   start of the window's first GPU work, ns
-- window_end_ns       BIGINT   end of its last GPU work, ns
-- window_ns           BIGINT   window_end_ns − window_start_ns, ns
-- compute_only_ns     BIGINT   compute and no communication, ns
-- comm_exposed_ns     BIGINT   communication with no compute under it, ns
-- comm_hidden_ns      BIGINT   communication overlapped by compute, ns
-- memory_ns           BIGINT   memcpy/memset and no compute or communication, ns
-- sync_ns             BIGINT   sync events only, ns
-- other_ns            BIGINT   other GPU events only, ns
-- idle_ns             BIGINT   no GPU activity, ns
-- idle_host_wait_ns   BIGINT   idle gaps classed host_wait (gpu_idle_gaps), ns
-- idle_kernel_wait_ns BIGINT   idle gaps classed kernel_wait, ns
-- idle_other_ns       BIGINT   idle gaps classed other, ns
-- idle_fraction       DOUBLE   idle_ns / window_ns; NULL when window_ns = 0
CREATE OR REPLACE TABLE gpu_time_breakdown AS
WITH parts AS (
    SELECT run_id, rank, grp, min(s) AS window_start_ns, max(e) AS window_end_ns,
           sum(CASE WHEN label = 'compute_only' THEN e - s ELSE 0 END)::BIGINT AS compute_only_ns,
           sum(CASE WHEN label = 'comm_exposed' THEN e - s ELSE 0 END)::BIGINT AS comm_exposed_ns,
           sum(CASE WHEN label = 'comm_hidden' THEN e - s ELSE 0 END)::BIGINT AS comm_hidden_ns,
           sum(CASE WHEN label = 'memory' THEN e - s ELSE 0 END)::BIGINT AS memory_ns,
           sum(CASE WHEN label = 'sync' THEN e - s ELSE 0 END)::BIGINT AS sync_ns,
           sum(CASE WHEN label = 'other' THEN e - s ELSE 0 END)::BIGINT AS other_ns,
           sum(CASE WHEN label = 'idle' THEN e - s ELSE 0 END)::BIGINT AS idle_ns
    FROM _gpu_segments GROUP BY run_id, rank, grp
),
idle AS (
    SELECT run_id, rank, grp,
           sum(CASE WHEN idle_class = 'host_wait' THEN idle_ns ELSE 0 END)::BIGINT AS idle_host_wait_ns,
           sum(CASE WHEN idle_class = 'kernel_wait' THEN idle_ns ELSE 0 END)::BIGINT AS idle_kernel_wait_ns,
           sum(CASE WHEN idle_class = 'other' THEN idle_ns ELSE 0 END)::BIGINT AS idle_other_ns
    FROM gpu_idle_gaps GROUP BY run_id, rank, grp
)
SELECT p.run_id, p.rank::INTEGER AS rank, p.grp, p.window_start_ns, p.window_end_ns,
       (p.window_end_ns - p.window_start_ns)::BIGINT AS window_ns,
       p.compute_only_ns, p.comm_exposed_ns, p.comm_hidden_ns, p.memory_ns, p.sync_ns, p.other_ns, p.idle_ns,
       coalesce(i.idle_host_wait_ns, 0)::BIGINT AS idle_host_wait_ns,
       coalesce(i.idle_kernel_wait_ns, 0)::BIGINT AS idle_kernel_wait_ns,
       coalesce(i.idle_other_ns, 0)::BIGINT AS idle_other_ns,
       CASE WHEN p.window_end_ns > p.window_start_ns
            THEN p.idle_ns / (p.window_end_ns - p.window_start_ns) END AS idle_fraction
FROM parts p LEFT JOIN idle i USING (run_id, rank, grp)
ORDER BY p.run_id, p.rank, p.grp;
