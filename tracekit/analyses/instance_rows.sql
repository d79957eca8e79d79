-- instance_rows: the rows of the table collective_instances (one row per collective call,
-- matched across the ranks of its process group), one part of the calls at a time.
-- Reads: collectives, runs
--
-- _instance_calls: the collectives rows that can be matched (op and seq known; a recv counts as
--   its pair's send), duplicates resolved (below), with the columns win and part = 0.
--   analyses/collective_instances.py evaluates them once into the temporary table __instance_calls,
--   ordered by part = hash(run_id, pg_name, seq) % parts when the run is large.
-- collective_instance_rows(calls, p) → the instances of the rows of table `calls` whose part is
--   p (every instance's rows share one part). Built part by part, the per-instance state (the lists
--   of the instance's rows, below) covers one part's calls, not a whole run's; the calls table
--   sorted by part lets each part's scan skip the others' rows.
--
-- An instance is the same collective on every rank of its group: key (run_id, pg_name, seq)
-- (DESIGN.md, "Matching collectives across ranks"), within one profiler window (win, below).
-- Unattributed spans (op NULL) are not matched.
--
-- Repeated (pg, seq) rows within one rank (issue 17) are resolved before matching, never averaged:
-- - the same span twice (same op, size and start, to the ns: a kernel written twice) is one row,
--   the longest (the link pass cuts the first of two identical kernels on a stream to the second's
--   start, i.e. to 0 ns); the copies dropped are counted in collective_duplicates (kind 'copy';
--   analyses/collective_waits.sql);
-- - a rank's seq going down, in issue order (issue_ts_ns, else ts_ns), to a seq the rank has already
--   recorded starts a new profiler window (profiler windows concatenated into one file restart seq):
--   win counts the restarts before a row, and rows are matched within their window
--   (collective_duplicates kind 'window'); a seq going down to one not seen yet is calls issued out
--   of their seq order (two streams, two threads), matched by their seq numbers in window 0;
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
-- complete          BOOLEAN  ranks_seen = group_size, or a nccl-tests log's row (one row per size, already
--                            the whole communicator's); NOT complete is "incomplete" in every table
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
-- mismatched        BOOLEAN  the ranks' calls at this (pg, win, seq) disagree on op or size (each rank
--                            recorded one call, but not the same one: the ranks' call orders differ);
--                            such an instance is listed by the view `mismatched_instances` and left out of
--                            waits, stragglers, instance counts, fits, verdicts and the critical
--                            path's cross-rank edges
-- k_source          VARCHAR  where group_size came from (collectives.k_source; 'world' when any rank's
--                            came from the world size, else the most common over ranks)
-- async_cpu         BOOLEAN  every rank's row is a CPU-side call (collectives.cpu_side) of an
--                            asynchronous backend (runs.backend nccl / rccl): the call only enqueues
--                            GPU work, so its span holds no transfer time
--
-- sync_time_ns is NULL, not negative, when the median of (end_r − last_arrival) is below 0 (ranks'
-- clocks that disagree by more than the transfer), when conflict, when mismatched and when
-- async_cpu (a CPU enqueue of an asynchronous backend measures no transfer). skew_ns is NULL when
-- fewer than two ranks recorded the instance of a group of more (a skew needs two arrivals).
CREATE OR REPLACE VIEW _instance_calls AS
WITH r AS (
    SELECT run_id, pg_name, seq, rank, event_id, CASE WHEN op = 'recv' THEN 'send' ELSE op END AS op, dtype, algo,
           size_bytes, group_size, in_splits, approx, ts_ns, dur_ns, coalesce(issue_ts_ns, ts_ns) AS order_ns,
           k_source, cpu_side,
           row_number() OVER (PARTITION BY run_id, rank, pg_name, seq, op, size_bytes, ts_ns
                              ORDER BY dur_ns DESC, event_id) AS copy_no
    FROM collectives
    WHERE op IS NOT NULL AND seq IS NOT NULL
),
s AS (
    SELECT *, (coalesce(seq < lag(seq) OVER (PARTITION BY run_id, rank, pg_name ORDER BY order_ns, ts_ns, event_id),
                        false)
               AND row_number() OVER (PARTITION BY run_id, rank, pg_name, seq ORDER BY order_ns, ts_ns, event_id) > 1
              )::INTEGER AS restart
    FROM r WHERE copy_no = 1
),
w AS (
    SELECT *, sum(restart) OVER (PARTITION BY run_id, rank, pg_name ORDER BY order_ns, ts_ns, event_id
                                 ROWS UNBOUNDED PRECEDING)::INTEGER AS win
    FROM s
)
SELECT run_id, pg_name, seq, rank, event_id, op, dtype, algo, size_bytes, group_size, in_splits, approx, ts_ns, dur_ns,
       k_source, cpu_side, win, count(*) OVER (PARTITION BY run_id, rank, pg_name, win, seq) AS rank_rows, 0::BIGINT AS part
FROM w;

-- _most_common(l): the value of list l that occurs most often (ties: the first in sort order), NULLs
--   left out; NULL when l holds none. The same value as first(x ORDER BY count of x DESC, x) over
--   the rows, counted per value (what a window count per (instance, x) gives), from one list.
CREATE OR REPLACE MACRO _most_common(l) AS
    CASE WHEN len(list_distinct(l)) <= 1 THEN list_distinct(l)[1]
         ELSE list_min(list_transform(list_distinct(l),
                                      lambda v: {'n': -len(list_filter(l, lambda o: o = v)), 'k': v})).k END;

-- The instances in one aggregation over the calls (no window, no join back): per instance the lists
-- of its rows' op, dtype, algo, rank, sizes and ends, reduced by list functions; the straggler by
-- first(rank ORDER BY ts_ns DESC, rank) (the latest start, lowest rank on ties); the sync time as
-- the median of the list of (end_r − last_arrival) (list_aggregate: the same median() over the
-- same values). count(DISTINCT x) = len(list_distinct(x)) (both leave NULLs out).
CREATE OR REPLACE MACRO collective_instance_rows(calls, p) AS TABLE
WITH agg AS (
    SELECT run_id, pg_name, win, seq,
           list(op) AS ops, list(dtype) AS dtypes, list(algo) AS algos, list(rank) AS ranks,
           list(size_bytes) FILTER (WHERE op <> 'all_to_all' OR in_splits IS NULL OR len(in_splits) = 0) AS sizes,
           max(size_bytes) AS size_bytes,
           max(group_size) AS group_size,
           bool_or(rank_rows > 1) AS conflict,
           bool_or(approx) AS approx,
           min(ts_ns) AS first_arrival_ns,
           max(ts_ns) AS last_arrival_ns,
           max(ts_ns + dur_ns) AS last_end_ns,
           list(ts_ns + dur_ns) AS ends,
           first(rank ORDER BY ts_ns DESC, rank ASC) AS straggler,
           list(k_source) AS k_sources,
           bool_and(coalesce(cpu_side, false)) AS all_cpu_side
    FROM query_table(calls)
    WHERE part = p
    GROUP BY run_id, pg_name, win, seq
),
a AS (
    SELECT *,
           _most_common(ops) AS op, _most_common(dtypes) AS dtype, _most_common(algos) AS algo,
           len(list_distinct(ranks))::INTEGER AS ranks_seen,
           (len(list_distinct(ops)) > 1 OR conflict OR coalesce(len(list_distinct(sizes)), 0) > 1) AS disagree,
           (NOT conflict AND (len(list_distinct(ops)) > 1 OR coalesce(len(list_distinct(sizes)), 0) > 1)) AS mismatched,
           CASE WHEN list_contains(k_sources, 'world') THEN 'world' ELSE _most_common(k_sources) END AS k_source,
           list_aggregate(list_transform(ends, lambda x: x - last_arrival_ns), 'median')::DOUBLE AS sync_time_ns
    FROM agg
)
SELECT run_id, pg_name, seq, op, dtype, size_bytes, group_size, ranks_seen,
       (ranks_seen = group_size OR is_log) AS complete, disagree, approx,
       first_arrival_ns, last_arrival_ns, last_end_ns,
       CASE WHEN ranks_seen > 1 OR group_size = 1 THEN last_arrival_ns - first_arrival_ns END AS skew_ns,
       CASE WHEN NOT conflict AND NOT mismatched AND NOT async_cpu AND sync_time_ns >= 0 THEN sync_time_ns END
           AS sync_time_ns,
       straggler, algo, win, conflict, mismatched, k_source, async_cpu
FROM (SELECT a.*, (a.all_cpu_side AND coalesce(r.backend IN ('nccl', 'rccl'), false)) AS async_cpu,
             coalesce(r.source = 'nccl_tests', false) AS is_log
      FROM a LEFT JOIN runs r USING (run_id));
