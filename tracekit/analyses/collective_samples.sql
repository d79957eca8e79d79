-- collective_samples: the (size, time) measurements the α–β fit uses, one per collective instance.
-- Reads: collective_instances, collectives, runs
--
-- From traces: complete, agreeing instances (barriers aside) with a known size > 0 and sync time > 0, the time
-- being sync_time (after the last arrival, so waiting is excluded). From nccl-tests runs: every
-- row (already an average over iterations after warm-up), the time being the log's, except rows in
-- which nccl-tests found wrong values (collectives.wrong > 0: #wrong, or a FAILED out-of-bounds footer).
--
-- run_id       VARCHAR  run
-- source       VARCHAR  'trace' or 'nccl_tests'
-- pg_name      VARCHAR  process group name
-- seq          BIGINT   per-group sequence number
-- op           VARCHAR  canonical op
-- algo         VARCHAR  algorithm the kernel name reports (RING, TREE, ...; informational), or NULL:
--                        the instance's (collective_instances.algo)
-- group_size   INTEGER  ranks in the group (k of the model)
-- size_bytes   BIGINT   nccl-tests S, bytes
-- time_ns      DOUBLE   measured transfer time, ns
-- warmup       BOOLEAN  first call on its communicator (trace runs): connection set-up, excluded from fits
CREATE OR REPLACE VIEW collective_samples AS
WITH first_seq AS (
    SELECT run_id, pg_name, min(seq) AS seq0 FROM collectives WHERE seq IS NOT NULL GROUP BY ALL
)
SELECT i.run_id, 'trace' AS source, i.pg_name, i.seq, i.op, i.algo, i.group_size, i.size_bytes,
       i.sync_time_ns AS time_ns, (i.seq = f.seq0) AS warmup
FROM collective_instances i
JOIN runs r USING (run_id)
JOIN first_seq f USING (run_id, pg_name)
WHERE r.source <> 'nccl_tests' AND i.complete AND NOT i.disagree AND i.op <> 'barrier'
  AND i.size_bytes > 0 AND i.sync_time_ns > 0
UNION ALL
SELECT c.run_id, 'nccl_tests', c.pg_name, c.seq, c.op, c.algo, c.group_size, c.size_bytes,
       c.dur_ns::DOUBLE, false
FROM collectives c JOIN runs r USING (run_id)
WHERE r.source = 'nccl_tests' AND c.op IS NOT NULL AND c.size_bytes > 0 AND c.dur_ns > 0
  AND coalesce(c.wrong, 0) = 0;
