-- critical_path_events: what lies on a run's critical paths (analyses/critical_path.py), rolled up
-- for the report: the events with the most time on the paths, and each path's largest pieces.
-- Reads: critical_path, critical_path_summary (and names "events" and "ranks", columns named as base views)
--
-- critical_path_events: per run, event name and class, over every path (rank, step) of the run,
-- the events with time on a path (on_path_ns > 0).
--
-- run_id      VARCHAR  run
-- name        VARCHAR  event name
-- class       VARCHAR  events.class (compute / comm / memory / sync / cpu / other)
-- events      BIGINT   path rows of that name and class
-- ranks       BIGINT   distinct ranks they ran on (event_rank)
-- on_path_ns  BIGINT   Σ on_path_ns, ns
-- share       DOUBLE   on_path_ns / Σ length_ns of the run's paths (critical_path_summary); NULL when that is 0
CREATE OR REPLACE VIEW critical_path_events AS
WITH total AS (SELECT run_id, sum(length_ns) AS length_ns FROM critical_path_summary GROUP BY run_id),
e AS (
    SELECT run_id, name, class, count(*) AS events, count(DISTINCT event_rank) AS ranks,
           sum(on_path_ns)::BIGINT AS on_path_ns
    FROM critical_path WHERE on_path_ns > 0
    GROUP BY run_id, name, class
)
SELECT e.run_id, e.name, e.class, e.events, e.ranks, e.on_path_ns,
       CASE WHEN t.length_ns <> 0 THEN e.on_path_ns / t.length_ns END AS share
FROM e LEFT JOIN total t USING (run_id);

-- critical_path_top: per run, rank and step (one path), its 3 rows with the most time on the path
-- (on_path_ns descending, ties by position on the path: the earlier first). An aggregate (max_by
-- with n = 3), not a window over every row.
--
-- run_id      VARCHAR  run
-- rank        INTEGER  the path's rank
-- step        BIGINT   the path's profiler step
-- event_rank  INTEGER  the rank the event ran on
-- event_id    BIGINT   events.event_id on event_rank
-- name        VARCHAR  event name
-- class       VARCHAR  events.class
-- start_ns    BIGINT   the event's start, ns
-- end_ns      BIGINT   its end, ns
-- on_path_ns  BIGINT   the part credited to the path, ns
-- pos         INTEGER  position on the path, 0 = the earliest event
CREATE OR REPLACE VIEW critical_path_top AS
SELECT run_id, r.rank, r.step, r.event_rank, r.event_id, r.name, r.class, r.start_ns, r.end_ns, r.on_path_ns, r.pos
FROM (
    SELECT run_id, unnest(max_by({'rank': rank, 'step': step, 'event_rank': event_rank, 'event_id': event_id,
                                  'name': name, 'class': class, 'start_ns': start_ns, 'end_ns': end_ns,
                                  'on_path_ns': on_path_ns, 'pos': pos}, {'o': on_path_ns, 'p': -pos}, 3)) AS r
    FROM critical_path WHERE on_path_ns > 0 GROUP BY run_id, rank, step
);
