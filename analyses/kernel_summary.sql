-- kernel_summary: GPU ops by name per class, and GPU time by the CPU op / record_function range that
-- launched it.
-- Reads: events, gpu_time_breakdown
--
-- GPU ops = events on GPU tracks (track_kind = 'gpu_stream': kernels, memcpy, memset, sync), one
-- row each, durations as stored (dur_ns, after the ingest's stream clipping). Totals are sums of
-- durations, not unions: ops on different streams that run at once each count in full.
--
-- kernel_summary: one row per run, class and op name, all ranks together.
--
-- run_id        VARCHAR  run
-- class         VARCHAR  events.class (compute / comm / memory / sync / other)
-- name          VARCHAR  op name (kernel name, "Memcpy HtoD ...", ...)
-- class_rank    BIGINT   1 = the largest total_ns in its class, 2 = next, ... (ties by name)
-- ranks         BIGINT   ranks that ran it
-- count         BIGINT   ops
-- total_ns      BIGINT   sum of durations, ns
-- mean_ns       DOUBLE   total_ns / count, ns
-- p50_ns        BIGINT   median duration (the lower middle value for an even count: quantile_disc), ns
-- p95_ns        BIGINT   95th-percentile duration (quantile_disc: a duration that occurred), ns
-- max_ns        BIGINT   longest, ns
-- step_total_ns BIGINT   sum of durations of the ops launched in a profiler step (events.step not null), ns
-- step_share    DOUBLE   step_total_ns / the sum of the step windows over ranks and steps (gpu_time_breakdown,
--                        grp >= 0: first start to last end of each step's GPU work); NULL without steps
CREATE OR REPLACE VIEW _gpu_ops AS
SELECT run_id, rank, event_id, class, name, ts_ns, dur_ns, step, launch_event_id
FROM events WHERE track_kind = 'gpu_stream';

CREATE OR REPLACE VIEW kernel_summary AS
WITH steps AS (
    SELECT run_id, sum(window_ns) AS step_window_ns FROM gpu_time_breakdown WHERE grp >= 0 GROUP BY run_id
),
k AS (
    SELECT run_id, class, name, count(DISTINCT rank) AS ranks, count(*) AS count, sum(dur_ns)::BIGINT AS total_ns,
           avg(dur_ns) AS mean_ns, quantile_disc(dur_ns, 0.5) AS p50_ns, quantile_disc(dur_ns, 0.95) AS p95_ns,
           max(dur_ns) AS max_ns,
           coalesce(sum(dur_ns) FILTER (WHERE step IS NOT NULL), 0)::BIGINT AS step_total_ns
    FROM _gpu_ops GROUP BY run_id, class, name
)
SELECT k.run_id, k.class, k.name,
       row_number() OVER (PARTITION BY k.run_id, k.class ORDER BY k.total_ns DESC, k.name) AS class_rank,
       k.ranks, k.count, k.total_ns, k.mean_ns, k.p50_ns::BIGINT AS p50_ns, k.p95_ns::BIGINT AS p95_ns,
       k.max_ns::BIGINT AS max_ns, k.step_total_ns,
       CASE WHEN s.step_window_ns > 0 THEN k.step_total_ns / s.step_window_ns END AS step_share
FROM k LEFT JOIN steps s USING (run_id);

-- gpu_launchers: per GPU op, the CPU op and the record_function range (user_annotation other than
-- ProfilerStep#N) that enclose its launch call (events.launch_event_id: the runtime call) on the
-- launch's thread, the innermost of each.
--
-- The innermost enclosing range of a point t on a thread, in O(n log n) without a range join: with
-- the thread's ranges of one kind ordered by (start, longer first, event_id), a range's depth is
-- its position in that order minus the ranges that ended at or before its start (ranges open at its
-- start, itself included: its nesting depth when ranges nest); the number open at t is D = #{start
-- <= t} − #{end <= t}; the innermost enclosing range is the last range of depth D starting at or
-- before t (ASOF join). It is kept only if it really encloses the launch (start <= t, end >= the
-- launch's end), so ranges that do not nest properly give NULL, never a wrong op. Zero-length
-- ranges are left out: they enclose no launch of positive length, and one that starts where a range
-- starts would sort after it yet count as ended before it.
--
-- run_id          VARCHAR  run
-- rank            INTEGER  global rank
-- event_id        BIGINT   the GPU op (events.event_id)
-- launch_event_id BIGINT   its runtime launch call; NULL when not linked
-- cpu_op_id       BIGINT   innermost cpu_op enclosing the launch (events.event_id); NULL when none
-- cpu_op          VARCHAR  its name
-- annotation_id   BIGINT   innermost user_annotation (record_function) enclosing the launch; NULL when none
-- annotation      VARCHAR  its name
CREATE OR REPLACE VIEW _launch_ranges AS
SELECT run_id, rank, track, CASE WHEN category = 'cpu_op' THEN 'cpu_op' ELSE 'annotation' END AS kind,
       event_id, name, ts_ns AS s, ts_ns + dur_ns AS e
FROM events
WHERE track_kind = 'cpu_thread' AND dur_ns > 0
  AND (category = 'cpu_op' OR (category = 'user_annotation' AND name NOT LIKE 'ProfilerStep#%'));

CREATE OR REPLACE VIEW gpu_launchers AS
WITH launches AS (
    SELECT DISTINCT l.run_id, l.rank, l.track, l.event_id AS launch_event_id, l.ts_ns AS t, l.ts_ns + l.dur_ns AS te
    FROM _gpu_ops g JOIN events l ON l.run_id = g.run_id AND l.rank = g.rank AND l.event_id = g.launch_event_id
),
starts AS (  -- #{start <= x}: cumulative count per distinct start
    SELECT run_id, rank, track, kind, s, sum(count(*)) OVER (PARTITION BY run_id, rank, track, kind ORDER BY s) AS n
    FROM _launch_ranges GROUP BY run_id, rank, track, kind, s
),
ends AS (  -- #{end <= x}
    SELECT run_id, rank, track, kind, e, sum(count(*)) OVER (PARTITION BY run_id, rank, track, kind ORDER BY e) AS n
    FROM _launch_ranges GROUP BY run_id, rank, track, kind, e
),
ordered AS (
    SELECT r.*, row_number() OVER (PARTITION BY run_id, rank, track, kind ORDER BY s, e DESC, event_id) AS pos
    FROM _launch_ranges r
),
depths AS (
    SELECT o.run_id, o.rank, o.track, o.kind, o.event_id, o.name, o.s, o.e, o.pos - coalesce(x.n, 0) AS depth
    FROM ordered o ASOF LEFT JOIN ends x
      ON x.run_id = o.run_id AND x.rank = o.rank AND x.track = o.track AND x.kind = o.kind AND o.s >= x.e
),
q AS (
    SELECT l.*, k.kind FROM launches l CROSS JOIN (VALUES ('cpu_op'), ('annotation')) k(kind)
),
open_at AS (
    SELECT q2.*, coalesce(q2.n_started, 0) - coalesce(x.n, 0) AS d
    FROM (SELECT q.*, st.n AS n_started FROM q ASOF LEFT JOIN starts st
            ON st.run_id = q.run_id AND st.rank = q.rank AND st.track = q.track AND st.kind = q.kind AND q.t >= st.s) q2
    ASOF LEFT JOIN ends x
      ON x.run_id = q2.run_id AND x.rank = q2.rank AND x.track = q2.track AND x.kind = q2.kind AND q2.t >= x.e
),
inner_most AS (
    SELECT a.run_id, a.rank, a.launch_event_id, a.kind,
           CASE WHEN r.s <= a.t AND r.e >= a.te THEN r.event_id END AS range_id,
           CASE WHEN r.s <= a.t AND r.e >= a.te THEN r.name END AS range_name
    FROM open_at a ASOF LEFT JOIN depths r
      ON r.run_id = a.run_id AND r.rank = a.rank AND r.track = a.track AND r.kind = a.kind AND r.depth = a.d
         AND a.t >= r.s
    WHERE a.d > 0
)
SELECT g.run_id, g.rank::INTEGER AS rank, g.event_id, g.launch_event_id,
       c.range_id AS cpu_op_id, c.range_name AS cpu_op, u.range_id AS annotation_id, u.range_name AS annotation
FROM _gpu_ops g
LEFT JOIN inner_most c ON c.run_id = g.run_id AND c.rank = g.rank AND c.launch_event_id = g.launch_event_id
                       AND c.kind = 'cpu_op'
LEFT JOIN inner_most u ON u.run_id = g.run_id AND u.rank = g.rank AND u.launch_event_id = g.launch_event_id
                       AND u.kind = 'annotation';

-- gpu_time_by_launcher: GPU time per launcher, one row per run, kind and launcher name (all ranks).
-- Each GPU op counts once per kind, so each kind's gpu_total_ns sums to the run's total GPU op time.
--
-- run_id        VARCHAR  run
-- launcher_kind VARCHAR  cpu_op (innermost aten/CPU op) or annotation (innermost record_function range)
-- launcher      VARCHAR  its name; NULL for GPU ops with no such enclosing range (or no launch link)
-- ranks         BIGINT   ranks with such ops
-- gpu_ops       BIGINT   GPU ops launched under it
-- gpu_total_ns  BIGINT   sum of their durations, ns
-- compute_ns    BIGINT   the part of gpu_total_ns in class compute, ns
-- comm_ns       BIGINT   the part in class comm, ns
-- share         DOUBLE   gpu_total_ns / the run's total GPU op time (NULL when that is 0)
CREATE OR REPLACE VIEW gpu_time_by_launcher AS
WITH per AS (
    SELECT g.run_id, k.kind AS launcher_kind, CASE k.kind WHEN 'cpu_op' THEN l.cpu_op ELSE l.annotation END AS launcher,
           g.rank, g.class, g.dur_ns
    FROM _gpu_ops g JOIN gpu_launchers l USING (run_id, rank, event_id)
    CROSS JOIN (VALUES ('cpu_op'), ('annotation')) k(kind)
),
agg AS (
    SELECT run_id, launcher_kind, launcher, count(DISTINCT rank) AS ranks, count(*) AS gpu_ops,
           sum(dur_ns)::BIGINT AS gpu_total_ns,
           coalesce(sum(dur_ns) FILTER (WHERE class = 'compute'), 0)::BIGINT AS compute_ns,
           coalesce(sum(dur_ns) FILTER (WHERE class = 'comm'), 0)::BIGINT AS comm_ns
    FROM per GROUP BY run_id, launcher_kind, launcher
)
SELECT *, CASE WHEN sum(gpu_total_ns) OVER (PARTITION BY run_id, launcher_kind) > 0
               THEN gpu_total_ns / sum(gpu_total_ns) OVER (PARTITION BY run_id, launcher_kind) END AS share
FROM agg;
