-- overlap_islands: the intervals behind overlap's lengths, as disjoint islands.
-- Reads: events, intervals
--
-- Definitions as in overlap.sql: intervals are events with class 'comm' / 'compute' (see
-- tracekit.ingest.linkpass); a window is the whole trace (grp = -1) or one profiler step (grp = step).
-- A module of its own, last in the pipeline, because binding these views reads every rank's events
-- file, which only statements that query the islands (the HTML timeline, a user's SQL) need; the
-- lengths per window and per call come from the ingest's summaries.
--
-- comm_islands, compute_islands, overlap_islands: disjoint islands of the union of comm
-- (compute) intervals, and the pieces of comm ∩ compute. Views, evaluated only when queried.
-- Summing e − s over them gives overlap_windows' lengths (tests check it). The three have the same columns:
--
-- run_id  VARCHAR  run
-- rank    INTEGER  global rank
-- grp     BIGINT   -1 = whole trace, else the profiler step number
-- s       BIGINT   island start, ns
-- e       BIGINT   island end, ns (e >= s)
CREATE OR REPLACE VIEW _comm_spans AS
SELECT run_id, rank, -1::BIGINT AS grp, ts_ns AS s, ts_ns + dur_ns AS e FROM events WHERE class = 'comm'
UNION ALL
SELECT run_id, rank, step, ts_ns, ts_ns + dur_ns FROM events WHERE class = 'comm' AND step IS NOT NULL;

CREATE OR REPLACE VIEW _compute_spans AS
SELECT run_id, rank, -1::BIGINT AS grp, ts_ns AS s, ts_ns + dur_ns AS e FROM events WHERE class = 'compute'
UNION ALL
SELECT run_id, rank, step, ts_ns, ts_ns + dur_ns FROM events WHERE class = 'compute' AND step IS NOT NULL;

CREATE OR REPLACE VIEW comm_islands AS SELECT * FROM merge_intervals('_comm_spans');
CREATE OR REPLACE VIEW compute_islands AS SELECT * FROM merge_intervals('_compute_spans');
CREATE OR REPLACE VIEW overlap_islands AS SELECT * FROM intersect_islands('comm_islands', 'compute_islands');
