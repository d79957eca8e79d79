-- collective_waits: one row per (instance, rank): how long each rank waited for the slowest.
-- Reads: collectives, collective_instances
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
