-- kernel_summary: GPU ops by name per class, and GPU time by the CPU op / record_function range that
-- launched it.
-- Reads: gpu_time_breakdown, _gpu_op_durations, _gpu_launcher_summary (all three analyses/gpu_time_breakdown.py)
--
-- GPU ops = events on GPU tracks (track_kind = 'gpu_stream': kernels, memcpy, memset, sync; not
-- Kineto's gpu_user_annotation ranges, labels spanning the work they name), one
-- row each, durations as stored (dur_ns, after the ingest's stream clipping). Totals are sums of
-- durations, not unions: ops on different streams that run at once each count in full.
-- The ops are read from the ingest's per-rank histogram (_gpu_op_durations: the stored
-- gpu_op_durations, ops counted per class, name and duration; tracekit.store), never from the
-- events: it merges exactly over ranks, so every column below is what the same statistic over the
-- events' GPU ops gives, the quantiles included.
--
-- kernel_summary: one row per run, class and op name, all ranks together.
--
-- run_id        VARCHAR  run
-- class         VARCHAR  events.class (compute / comm / memory / sync / other)
-- name          VARCHAR  op name (kernel name, "Memcpy HtoD ...", ...)
-- class_rank    BIGINT   1 = the largest total_ns in its class, 2 = next, ... (ties by name)
-- ranks         BIGINT   ranks that ran it
-- count         BIGINT   ops
-- total_ns      BIGINT   sum of durations, ns
-- mean_ns       DOUBLE   total_ns / count, ns (DuckDB's avg of the durations: tk_int_mean)
-- p50_ns        BIGINT   median duration (the lower middle value for an even count: quantile_disc), ns
-- p95_ns        BIGINT   95th-percentile duration (quantile_disc: a duration that occurred), ns
-- max_ns        BIGINT   longest, ns
-- step_total_ns BIGINT   sum of durations of the ops launched in a profiler step (events.step not null), ns
-- step_share    DOUBLE   step_total_ns / the sum of the step windows over ranks and steps (gpu_time_breakdown,
--                        grp >= 0: first start to last end of each step's GPU work); NULL without steps
--
-- quantile_disc(x, q) over n values is the value at 0-based position max(1, n − ⌊n·(1 − q)⌋) − 1 of
-- the sorted values (DuckDB's rule, q a decimal: exact integer arithmetic); over the histogram, the
-- shortest duration whose running count of ops passes that position.
CREATE OR REPLACE VIEW kernel_summary AS
WITH steps AS (
    SELECT run_id, sum(window_ns) AS step_window_ns FROM gpu_time_breakdown WHERE grp >= 0 GROUP BY run_id
),
d AS (  -- per run, class, name and duration: all ranks' ops
    SELECT run_id, class, name, dur_ns, sum(ops)::BIGINT AS ops
    FROM _gpu_op_durations WHERE dur_ns IS NOT NULL GROUP BY ALL
),
q AS (  -- per run, class and name: the quantiles, from the running counts over the sorted durations
    SELECT run_id, class, name,
           min(dur_ns) FILTER (WHERE upto > greatest(1, n - (n * 5) // 10) - 1) AS p50_ns,
           min(dur_ns) FILTER (WHERE upto > greatest(1, n - (n * 5) // 100) - 1) AS p95_ns
    FROM (SELECT *, sum(ops) OVER (PARTITION BY run_id, class, name ORDER BY dur_ns
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto,
                    sum(ops) OVER (PARTITION BY run_id, class, name) AS n
          FROM d)
    GROUP BY ALL
),
k AS (
    SELECT run_id, class, name, count(DISTINCT rank) AS ranks, sum(ops)::BIGINT AS count,
           sum(dur_ns::HUGEINT * ops)::BIGINT AS total_ns,
           sum(ops) FILTER (WHERE dur_ns IS NOT NULL)::BIGINT AS timed,
           max(dur_ns) AS max_ns,
           coalesce(sum(dur_ns::HUGEINT * step_ops), 0)::BIGINT AS step_total_ns
    FROM _gpu_op_durations GROUP BY run_id, class, name
)
SELECT k.run_id, k.class, k.name,
       row_number() OVER (PARTITION BY k.run_id, k.class ORDER BY k.total_ns DESC, k.name) AS class_rank,
       k.ranks, k.count, k.total_ns, tk_int_mean(k.total_ns, k.timed) AS mean_ns, q.p50_ns::BIGINT AS p50_ns,
       q.p95_ns::BIGINT AS p95_ns, k.max_ns::BIGINT AS max_ns, k.step_total_ns,
       CASE WHEN s.step_window_ns > 0 THEN k.step_total_ns / s.step_window_ns END AS step_share
FROM k LEFT JOIN q ON q.run_id = k.run_id AND q.class = k.class AND q.name IS NOT DISTINCT FROM k.name
LEFT JOIN steps s ON s.run_id = k.run_id;

-- gpu_time_by_launcher: GPU time per launcher, one row per run, kind and launcher name (all ranks).
-- Each GPU op counts once per kind, so each kind's gpu_total_ns sums to the run's total GPU op time.
-- The launchers are those of gpu_launchers (the innermost cpu_op / record_function range around
-- the op's launch call: tracekit/timeline/gpu.py); the per-rank sums come from the ingest
-- (_gpu_launcher_summary: the stored gpu_launcher_summary; gpu_time_breakdown refuses a run stored
-- without it), so this view reads no GPU op and builds no gpu_launchers.
--
-- run_id        VARCHAR  run
-- launcher_kind VARCHAR  cpu_op (innermost aten/CPU op) or annotation (innermost record_function range)
-- launcher      VARCHAR  its name; NULL for GPU ops with no such enclosing range (or no launch link)
-- ranks         BIGINT   ranks with such ops
-- gpu_ops       BIGINT   GPU ops launched under it
-- gpu_total_ns  BIGINT   sum of their durations, ns
-- compute_ns    BIGINT   the part of gpu_total_ns in class compute, ns
-- comm_ns       BIGINT   the part in class comm, ns
-- share         DOUBLE   gpu_total_ns / the run's total GPU op time (NULL when that is 0)
CREATE OR REPLACE VIEW gpu_time_by_launcher AS
WITH agg AS (
    SELECT run_id, launcher_kind, launcher, count(DISTINCT rank) AS ranks, sum(gpu_ops)::BIGINT AS gpu_ops,
           sum(gpu_total_ns)::BIGINT AS gpu_total_ns, sum(compute_ns)::BIGINT AS compute_ns,
           sum(comm_ns)::BIGINT AS comm_ns
    FROM _gpu_launcher_summary GROUP BY run_id, launcher_kind, launcher
)
SELECT *, CASE WHEN sum(gpu_total_ns) OVER (PARTITION BY run_id, launcher_kind) > 0
               THEN gpu_total_ns / sum(gpu_total_ns) OVER (PARTITION BY run_id, launcher_kind) END AS share
FROM agg;
