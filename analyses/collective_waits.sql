-- collective_waits: one row per (instance, rank): how long each rank waited for the slowest.
-- Reads: _instance_calls, collective_instances
--
-- A rank's row is its collectives row as matched (analyses/instance_rows.sql: a span written twice
-- counts once; a rank's rows are matched within their profiler window, key (pg, win, seq)).
-- Instances in conflict (a rank recorded several different spans for one key) have no waits: no
-- single start is that rank's.
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
--                     arrival is the latest start of the instance's rows)
-- is_straggler BOOLEAN this rank arrived last
-- win        INTEGER  profiler window (collective_instances.win)
CREATE OR REPLACE VIEW collective_waits AS
SELECT c.run_id, c.pg_name, c.seq, c.rank, c.event_id, i.op, c.ts_ns, c.dur_ns,
       i.last_arrival_ns - c.ts_ns AS wait_ns,
       (c.rank = i.straggler) AS is_straggler, c.win
FROM _instance_calls c JOIN collective_instances i USING (run_id, pg_name, win, seq)
WHERE NOT i.conflict;
