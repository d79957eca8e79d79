-- node_locality: each collective instance classed as intra-node or inter-node by the hosts of its
-- group's ranks, and bandwidth per class.
-- Reads: collectives, ranks, collective_instances, collective_bandwidth
--
-- The group's ranks are collectives.pg_ranks (global ranks) of the instance's rows; a rank's host is
-- ranks.host (NULL or '' = unknown; a group rank whose trace was not ingested is unknown too).
-- locality, first rule that holds:
--   inter_node  the known hosts of the group's ranks are two or more (whatever the unknown ones are)
--   intra_node  every rank of the group has a known host and it is the same one
--   unknown     otherwise (pg_ranks unknown, or some host unknown and the known ones all equal)
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
-- locality     VARCHAR  intra_node / inter_node / unknown (header above)
CREATE OR REPLACE TABLE instance_locality AS
-- a table: the fit, the reference and bandwidth_by_locality read it. The hosts of a group's ranks
-- depend on its pg_ranks list alone: counted once per distinct (run, list), joined back to the
-- instances that recorded it
WITH groups AS (
    SELECT run_id, pg_name, seq, any_value(pg_ranks) AS pg_ranks FROM collectives
    WHERE pg_ranks IS NOT NULL GROUP BY run_id, pg_name, seq
),
lists AS (
    SELECT DISTINCT run_id, pg_ranks FROM groups
),
members AS (
    SELECT l.run_id, l.pg_ranks, unnest(l.pg_ranks) AS r FROM lists l
),
hl AS (
    SELECT m.run_id, m.pg_ranks, count(DISTINCT nullif(k.host, '')) AS hosts,
           count(*) FILTER (WHERE nullif(k.host, '') IS NULL) AS hosts_unknown
    FROM members m LEFT JOIN ranks k ON k.run_id = m.run_id AND k.rank = m.r
    GROUP BY m.run_id, m.pg_ranks
),
h AS (
    SELECT g.run_id, g.pg_name, g.seq, hl.hosts, hl.hosts_unknown
    FROM groups g JOIN hl ON hl.run_id = g.run_id AND hl.pg_ranks IS NOT DISTINCT FROM g.pg_ranks
)
SELECT i.run_id, i.pg_name, i.seq, i.op, i.group_size, coalesce(h.hosts, 0) AS hosts,
       coalesce(h.hosts_unknown, i.group_size) AS hosts_unknown,
       CASE WHEN h.hosts >= 2 THEN 'inter_node'
            WHEN h.hosts = 1 AND h.hosts_unknown = 0 THEN 'intra_node'
            ELSE 'unknown' END AS locality
FROM collective_instances i LEFT JOIN h USING (run_id, pg_name, seq);

-- bandwidth_by_locality: per run, locality, op and power-of-two size bucket (tk_size_bucket,
-- tracekit.model.size_bucket: the largest 2^k <= S), the instances' bandwidth (collective_bandwidth:
-- nccl-tests algbw/busbw over the sync time, GB/s with GB = 1e9). Medians are within one bucket,
-- never across sizes; the class's α–β fits are alpha_beta_fit's rows of scope 'locality'.
--
-- run_id              VARCHAR  run
-- locality            VARCHAR  intra_node / inter_node / unknown
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
FROM instance_locality l JOIN collective_bandwidth b USING (run_id, pg_name, seq)
WHERE l.op IS NOT NULL
GROUP BY l.run_id, l.locality, l.op, tk_size_bucket(b.size_bytes);
