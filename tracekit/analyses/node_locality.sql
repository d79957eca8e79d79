-- node_locality: each collective instance classed by the machine its group ran on (intra-node,
-- inter-node, mixed), and bandwidth per class.
-- Reads: collective_instances, collective_bandwidth, group_machine
--
-- The class is the group's (group_machine, analyses/machine.py: the hosts of its ranks from trace
-- host names, or from an nccl-tests log's "Using devices" rank lines):
--   intra_node  every rank of the group has a known host and it is the same one
--   inter_node  two or more known hosts, one rank on each (whatever the unknown ones are)
--   mixed       two or more known hosts, some with several ranks (NVLink inside, network between nodes)
--   unknown     otherwise (pg_ranks unknown, no host named, or some unknown and the known ones all equal)
--
-- instance_locality: one row per collective instance (a table, built with the module).
--
-- run_id       VARCHAR  run
-- pg_name      VARCHAR  process group
-- seq          BIGINT   instance sequence number in the group
-- op           VARCHAR  canonical op
-- group_size   INTEGER  ranks in the group
-- hosts        BIGINT   distinct known hosts among the group's ranks
-- hosts_unknown BIGINT  group ranks whose host is unknown
-- locality     VARCHAR  intra_node / inter_node / mixed / unknown (header above)
-- win          INTEGER  profiler window (collective_instances.win): (run_id, pg_name, win, seq) is the key
CREATE OR REPLACE TABLE instance_locality AS
-- a table: the fit, the reference and bandwidth_by_locality read it
SELECT i.run_id, i.pg_name, i.seq, i.op, i.group_size, coalesce(m.nodes, 0)::BIGINT AS hosts,
       coalesce(m.hosts_unknown, i.group_size)::BIGINT AS hosts_unknown,
       coalesce(m.locality, 'unknown') AS locality, i.win
FROM collective_instances i LEFT JOIN group_machine m USING (run_id, pg_name);

-- bandwidth_by_locality: per run, locality, op and power-of-two size bucket (tk_size_bucket,
-- tracekit.model.size_bucket: the largest 2^k <= S), the instances' bandwidth (collective_bandwidth:
-- nccl-tests algbw/busbw over the sync time, GB/s with GB = 1e9). Medians are within one bucket,
-- never across sizes; the class's α–β fits are alpha_beta_fit's rows of scope 'locality'.
--
-- run_id              VARCHAR  run
-- locality            VARCHAR  intra_node / inter_node / mixed / unknown
-- op                  VARCHAR  canonical op
-- bucket_bytes        BIGINT   size bucket: sizes in [bucket_bytes, 2·bucket_bytes), bytes (NULL: size unknown)
-- instances           BIGINT   instances
-- total_bytes         BIGINT   sum of size_bytes (nccl-tests S), bytes
-- median_sync_time_ns DOUBLE   median sync time in the bucket, ns
-- median_algbw_gbps   DOUBLE   median algbw in the bucket, GB/s
-- median_busbw_gbps   DOUBLE   median busbw in the bucket, GB/s
-- max_busbw_gbps      DOUBLE   best busbw in the bucket, GB/s
CREATE OR REPLACE VIEW bandwidth_by_locality AS
SELECT l.run_id, l.locality, l.op, tk_size_bucket(b.size_bytes) AS bucket_bytes, count(*) AS instances,
       sum(b.size_bytes)::BIGINT AS total_bytes, median(b.sync_time_ns)::DOUBLE AS median_sync_time_ns,
       median(b.algbw_gbps)::DOUBLE AS median_algbw_gbps, median(b.busbw_gbps)::DOUBLE AS median_busbw_gbps,
       max(b.busbw_gbps)::DOUBLE AS max_busbw_gbps
FROM instance_locality l JOIN collective_bandwidth b USING (run_id, pg_name, win, seq)
WHERE l.op IS NOT NULL
GROUP BY l.run_id, l.locality, l.op, tk_size_bucket(b.size_bytes);
