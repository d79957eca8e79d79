-- instance_rows: the rows of the table collective_instances (one row per collective call,
-- matched across the ranks of its process group), one part of the calls at a time.
-- Reads: collectives
--
-- _instance_calls: the collectives rows that can be matched (op and seq known; a recv counts as
--   its pair's send), with the column part = 0. analyses/collective_instances.py copies them into
--   a temporary table ordered by part = hash(run_id, pg_name, seq) % parts when the run is large.
-- collective_instance_rows(calls, p) → the instances of the rows of table `calls` whose part is
--   p (every instance's rows share one part). Built part by part, the per-instance state of
--   median() and count(DISTINCT) — held outside DuckDB's memory budget — covers one part's calls,
--   not a whole run's; the calls table sorted by part lets each part's scan skip the others' rows.
--
-- An instance is the same collective on every rank of its group: key (run_id, pg_name, seq)
-- (DESIGN.md, "Matching collectives across ranks"). Unattributed spans (op NULL) are not matched.
--
-- collective_instances: the table's columns (the macro's rows), one row per instance:
-- run_id            VARCHAR  run the instance belongs to
-- pg_name           VARCHAR  process group name
-- seq               BIGINT   per-group sequence number (from the trace, else by issue order)
-- op                VARCHAR  canonical op (all_reduce, all_gather, ...); the most common over ranks
--                            (ties: the first in alphabetical order); a matched send/recv pair is
--                            one 'send' instance
-- dtype             VARCHAR  element type as the trace names it (the most common; ties as op)
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
-- algo              VARCHAR  the algorithm the kernel names (RING, TREE, NVLS...), the most common
--                            over ranks (ties as op); NULL when no rank's kernel names one
CREATE OR REPLACE VIEW _instance_calls AS
SELECT run_id, pg_name, seq, rank, CASE WHEN op = 'recv' THEN 'send' ELSE op END AS op, dtype, algo,
       size_bytes, group_size, in_splits, approx, ts_ns, dur_ns, 0::BIGINT AS part
FROM collectives
WHERE op IS NOT NULL AND seq IS NOT NULL;

CREATE OR REPLACE MACRO collective_instance_rows(calls, p) AS TABLE
WITH c AS (
    -- per row, how many rows of its instance share its op / dtype / algo: the most common wins
    SELECT *,
           count(*) OVER (PARTITION BY run_id, pg_name, seq, op) AS n_op,
           count(dtype) OVER (PARTITION BY run_id, pg_name, seq, dtype) AS n_dtype,
           count(algo) OVER (PARTITION BY run_id, pg_name, seq, algo) AS n_algo
    FROM query_table(calls)
    WHERE part = p
),
agg AS (
    SELECT run_id, pg_name, seq,
           first(op ORDER BY n_op DESC, op) AS op,
           first(dtype ORDER BY n_dtype DESC, dtype) FILTER (WHERE dtype IS NOT NULL) AS dtype,
           max(size_bytes) AS size_bytes,
           max(group_size) AS group_size,
           count(DISTINCT rank)::INTEGER AS ranks_seen,
           (count(DISTINCT op) > 1
            OR count(DISTINCT size_bytes) FILTER (WHERE op <> 'all_to_all' OR in_splits IS NULL OR len(in_splits) = 0) > 1
           ) AS disagree,
           bool_or(approx) AS approx,
           min(ts_ns) AS first_arrival_ns,
           max(ts_ns) AS last_arrival_ns,
           max(ts_ns + dur_ns) AS last_end_ns,
           first(algo ORDER BY n_algo DESC, algo) FILTER (WHERE algo IS NOT NULL) AS algo
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
       s.sync_time_ns, g.straggler, a.algo
FROM agg a JOIN sync s USING (run_id, pg_name, seq) JOIN strag g USING (run_id, pg_name, seq);
