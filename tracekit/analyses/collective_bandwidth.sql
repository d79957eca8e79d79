-- collective_bandwidth: algbw and busbw per collective instance, by the nccl-tests rules.
-- Reads: collective_instances, runs
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
-- k_source      VARCHAR  where n came from (collective_instances.k_source: metadata / shapes /
--                        membership / world; 'world' = the world size, a guess for a sub-group's call)
-- cap_gbps      DOUBLE   the physical cap: nominal per-direction rate of the run device's intra-node
--                        link (tk_device_peak_gbps: tracekit.model.links, vendor data sheets), GB/s;
--                        the fastest link a rank has, so the cap of any locality; NULL: unknown device
-- complete      BOOLEAN  collective_instances.complete: when false, the sync time still holds the wait for
--                        ranks not recorded, so algbw and busbw are lower bounds
-- win           INTEGER  profiler window (collective_instances.win): (run_id, pg_name, win, seq) is the key
-- over_cap      BOOLEAN  busbw_gbps > cap_gbps: not a rate the hardware can carry — a wrong group size
--                        or size, clocks, or an in-switch reduction (NVLS/SHARP all-reduce); the report
--                        flags it, never shows it bare. NULL when either is NULL
-- Mismatched instances (collective_instances.mismatched) are left out; a CPU enqueue of an
-- asynchronous backend (async_cpu) has sync_time_ns NULL, hence no bandwidth.
CREATE OR REPLACE VIEW collective_bandwidth AS
SELECT *, busbw_gbps > cap_gbps AS over_cap FROM (
    SELECT i.run_id, i.pg_name, i.seq, i.op, i.size_bytes, i.group_size, i.sync_time_ns,
           tk_algbw(i.size_bytes, i.sync_time_ns) AS algbw_gbps,
           tk_busbw_factor(i.op, i.group_size) AS bus_factor,
           tk_busbw(i.op, i.size_bytes, i.sync_time_ns, i.group_size) AS busbw_gbps,
           i.k_source, tk_device_peak_gbps(r.device_name) AS cap_gbps, i.complete, i.win
    FROM collective_instances i LEFT JOIN runs r USING (run_id)
    WHERE NOT i.mismatched
);

-- bandwidth_by_size: per run, process group (a nccl-tests log: benchmark run), op, group size and
-- power-of-two size bucket (tk_size_bucket = tracekit.model.size_bucket, the largest 2^k <= S: one
-- bucket per nccl-tests size), the instances' bandwidth. Medians are within one bucket, never across
-- sizes; the peak is the bucket's best busbw.
--
-- run_id              VARCHAR  run
-- pg_name             VARCHAR  process group name (nccl-tests: one benchmark run)
-- op                  VARCHAR  canonical op
-- group_size          INTEGER  n
-- bucket_bytes        BIGINT   size bucket: sizes in [bucket_bytes, 2·bucket_bytes), bytes (NULL: size unknown)
-- instances           BIGINT   instances
-- sizes               BIGINT   distinct sizes in the bucket
-- total_bytes         BIGINT   sum of size_bytes, bytes
-- median_sync_time_ns DOUBLE   median sync time, ns
-- median_algbw_gbps   DOUBLE   median algbw, GB/s
-- median_busbw_gbps   DOUBLE   median busbw, GB/s
-- peak_busbw_gbps     DOUBLE   largest busbw, GB/s
-- over_cap            BIGINT   instances whose busbw exceeds the physical cap (collective_bandwidth.over_cap)
-- k_world             BIGINT   instances whose n is the world size (k_source 'world'), a guess
CREATE OR REPLACE VIEW bandwidth_by_size AS
SELECT run_id, pg_name, op, group_size, tk_size_bucket(size_bytes) AS bucket_bytes, count(*) AS instances,
       count(DISTINCT size_bytes) AS sizes, sum(size_bytes)::BIGINT AS total_bytes,
       median(sync_time_ns)::DOUBLE AS median_sync_time_ns, median(algbw_gbps)::DOUBLE AS median_algbw_gbps,
       median(busbw_gbps)::DOUBLE AS median_busbw_gbps, max(busbw_gbps)::DOUBLE AS peak_busbw_gbps,
       count(*) FILTER (WHERE over_cap) AS over_cap, count(*) FILTER (WHERE k_source = 'world') AS k_world
FROM collective_bandwidth
GROUP BY run_id, pg_name, op, group_size, tk_size_bucket(size_bytes);
