-- collective_sizes_by_op: the per-size statistics `tracekit diff` compares, computed here; the diff
-- selects and renders.
-- Reads: collective_instances, __instance_calls, collective_waits, collective_overlap
--
-- A size bucket is the power-of-two range [bucket_bytes, 2·bucket_bytes) holding the instance's
-- nccl-tests size S (tk_size_bucket = tracekit.model.size_bucket); every median is within one bucket,
-- never across sizes. busbw = S / t × the nccl-tests factor of (op, k), GB/s with GB = 1e9 (tk_busbw:
-- tracekit.model, ../shared/reference/alpha-beta.md "Bus bandwidth").
--
-- collective_sizes_by_op: per run, op and size bucket over every process group, k and class (the
-- grain `tracekit diff` compares two runs at), the instances' statistics and time. Every
-- non-mismatched instance (the rows of collective_bandwidth; algbw and busbw by the same tk_busbw),
-- size 0 (bucket 0) and unknown sizes (bucket NULL) included. An instance is (run, group, profiler
-- window, seq) (collective_instances.win): the waits and spans of a seq that restarts in a second
-- window are that window's instance's, and a span written twice counts once (__instance_calls).
-- Spans of different instances on one rank may overlap each other: comm_ns need not add up to a
-- rank's communication time.
--
-- run_id              VARCHAR  run
-- op                  VARCHAR  canonical op
-- bucket_bytes        BIGINT   size bucket, bytes (0: size 0; NULL: size unknown)
-- count               BIGINT   instances
-- groups              BIGINT   distinct process groups (nccl-tests: benchmark runs) of those instances
-- median_sync_time_ns DOUBLE   median sync time, ns
-- median_busbw_gbps   DOUBLE   median busbw, GB/s
-- peak_busbw_gbps     DOUBLE   largest busbw, GB/s
-- wait_ns             BIGINT   Σ over instances and ranks of the wait for the last arrival (collective_waits), ns
-- comm_ns             BIGINT   Σ of the ranks' communication spans of those instances (dur_ns), ns
-- overlap_ns          BIGINT   the part of those spans covered by compute (collective_overlap), ns
-- exposed_comm_ns     BIGINT   comm_ns − overlap_ns, ns
-- overlap_ratio       DOUBLE   overlap_ns / comm_ns; NULL when comm_ns = 0
CREATE OR REPLACE VIEW collective_sizes_by_op AS
WITH calls AS (
    SELECT c.run_id, c.pg_name, c.win, c.seq, sum(c.dur_ns) AS comm_ns, sum(coalesce(o.overlap_ns, 0)) AS overlap_ns
    FROM __instance_calls c
    LEFT JOIN collective_overlap o ON o.run_id = c.run_id AND o.rank = c.rank AND o.event_id = c.event_id
    GROUP BY c.run_id, c.pg_name, c.win, c.seq
),
w AS (
    SELECT run_id, pg_name, win, seq, sum(wait_ns) AS wait_ns FROM collective_waits GROUP BY ALL
),
b AS (
    SELECT run_id, pg_name, win, seq, op, size_bytes, sync_time_ns,
           tk_busbw(op, size_bytes, sync_time_ns, group_size) AS busbw_gbps
    FROM collective_instances WHERE NOT mismatched
),
s AS (
    SELECT b.run_id, b.op, tk_size_bucket(b.size_bytes) AS bucket_bytes, count(*) AS count,
           count(DISTINCT b.pg_name) AS groups,
           median(b.sync_time_ns) AS median_sync_time_ns,
           median(b.busbw_gbps) AS median_busbw_gbps, max(b.busbw_gbps) AS peak_busbw_gbps,
           coalesce(sum(w.wait_ns), 0)::BIGINT AS wait_ns,
           coalesce(sum(calls.comm_ns), 0)::BIGINT AS comm_ns,
           coalesce(sum(calls.overlap_ns), 0)::BIGINT AS overlap_ns
    FROM b
    LEFT JOIN w USING (run_id, pg_name, win, seq)
    LEFT JOIN calls USING (run_id, pg_name, win, seq)
    GROUP BY b.run_id, b.op, tk_size_bucket(b.size_bytes)
)
SELECT *, comm_ns - overlap_ns AS exposed_comm_ns,
       CASE WHEN comm_ns > 0 THEN overlap_ns / comm_ns END AS overlap_ratio
FROM s;
