-- collective_ops: the report's summary per collective op (and of the run's matching), computed
-- here; the report selects and renders.
-- Reads: collective_bandwidth, collective_waits, collective_instances, collectives, runs
--
-- No statistic across sizes (a median of different sizes describes no call): counts, totals, the
-- size range and the peak. Mismatched instances (collective_instances.mismatched) are left out of
-- every count. A nccl-tests log (runs.source 'nccl_tests') holds one row per size already averaged
-- over the whole communicator: none of its instances is incomplete.
--
-- collective_ops: per run and op, over its instances (collective_bandwidth's rows).
--
-- run_id                VARCHAR  run
-- op                    VARCHAR  canonical op
-- count                 BIGINT   instances
-- total_bytes           BIGINT   Σ size_bytes (nccl-tests S), bytes
-- size_buckets          BIGINT   distinct power-of-two size buckets (tk_size_bucket = tracekit.model.size_bucket)
-- min_size_bytes        BIGINT   smallest S, bytes
-- max_size_bytes        BIGINT   largest S, bytes
-- peak_busbw_gbps       DOUBLE   largest busbw (collective_bandwidth), GB/s; NULL when every instance of
--                                size > 0 is in a 1-rank group (busbw 0 by nccl-tests' factor at n = 1,
--                                not a measurement)
-- peak_busbw_size_bytes BIGINT   the S of that instance, bytes (NULL as peak_busbw_gbps)
-- over_cap              BIGINT   instances whose busbw exceeds the device's physical cap (collective_bandwidth.over_cap)
-- cap_gbps              DOUBLE   that cap, GB/s (NULL: unknown device)
-- peak_lower_bound      BOOLEAN  the peak is an incomplete instance's: its sync time holds the wait for
--                                ranks not recorded, so the peak is a lower bound
-- k_world               BIGINT   instances whose k is the world size (k_source 'world'), a guess
-- total_wait_ns         BIGINT   Σ over instances and ranks of the wait for the last arrival (collective_waits), ns;
--                                NULL when no rank's wait could be measured (no collective_waits row of the op)
-- incomplete            BIGINT   instances recorded by fewer ranks than their group (0 for a nccl-tests log)
-- disagreeing           BIGINT   instances whose ranks disagree on op or size (collective_instances.disagree)
CREATE OR REPLACE VIEW collective_ops AS
WITH b AS (
    SELECT run_id, op, count(*) AS count, sum(size_bytes)::BIGINT AS total_bytes,
           count(DISTINCT tk_size_bucket(size_bytes)) AS size_buckets,
           min(size_bytes) AS min_size_bytes, max(size_bytes) AS max_size_bytes,
           max(busbw_gbps) AS peak_busbw_gbps, arg_max(size_bytes, busbw_gbps) AS peak_busbw_size_bytes,
           count(*) FILTER (WHERE over_cap) AS over_cap, max(cap_gbps) AS cap_gbps,
           NOT arg_max(complete, busbw_gbps) AS peak_lower_bound,
           count(*) FILTER (WHERE k_source = 'world') AS k_world,
           count(*) FILTER (WHERE size_bytes > 0) > 0
               AND count(*) FILTER (WHERE size_bytes > 0 AND group_size IS DISTINCT FROM 1) = 0 AS one_rank_only
    FROM collective_bandwidth GROUP BY run_id, op
),
w AS (
    SELECT run_id, op, sum(wait_ns)::BIGINT AS total_wait_ns FROM collective_waits GROUP BY run_id, op
),
f AS (
    SELECT run_id, op, count(*) FILTER (WHERE NOT complete) AS incomplete, count(*) FILTER (WHERE disagree) AS disagreeing
    FROM collective_instances WHERE NOT mismatched GROUP BY run_id, op
)
SELECT b.run_id, b.op, b.count, b.total_bytes, b.size_buckets, b.min_size_bytes, b.max_size_bytes,
       CASE WHEN NOT b.one_rank_only THEN b.peak_busbw_gbps END AS peak_busbw_gbps,
       CASE WHEN NOT b.one_rank_only THEN b.peak_busbw_size_bytes END AS peak_busbw_size_bytes,
       b.over_cap, b.cap_gbps, b.peak_lower_bound, b.k_world, w.total_wait_ns,
       CASE WHEN r.source = 'nccl_tests' THEN 0 ELSE coalesce(f.incomplete, 0) END AS incomplete,
       coalesce(f.disagreeing, 0) AS disagreeing
FROM b
LEFT JOIN w ON w.run_id = b.run_id AND w.op IS NOT DISTINCT FROM b.op
LEFT JOIN f ON f.run_id = b.run_id AND f.op IS NOT DISTINCT FROM b.op
LEFT JOIN runs r ON r.run_id = b.run_id;

-- instance_health: per run, how its collective instances matched (mismatched ones left out).
--
-- run_id       VARCHAR  run
-- instances    BIGINT   instances
-- complete     BIGINT   recorded by every rank of their group (every row of a nccl-tests log)
-- incomplete   BIGINT   recorded by fewer ranks than their group size (0 for a nccl-tests log)
-- disagreeing  BIGINT   ranks disagree on op or size
CREATE OR REPLACE VIEW instance_health AS
WITH i AS (
    SELECT run_id, count(*) AS instances, count(*) FILTER (WHERE complete) AS complete,
           count(*) FILTER (WHERE NOT complete) AS incomplete, count(*) FILTER (WHERE disagree) AS disagreeing
    FROM collective_instances WHERE NOT mismatched GROUP BY run_id
)
SELECT r.run_id, coalesce(i.instances, 0) AS instances,
       CASE WHEN r.source = 'nccl_tests' THEN coalesce(i.instances, 0) ELSE coalesce(i.complete, 0) END AS complete,
       CASE WHEN r.source = 'nccl_tests' THEN 0 ELSE coalesce(i.incomplete, 0) END AS incomplete,
       coalesce(i.disagreeing, 0) AS disagreeing
FROM runs r LEFT JOIN i USING (run_id);

-- calls_by_rank: per run, rank and op (NULL: unattributed), the rank's calls as recorded.
--
-- run_id      VARCHAR  run
-- rank        INTEGER  global rank
-- op          VARCHAR  canonical op (NULL: a communication span with no collective)
-- calls       BIGINT   collectives rows
-- bytes       BIGINT   Σ size_bytes, bytes
-- wire_bytes  BIGINT   Σ wire_bytes (what the rank's link carried, collectives.wire_bytes), bytes
CREATE OR REPLACE VIEW calls_by_rank AS
SELECT run_id, rank, op, count(*) AS calls, sum(size_bytes)::BIGINT AS bytes, sum(wire_bytes)::BIGINT AS wire_bytes
FROM collectives GROUP BY run_id, rank, op;

-- unattributed_comm: per run and rank, the communication spans no collective was attributed to (op NULL).
--
-- run_id  VARCHAR  run
-- rank    INTEGER  global rank
-- spans   BIGINT   such spans
-- dur_ns  BIGINT   Σ their durations, ns
CREATE OR REPLACE VIEW unattributed_comm AS
SELECT run_id, rank, count(*) AS spans, sum(dur_ns)::BIGINT AS dur_ns
FROM collectives WHERE op IS NULL GROUP BY run_id, rank;
