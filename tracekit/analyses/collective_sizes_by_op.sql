-- collective_sizes_by_op: the per-size statistics and run totals `tracekit diff` compares, computed
-- here; the diff selects and renders.
-- Reads: collective_instances, __instance_calls, collective_waits, collective_overlap, overlap_by_rank, runs
--        (and names "ranks", a column named as the base view)
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

-- run_comm_totals: per run, the whole-trace communication totals `tracekit diff` sets beside its rows:
-- sums over ranks of overlap_by_rank (each rank's unions over its whole trace). A run without
-- overlap rows (a nccl-tests log: no timeline) has zeros here; the diff shows none for it.
--
-- run_id           VARCHAR  run
-- ranks            BIGINT   ranks with an overlap_by_rank row
-- comm_ns          BIGINT   Σ over ranks of |∪ comm|, ns
-- compute_ns       BIGINT   Σ over ranks of |∪ compute|, ns
-- overlap_ns       BIGINT   Σ over ranks of |comm ∩ compute|, ns
-- exposed_comm_ns  BIGINT   Σ over ranks of comm − overlap, ns
-- overlap_ratio    DOUBLE   overlap_ns / comm_ns; NULL when comm_ns = 0
CREATE OR REPLACE VIEW run_comm_totals AS
WITH o AS (
    SELECT run_id, count(*) AS ranks, sum(comm_ns)::BIGINT AS comm_ns, sum(compute_ns)::BIGINT AS compute_ns,
           sum(overlap_ns)::BIGINT AS overlap_ns, sum(exposed_comm_ns)::BIGINT AS exposed_comm_ns
    FROM overlap_by_rank GROUP BY run_id
)
SELECT r.run_id, coalesce(o.ranks, 0) AS ranks, coalesce(o.comm_ns, 0) AS comm_ns,
       coalesce(o.compute_ns, 0) AS compute_ns, coalesce(o.overlap_ns, 0) AS overlap_ns,
       coalesce(o.exposed_comm_ns, 0) AS exposed_comm_ns,
       CASE WHEN coalesce(o.comm_ns, 0) <> 0 THEN o.overlap_ns / o.comm_ns END AS overlap_ratio
FROM runs r LEFT JOIN o USING (run_id);
