-- overlap: communication hidden behind compute, per rank, per profiler step and per call.
-- Reads: overlap_windows (and its _span_overlap)
--
-- Definitions (DESIGN.md, "Overlap"), on unions of intervals so nothing is counted twice:
--   comm = |∪ comm intervals|, compute = |∪ compute intervals|, overlap = |comm ∩ compute|,
--   overlap_ratio = overlap / comm (as HTA defines it; NULL, never NaN, when comm = 0),
--   exposed_comm = comm − overlap.
-- Intervals are events with class 'comm' / 'compute' (see tracekit.ingest.linkpass). A window is the
-- whole trace (grp = -1) or one profiler step (grp = step; GPU work belongs to the step that
-- launched it).

-- The lengths per window (comm_ns, compute_ns, overlap_ns, exposed_comm_ns, overlap_ratio) are
-- the table overlap_windows (analyses/overlap_windows.py: a sweep over DuckDB's sorted spans, in
-- bounded memory); this module gives its views per rank and per step, and per call. The intervals
-- themselves are the views of overlap_islands.sql.
--
-- overlap_by_rank: the whole-trace window of overlap_windows (grp = -1).
--
-- run_id          VARCHAR  run
-- rank            INTEGER  global rank
-- comm_ns         BIGINT   |∪ comm|, ns
-- compute_ns      BIGINT   |∪ compute|, ns
-- overlap_ns      BIGINT   |comm ∩ compute|, ns
-- exposed_comm_ns BIGINT   comm − overlap, ns
-- overlap_ratio   DOUBLE   overlap / comm; NULL when comm = 0
CREATE OR REPLACE VIEW overlap_by_rank AS
SELECT run_id, rank, comm_ns, compute_ns, overlap_ns, exposed_comm_ns, overlap_ratio
FROM overlap_windows WHERE grp = -1;

-- overlap_by_step: the windows of overlap_windows that are profiler steps (grp >= 0).
--
-- run_id          VARCHAR  run
-- rank            INTEGER  global rank
-- step            BIGINT   profiler step number
-- comm_ns         BIGINT   |∪ comm|, ns
-- compute_ns      BIGINT   |∪ compute|, ns
-- overlap_ns      BIGINT   |comm ∩ compute|, ns
-- exposed_comm_ns BIGINT   comm − overlap, ns
-- overlap_ratio   DOUBLE   overlap / comm; NULL when comm = 0
CREATE OR REPLACE VIEW overlap_by_step AS
SELECT run_id, rank, grp AS step, comm_ns, compute_ns, overlap_ns, exposed_comm_ns, overlap_ratio
FROM overlap_windows WHERE grp >= 0;

-- collective_overlap: per communication span, the part of it covered by compute: the store's per-span
-- summary (span_overlap, computed per rank at ingest by tracekit.timeline.intervals.rank_overlap_summary: the
-- covered-length prefix C(t) of the whole trace's compute islands, as island_prefix gives it, overlap =
-- C(end) − C(start)), read through overlap_windows' _span_overlap (which refuses a run stored without it).
--
-- run_id           VARCHAR  run
-- rank             INTEGER  global rank
-- event_id         BIGINT   the comm span (events.event_id)
-- name             VARCHAR  span name (kernel or gloo span)
-- ts_ns            BIGINT   start, ns
-- dur_ns           BIGINT   duration, ns
-- overlap_ns       BIGINT   |span ∩ ∪ compute|, ns
-- overlap_fraction DOUBLE   overlap_ns / dur_ns; NULL for zero-length spans
CREATE OR REPLACE VIEW collective_overlap AS
SELECT run_id, rank, event_id, name, ts_ns, dur_ns, overlap_ns,
       CASE WHEN dur_ns > 0 THEN overlap_ns / dur_ns END AS overlap_fraction
FROM _span_overlap;
