-- instance_rows: the rows of the table collective_instances (one row per collective call,
-- matched across the ranks of its process group), one part of the calls at a time.
-- Reads: collectives
--
-- _instance_calls: the collectives rows that can be matched (op and seq known; a recv counts as
--   its pair's send), duplicates resolved (below), with the columns win and part = 0. analyses/collective_instances.py copies them into
--   a temporary table ordered by part = hash(run_id, pg_name, seq) % parts when the run is large.
-- collective_instance_rows(calls, p) → the instances of the rows of table `calls` whose part is
--   p (every instance's rows share one part). Built part by part, the per-instance state of
--   median() and count(DISTINCT) — held outside DuckDB's memory budget — covers one part's calls,
--   not a whole run's; the calls table sorted by part lets each part's scan skip the others' rows.
--
-- An instance is the same collective on every rank of its group: key (run_id, pg_name, seq)
-- (DESIGN.md, "Matching collectives across ranks"), within one profiler window (win, below).
-- Unattributed spans (op NULL) are not matched.
--
-- Repeated (pg, seq) rows within one rank (issue 17) are resolved before matching, never averaged:
-- - the same span twice (same op, size and start, to the ns: a kernel written twice) is one row,
--   the longest (the link pass cuts the first of two identical kernels on a stream to the second's
--   start, i.e. to 0 ns); the copies dropped are counted in collective_duplicates (kind 'copy');
-- - a rank's seq going down, in issue order (issue_ts_ns, else ts_ns), starts a new profiler
--   window (profiler windows concatenated into one file restart seq): win counts the restarts
--   before a row, and rows are matched within their window (collective_duplicates kind 'window');
-- - what is left, several different rows of one (rank, pg, win, seq), is a conflict: the instance
--   is flagged disagree and conflict, its sync time is NULL (so it has no bandwidth, no verdict and
--   is no fit sample) (collective_duplicates kind 'conflict').
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
--                            differ in size by rank), or a rank recorded it twice (conflict)
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
-- win               INTEGER  profiler window: 0, or how many times the ranks' seq restarted before
--                            this call (see above); (run_id, pg_name, win, seq) is the key
-- conflict          BOOLEAN  some rank recorded this (pg, win, seq) as several different spans
--
-- sync_time_ns is NULL, not negative, when the median of (end_r − last_arrival) is below 0 (ranks'
-- clocks that disagree by more than the transfer) and when conflict.
CREATE OR REPLACE VIEW _instance_calls AS
WITH r AS (
    SELECT run_id, pg_name, seq, rank, event_id, CASE WHEN op = 'recv' THEN 'send' ELSE op END AS op, dtype, algo,
           size_bytes, group_size, in_splits, approx, ts_ns, dur_ns, coalesce(issue_ts_ns, ts_ns) AS order_ns,
           row_number() OVER (PARTITION BY run_id, rank, pg_name, seq, op, size_bytes, ts_ns
                              ORDER BY dur_ns DESC, event_id) AS copy_no
    FROM collectives
    WHERE op IS NOT NULL AND seq IS NOT NULL
),
s AS (
    SELECT *, coalesce(seq < lag(seq) OVER (PARTITION BY run_id, rank, pg_name ORDER BY order_ns, ts_ns, event_id),
                       false)::INTEGER AS restart
    FROM r WHERE copy_no = 1
),
w AS (
    SELECT *, sum(restart) OVER (PARTITION BY run_id, rank, pg_name ORDER BY order_ns, ts_ns, event_id
                                 ROWS UNBOUNDED PRECEDING)::INTEGER AS win
    FROM s
)
SELECT run_id, pg_name, seq, rank, event_id, op, dtype, algo, size_bytes, group_size, in_splits, approx, ts_ns, dur_ns,
       win, count(*) OVER (PARTITION BY run_id, rank, pg_name, win, seq) AS rank_rows, 0::BIGINT AS part
FROM w;

-- collective_duplicates: what _instance_calls resolved in each rank's repeated (pg, seq) rows,
-- one row per (run, rank, pg, kind); empty for a trace without repeats. Depends on: collectives, _instance_calls
--
-- run_id   VARCHAR  run
-- rank     INTEGER  global rank
-- pg_name  VARCHAR  process group name
-- kind     VARCHAR  'copy' (the same span written more than once: extra copies dropped),
--                   'window' (seq restarted: rows split into profiler windows),
--                   'conflict' (different spans for one (pg, win, seq): instances flagged)
-- n        BIGINT   copies dropped / windows after the first / (win, seq) keys in conflict
CREATE OR REPLACE VIEW collective_duplicates AS
-- one evaluation of _instance_calls (its window functions) for the three kinds: the copies dropped
-- are the matchable rows of (run, rank, pg) less those _instance_calls kept (one per copy group)
WITH c AS MATERIALIZED (SELECT run_id, rank, pg_name, win, seq, rank_rows FROM _instance_calls),
a AS (SELECT run_id, rank, pg_name, count(*) AS n FROM collectives WHERE op IS NOT NULL AND seq IS NOT NULL GROUP BY ALL),
k AS (SELECT run_id, rank, pg_name, count(*) AS n FROM c GROUP BY ALL)
SELECT a.run_id, a.rank, a.pg_name, 'copy' AS kind, a.n - k.n AS n
FROM a JOIN k ON k.run_id = a.run_id AND k.rank = a.rank AND k.pg_name IS NOT DISTINCT FROM a.pg_name
WHERE a.n > k.n
UNION ALL
SELECT run_id, rank, pg_name, 'window', max(win) FROM c GROUP BY ALL HAVING max(win) > 0
UNION ALL
SELECT run_id, rank, pg_name, 'conflict', count(DISTINCT (win, seq)) FROM c WHERE rank_rows > 1
GROUP BY ALL;

CREATE OR REPLACE MACRO collective_instance_rows(calls, p) AS TABLE
WITH c AS (
    -- per row, how many rows of its instance share its op / dtype / algo: the most common wins
    SELECT *,
           count(*) OVER (PARTITION BY run_id, pg_name, win, seq, op) AS n_op,
           count(dtype) OVER (PARTITION BY run_id, pg_name, win, seq, dtype) AS n_dtype,
           count(algo) OVER (PARTITION BY run_id, pg_name, win, seq, algo) AS n_algo
    FROM query_table(calls)
    WHERE part = p
),
agg AS (
    SELECT run_id, pg_name, win, seq,
           first(op ORDER BY n_op DESC, op) AS op,
           first(dtype ORDER BY n_dtype DESC, dtype) FILTER (WHERE dtype IS NOT NULL) AS dtype,
           max(size_bytes) AS size_bytes,
           max(group_size) AS group_size,
           count(DISTINCT rank)::INTEGER AS ranks_seen,
           bool_or(rank_rows > 1) AS conflict,
           (count(DISTINCT op) > 1 OR bool_or(rank_rows > 1)
            OR count(DISTINCT size_bytes) FILTER (WHERE op <> 'all_to_all' OR in_splits IS NULL OR len(in_splits) = 0) > 1
           ) AS disagree,
           bool_or(approx) AS approx,
           min(ts_ns) AS first_arrival_ns,
           max(ts_ns) AS last_arrival_ns,
           max(ts_ns + dur_ns) AS last_end_ns,
           first(algo ORDER BY n_algo DESC, algo) FILTER (WHERE algo IS NOT NULL) AS algo
    FROM c GROUP BY run_id, pg_name, win, seq
),
strag AS (
    SELECT run_id, pg_name, win, seq, rank AS straggler
    FROM c
    QUALIFY row_number() OVER (PARTITION BY run_id, pg_name, win, seq ORDER BY ts_ns DESC, rank ASC) = 1
),
sync AS (
    SELECT c.run_id, c.pg_name, c.win, c.seq, median(c.ts_ns + c.dur_ns - a.last_arrival_ns)::DOUBLE AS sync_time_ns
    FROM c JOIN agg a USING (run_id, pg_name, win, seq)
    GROUP BY c.run_id, c.pg_name, c.win, c.seq
)
SELECT a.run_id, a.pg_name, a.seq, a.op, a.dtype, a.size_bytes, a.group_size, a.ranks_seen,
       (a.ranks_seen = a.group_size) AS complete, a.disagree, a.approx,
       a.first_arrival_ns, a.last_arrival_ns, a.last_end_ns,
       a.last_arrival_ns - a.first_arrival_ns AS skew_ns,
       CASE WHEN NOT a.conflict AND s.sync_time_ns >= 0 THEN s.sync_time_ns END AS sync_time_ns,
       g.straggler, a.algo, a.win, a.conflict
FROM agg a JOIN sync s USING (run_id, pg_name, win, seq) JOIN strag g USING (run_id, pg_name, win, seq);
