-- stragglers: the instances that waited longest for their last rank, and per rank how often it was
-- last and what waiting that imposed on the others (DESIGN.md, "Matching collectives across ranks":
-- wait_r = last arrival − start_r; the straggler is the rank that arrived last).
-- Reads: collective_instances, collective_waits, runs
--
-- Only instances recorded by two or more ranks (ranks_seen > 1: a skew needs two arrivals) and not
-- mismatched; none of a nccl-tests log (runs.source 'nccl_tests': one row per size, averaged over
-- the communicator, no rank's arrival). An instance is (run, group, profiler window, seq).
--
-- straggler_instances: one row per such instance with a skew.
--
-- run_id        VARCHAR  run
-- pg_name       VARCHAR  process group name
-- win           INTEGER  profiler window (collective_instances.win)
-- seq           BIGINT   per-group sequence number
-- op            VARCHAR  canonical op
-- size_bytes    BIGINT   nccl-tests S, bytes
-- group_size    INTEGER  k
-- straggler     INTEGER  the global rank that arrived last (lowest rank on ties)
-- skew_ns       BIGINT   last arrival − first arrival: the longest wait of any rank, ns
-- sync_time_ns  DOUBLE   transfer time after the last arrival, ns
CREATE OR REPLACE VIEW straggler_instances AS
SELECT i.run_id, i.pg_name, i.win, i.seq, i.op, i.size_bytes, i.group_size, i.straggler, i.skew_ns, i.sync_time_ns
FROM collective_instances i LEFT JOIN runs r USING (run_id)
WHERE i.ranks_seen > 1 AND NOT i.mismatched AND i.skew_ns IS NOT NULL AND r.source IS DISTINCT FROM 'nccl_tests';

-- straggler_ranks: per run and rank, the instances (recorded by two or more ranks, with waits:
-- not in conflict, collective_waits) at which it arrived last.
--
-- run_id          VARCHAR  run
-- rank            INTEGER  global rank (collective_instances.straggler)
-- times_last      BIGINT   instances at which it arrived last
-- wait_caused_ns  BIGINT   Σ over those instances of the other ranks' waits (collective_waits.wait_ns), ns:
--                          the waiting it imposed; NULL when none of them could be measured
-- skew_sum_ns     BIGINT   Σ over those instances of skew_ns (each one's longest wait), ns
CREATE OR REPLACE VIEW straggler_ranks AS
WITH w AS (
    SELECT run_id, pg_name, win, seq, sum(wait_ns) AS imposed_ns FROM collective_waits GROUP BY ALL
)
SELECT i.run_id, i.straggler AS rank, count(*) AS times_last, sum(w.imposed_ns)::BIGINT AS wait_caused_ns,
       sum(i.skew_ns)::BIGINT AS skew_sum_ns
FROM collective_instances i JOIN w USING (run_id, pg_name, win, seq) LEFT JOIN runs r ON r.run_id = i.run_id
WHERE i.ranks_seen > 1 AND NOT i.mismatched AND r.source IS DISTINCT FROM 'nccl_tests'
GROUP BY i.run_id, i.straggler;
