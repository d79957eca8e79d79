-- collective_bandwidth: algbw and busbw per collective instance, by the nccl-tests rules.
-- Reads: collective_instances
--
-- algbw = S / t and busbw = algbw × factor(op, n), with S = size_bytes, t = sync_time, n = the
-- process group's size (never the world size); factor from tracekit.model.busbw_factor
-- (../shared/reference/alpha-beta.md, "Bus bandwidth"); both through tracekit.model (tk_algbw,
-- tk_busbw). GB = 1e9 B.
-- Instances with unknown size or non-positive sync time get NULL bandwidths.
--
-- run_id        VARCHAR  run
-- pg_name       VARCHAR  process group name
-- seq           BIGINT   per-group sequence number
-- op            VARCHAR  canonical op
-- size_bytes    BIGINT   nccl-tests S, bytes
-- group_size    INTEGER  n
-- sync_time_ns  DOUBLE   transfer time after the last arrival, ns
-- algbw_gbps    DOUBLE   S / sync_time, GB/s
-- bus_factor    DOUBLE   nccl-tests bus-bandwidth factor for (op, n)
-- busbw_gbps    DOUBLE   algbw × bus_factor, GB/s (comparable to a link's β; in-switch and
--                        hierarchical algorithms may exceed it: not clipped)
CREATE OR REPLACE VIEW collective_bandwidth AS
SELECT run_id, pg_name, seq, op, size_bytes, group_size, sync_time_ns,
       tk_algbw(size_bytes, sync_time_ns) AS algbw_gbps,
       tk_busbw_factor(op, group_size) AS bus_factor,
       tk_busbw(op, size_bytes, sync_time_ns, group_size) AS busbw_gbps
FROM collective_instances;
