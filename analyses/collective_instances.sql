-- collective_instances: one row per collective call, matched across the ranks of its process group.
-- Depends on: collectives
--
-- An instance is the same collective on every rank of its group: key (run_id, pg_name, seq)
-- (DESIGN.md, "Matching collectives across ranks"). Unattributed spans (op NULL) are not matched.
--
-- run_id            VARCHAR  run the instance belongs to
-- pg_name           VARCHAR  process group name
-- seq               BIGINT   per-group sequence number (from the trace, else by issue order)
-- op                VARCHAR  canonical op (all_reduce, all_gather, ...); the most common over ranks;
--                            a matched send/recv pair is one 'send' instance
-- dtype             VARCHAR  element type as the trace names it
-- size_bytes        BIGINT   nccl-tests S for this op, bytes (max over ranks)
-- group_size        INTEGER  ranks in the process group
-- ranks_seen        INTEGER  ranks that recorded the call; < group_size means incomplete
-- complete          BOOLEAN  ranks_seen = group_size
-- disagree          BOOLEAN  ranks recorded different ops or sizes for this (pg, seq) (send and
--                            recv of one p2p pair agree; an all-to-all with uneven splits may
--                            differ in size by rank)
-- approx            BOOLEAN  some rank's size was inferred or truncated
-- first_arrival_ns  BIGINT   earliest start over ranks, ns on the run clock
-- last_arrival_ns   BIGINT   latest start over ranks, ns on the run clock
-- last_end_ns       BIGINT   latest end over ranks, ns
-- skew_ns           BIGINT   last_arrival − first_arrival, ns (the longest wait of any rank)
-- sync_time_ns      DOUBLE   median over ranks of (end_r − last_arrival), ns: the transfer time the
--                            α–β model predicts (a median of two ranks is their mean)
-- straggler         INTEGER  global rank that arrived last (lowest rank on ties)
--
-- A table, computed once per connection: the fit, the verdicts, the waits and the report all read it.
CREATE OR REPLACE TABLE collective_instances AS
WITH c AS (
    SELECT * REPLACE (CASE WHEN op = 'recv' THEN 'send' ELSE op END AS op)
    FROM collectives WHERE op IS NOT NULL AND seq IS NOT NULL
),
agg AS (
    SELECT run_id, pg_name, seq,
           mode(op) AS op,
           mode(dtype) AS dtype,
           max(size_bytes) AS size_bytes,
           max(group_size) AS group_size,
           count(DISTINCT rank)::INTEGER AS ranks_seen,
           (count(DISTINCT op) > 1
            OR count(DISTINCT size_bytes) FILTER (WHERE op <> 'all_to_all' OR in_splits IS NULL OR len(in_splits) = 0) > 1
           ) AS disagree,
           bool_or(approx) AS approx,
           min(ts_ns) AS first_arrival_ns,
           max(ts_ns) AS last_arrival_ns,
           max(ts_ns + dur_ns) AS last_end_ns
    FROM c GROUP BY run_id, pg_name, seq
),
strag AS (
    SELECT run_id, pg_name, seq, rank AS straggler
    FROM c
    QUALIFY row_number() OVER (PARTITION BY run_id, pg_name, seq ORDER BY ts_ns DESC, rank ASC) = 1
),
sync AS (
    SELECT c.run_id, c.pg_name, c.seq, median(c.ts_ns + c.dur_ns - a.last_arrival_ns)::DOUBLE AS sync_time_ns
    FROM c JOIN agg a USING (run_id, pg_name, seq)
    GROUP BY c.run_id, c.pg_name, c.seq
)
SELECT a.run_id, a.pg_name, a.seq, a.op, a.dtype, a.size_bytes, a.group_size, a.ranks_seen,
       (a.ranks_seen = a.group_size) AS complete, a.disagree, a.approx,
       a.first_arrival_ns, a.last_arrival_ns, a.last_end_ns,
       a.last_arrival_ns - a.first_arrival_ns AS skew_ns,
       s.sync_time_ns, g.straggler
FROM agg a JOIN sync s USING (run_id, pg_name, seq) JOIN strag g USING (run_id, pg_name, seq);

-- collective_waits: one row per (instance, rank): how long each rank waited for the slowest.
-- Depends on: collectives, collective_instances
--
-- run_id     VARCHAR  run
-- pg_name    VARCHAR  process group name
-- seq        BIGINT   per-group sequence number
-- rank       INTEGER  global rank
-- event_id   BIGINT   the rank's communication span (events.event_id)
-- op         VARCHAR  canonical op
-- ts_ns      BIGINT   the rank's start, ns
-- dur_ns     BIGINT   the rank's span duration, ns (wait + transfer)
-- wait_ns    BIGINT   last_arrival − ts_ns: time spent waiting for the last rank, ns (>= 0)
-- is_straggler BOOLEAN this rank arrived last
CREATE OR REPLACE VIEW collective_waits AS
SELECT c.run_id, c.pg_name, c.seq, c.rank, c.event_id, i.op, c.ts_ns, c.dur_ns,
       i.last_arrival_ns - c.ts_ns AS wait_ns,
       (c.rank = i.straggler) AS is_straggler
FROM collectives c JOIN collective_instances i USING (run_id, pg_name, seq)
WHERE c.op IS NOT NULL;
