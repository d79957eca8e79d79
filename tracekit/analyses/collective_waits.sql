-- collective_waits: one row per (instance, rank): how long each rank waited for the slowest; and
-- collective_duplicates (below), what matching did with a rank's repeated rows.
-- Reads: __instance_calls (the rows of _instance_calls, evaluated once: analyses/collective_instances.py),
-- collective_instances
--
-- A rank's row is its collectives row as matched (analyses/instance_rows.sql: a span written twice
-- counts once; a rank's rows are matched within their profiler window, key (pg, win, seq)).
-- Instances in conflict (a rank recorded several different spans for one key) have no waits: no
-- single start is that rank's; nor have mismatched instances (collective_instances.mismatched: the
-- ranks' calls at the key are different calls, so no rank waited for another at it). An instance
-- that fewer than two ranks of its group recorded keeps its rows with wait_ns NULL: the wait for
-- ranks not recorded cannot be measured.
--
-- run_id     VARCHAR  run
-- pg_name    VARCHAR  process group name
-- seq        BIGINT   per-group sequence number
-- rank       INTEGER  global rank
-- event_id   BIGINT   the rank's communication span (events.event_id)
-- op         VARCHAR  canonical op
-- ts_ns      BIGINT   the rank's start, ns
-- dur_ns     BIGINT   the rank's span duration, ns (wait + transfer)
-- wait_ns    BIGINT   last_arrival − ts_ns: time spent waiting for the last rank, ns (>= 0: the last
--                     arrival is the latest start of the instance's rows); NULL when fewer than two
--                     ranks of a group of more recorded the instance
-- is_straggler BOOLEAN this rank arrived last
-- win        INTEGER  profiler window (collective_instances.win)
CREATE OR REPLACE VIEW collective_waits AS
SELECT c.run_id, c.pg_name, c.seq, c.rank, c.event_id, i.op, c.ts_ns, c.dur_ns,
       CASE WHEN i.skew_ns IS NOT NULL THEN i.last_arrival_ns - c.ts_ns END AS wait_ns,
       (c.rank = i.straggler) AS is_straggler, c.win
FROM __instance_calls c JOIN collective_instances i USING (run_id, pg_name, win, seq)
WHERE NOT i.conflict AND NOT i.mismatched;

-- mismatched_instances: one row per instance whose ranks' calls disagree on op or size
-- (collective_instances.mismatched), with what each rank recorded; these instances are kept out of
-- the waits, stragglers, counts, fits, verdicts and the critical path.
-- Reads: __instance_calls, collective_instances
--
-- run_id    VARCHAR    run
-- pg_name   VARCHAR    process group name
-- win       INTEGER    profiler window
-- seq       BIGINT     per-group sequence number
-- ranks     INTEGER[]  the ranks that recorded a call at this key, ascending
-- ops       VARCHAR[]  each of those ranks' op, in the order of ranks
-- sizes     BIGINT[]   each of those ranks' size_bytes (nccl-tests S, bytes), in the order of ranks
CREATE OR REPLACE VIEW mismatched_instances AS
SELECT c.run_id, c.pg_name, c.win, c.seq, list(c.rank ORDER BY c.rank) AS ranks,
       list(c.op ORDER BY c.rank) AS ops, list(c.size_bytes ORDER BY c.rank) AS sizes
FROM __instance_calls c JOIN collective_instances i USING (run_id, pg_name, win, seq)
WHERE i.mismatched
GROUP BY c.run_id, c.pg_name, c.win, c.seq;

-- collective_duplicates: what _instance_calls resolved in each rank's repeated (pg, seq) rows,
-- one row per (run, rank, pg, kind); empty for a trace without repeats. Reads: collectives,
-- __instance_calls (the rows of _instance_calls, analyses/instance_rows.sql, where the rules are)
--
-- run_id   VARCHAR  run
-- rank     INTEGER  global rank
-- pg_name  VARCHAR  process group name
-- kind     VARCHAR  'copy' (the same span written more than once: extra copies dropped),
--                   'window' (seq restarted: rows split into profiler windows),
--                   'conflict' (different spans for one (pg, win, seq): instances flagged)
-- n        BIGINT   copies dropped / windows after the first / (win, seq) keys in conflict
CREATE OR REPLACE VIEW collective_duplicates AS
-- the copies dropped are the matchable rows of (run, rank, pg) less those _instance_calls kept (one
-- per copy group)
WITH c AS (SELECT run_id, rank, pg_name, win, seq, rank_rows FROM __instance_calls),
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
