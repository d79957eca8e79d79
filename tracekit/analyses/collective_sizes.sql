-- collective_sizes: the per-size statistics the report shows (terminal, --json, HTML), computed
-- once here; the report selects from these and renders (the diff's grain: collective_sizes_by_op.sql).
-- Reads: collective_verdicts, runs, _most_common (instance_rows)
--
-- A size bucket is the power-of-two range [bucket_bytes, 2·bucket_bytes) holding the instance's
-- nccl-tests size S (tk_size_bucket = tracekit.model.size_bucket, the largest 2^k <= S: one bucket
-- per size nccl-tests steps). Every median is within one bucket, never across sizes (a median of
-- different sizes describes no call). algbw = S / t and busbw = algbw × the nccl-tests factor of
-- (op, k), GB/s with GB = 1e9 (tk_algbw, tk_busbw: tracekit.model, ../shared/reference/alpha-beta.md
-- "Bus bandwidth"). Mismatched instances have no row (collective_verdicts, collective_bandwidth).
--
-- verdict_rows: one row per judged-or-not collective instance (collective_verdicts' rows): the
-- verdict columns the report aggregates, with its bandwidth, size bucket and benchmark run. The
-- report copies one run's rows into a temporary table (the verdicts call the model for every
-- instance: evaluated once) and passes its name to the macros below; the views apply the same
-- macros to this view.
--
-- run_id               VARCHAR  run
-- pg_name              VARCHAR  process group name (nccl-tests: one benchmark run)
-- win                  INTEGER  profiler window: (run_id, pg_name, win, seq) is the key
-- seq                  BIGINT   per-group sequence number
-- op                   VARCHAR  canonical op
-- size_bytes           BIGINT   nccl-tests S, bytes
-- group_size           INTEGER  k
-- locality             VARCHAR  the group's class (collective_verdicts.locality)
-- bench_run            VARCHAR  the benchmark run (pg_name) of a nccl-tests log (runs.source 'nccl_tests'), else NULL
-- bucket_bytes         BIGINT   size bucket (tk_size_bucket(S)), bytes; NULL: size unknown
-- sync_time_ns         DOUBLE   transfer time after the last arrival, ns
-- skew_ns              BIGINT   longest wait of any rank for the last one, ns
-- algbw_gbps           DOUBLE   S / sync_time, GB/s (tk_algbw)
-- busbw_gbps           DOUBLE   algbw × factor(op, k), GB/s (tk_busbw)
-- cap_gbps             DOUBLE   the run device's fastest link, per direction, GB/s (tk_device_peak_gbps; NULL: unknown device)
-- verdict              VARCHAR  collective_verdicts.verdict
-- verdict_basis        VARCHAR  collective_verdicts.verdict_basis
-- reference            VARCHAR  collective_verdicts.reference
-- ref_note             VARCHAR  collective_verdicts.ref_note
-- no_model_reason      VARCHAR  collective_verdicts.no_model_reason
-- ref_alpha_s          DOUBLE   reference α, s
-- ref_beta_Bps         DOUBLE   reference β, bytes/s
-- ref_alpha_term_ns    DOUBLE   A·α under the reference, ns
-- predicted_ns         DOUBLE   reference prediction, ns
-- fit_predicted_ns     DOUBLE   own group's fit prediction, ns
-- crossover_bytes      DOUBLE   D* under the reference, bytes
-- efficiency           DOUBLE   predicted / sync_time under the reference
-- link                 VARCHAR  the hardware link compared with, or NULL
-- link_predicted_ns    DOUBLE   link prediction, ns
-- link_crossover_bytes DOUBLE   D* under the link, bytes
-- efficiency_link      DOUBLE   link_predicted / sync_time
-- best_algo            VARCHAR  fastest model algorithm under the reference
-- best_predicted_ns    DOUBLE   its predicted time, ns
-- nccl_algo            VARCHAR  NCCL's algorithm/protocol a preset reference assumed
CREATE OR REPLACE VIEW verdict_rows AS
SELECT v.run_id, v.pg_name, v.win, v.seq, v.op, v.size_bytes, v.group_size, v.locality,
       CASE WHEN r.source = 'nccl_tests' THEN v.pg_name END AS bench_run,
       tk_size_bucket(v.size_bytes) AS bucket_bytes, v.sync_time_ns, v.skew_ns,
       tk_algbw(v.size_bytes, v.sync_time_ns) AS algbw_gbps,
       tk_busbw(v.op, v.size_bytes, v.sync_time_ns, v.group_size) AS busbw_gbps,
       tk_device_peak_gbps(r.device_name) AS cap_gbps,
       v.verdict, v.verdict_basis, v.reference, v.ref_note, v.no_model_reason, v.ref_alpha_s, v.ref_beta_Bps,
       v.ref_alpha_term_ns, v.predicted_ns, v.fit_predicted_ns, v.crossover_bytes, v.efficiency, v.link,
       v.link_predicted_ns, v.link_crossover_bytes, v.efficiency_link, v.best_algo, v.best_predicted_ns, v.nccl_algo
FROM collective_verdicts v LEFT JOIN runs r USING (run_id);

-- size_statistics(tbl) → the columns of collective_sizes: tbl is the name of a table or view
-- with verdict_rows' columns (query_table). Instances of size 0 are left out (no bandwidth).
CREATE OR REPLACE MACRO size_statistics(tbl) AS TABLE
SELECT run_id, op, group_size, locality, bench_run, bucket_bytes, count(*) AS count,
       count(DISTINCT size_bytes) AS sizes,
       median(sync_time_ns) AS median_sync_time_ns, median(algbw_gbps) AS median_algbw_gbps,
       median(busbw_gbps) AS median_busbw_gbps,
       -- a 1-rank group moves nothing between ranks: busbw 0 by nccl-tests' factor at n = 1, no peak
       CASE WHEN group_size IS DISTINCT FROM 1 THEN max(busbw_gbps) END AS peak_busbw_gbps,
       max(cap_gbps) AS cap_gbps,
       median(predicted_ns) AS median_predicted_ns, median(efficiency) AS median_efficiency,
       _most_common(list(verdict)) AS verdict, count(DISTINCT verdict) AS verdicts,  -- ties: first by name
       count(DISTINCT coalesce(reference, 'no model')) AS "references",
       min(link) AS link, median(link_predicted_ns) AS median_link_predicted_ns,
       median(efficiency_link) AS median_efficiency_link, min(link_crossover_bytes) AS link_crossover_bytes,
       CASE WHEN min(link_crossover_bytes) IS NULL THEN NULL
            WHEN bucket_bytes >= min(link_crossover_bytes) THEN 'bandwidth' ELSE 'latency' END AS link_regime
FROM query_table(tbl) WHERE size_bytes > 0
GROUP BY run_id, op, group_size, locality, bench_run, bucket_bytes;

-- collective_sizes: per run, op, group size k, locality class, benchmark run of a nccl-tests log
-- (bench_run; NULL otherwise) and size bucket, the nccl-tests-style table: size_statistics over
-- verdict_rows. Instances of size 0 are left out.
--
-- run_id                   VARCHAR  run
-- op                       VARCHAR  canonical op
-- group_size               INTEGER  k (NULL: nothing names the group)
-- locality                 VARCHAR  intra_node / inter_node / mixed / unknown
-- bench_run                VARCHAR  benchmark run of a nccl-tests log (its pg_name), else NULL
-- bucket_bytes             BIGINT   size bucket: sizes in [bucket_bytes, 2·bucket_bytes), bytes
-- count                    BIGINT   instances
-- sizes                    BIGINT   distinct sizes in the bucket
-- median_sync_time_ns      DOUBLE   median sync time, ns
-- median_algbw_gbps        DOUBLE   median algbw, GB/s
-- median_busbw_gbps        DOUBLE   median busbw, GB/s
-- peak_busbw_gbps          DOUBLE   largest busbw, GB/s; NULL for k = 1 (busbw 0 by definition, not a measurement)
-- cap_gbps                 DOUBLE   the device's fastest link, GB/s (NULL: unknown device)
-- median_predicted_ns      DOUBLE   median of the reference's predicted time, ns
-- median_efficiency        DOUBLE   median of predicted / sync_time under the reference
-- verdict                  VARCHAR  the most frequent verdict (ties: first by name; _most_common)
-- verdicts                 BIGINT   distinct verdicts in the bucket
-- references               BIGINT   distinct references that judged the bucket's groups ('no model' counts as one);
--                                   > 1: the model time and efficiency are medians over them
-- link                     VARCHAR  the hardware link compared with, or NULL
-- median_link_predicted_ns DOUBLE   median link prediction, ns
-- median_efficiency_link   DOUBLE   median link_predicted / sync_time
-- link_crossover_bytes     DOUBLE   smallest D* under the link, bytes
-- link_regime              VARCHAR  'bandwidth' when bucket_bytes >= link_crossover_bytes, else 'latency'; NULL without a link
CREATE OR REPLACE VIEW collective_sizes AS SELECT * FROM size_statistics('verdict_rows');

-- peak_statistics(tbl) → the columns of collective_peaks (tbl: a relation with verdict_rows' columns).
CREATE OR REPLACE MACRO peak_statistics(tbl) AS TABLE
SELECT run_id, op, group_size, bench_run, max(busbw_gbps) AS peak_busbw_gbps,
       arg_max(size_bytes, busbw_gbps) AS at_size_bytes, count(DISTINCT bucket_bytes) AS size_buckets
FROM query_table(tbl) WHERE size_bytes > 0 AND busbw_gbps IS NOT NULL AND group_size > 1
GROUP BY run_id, op, group_size, bench_run;

-- collective_peaks: per run, op, k > 1 and benchmark run of a nccl-tests log, the largest busbw and
-- the size it was reached at: the headline of a sweep (a maximum, not a median).
--
-- run_id           VARCHAR  run
-- op               VARCHAR  canonical op
-- group_size       INTEGER  k (> 1)
-- bench_run        VARCHAR  benchmark run of a nccl-tests log, else NULL
-- peak_busbw_gbps  DOUBLE   largest busbw, GB/s
-- at_size_bytes    BIGINT   the size of that instance, bytes
-- size_buckets     BIGINT   size buckets with a busbw
CREATE OR REPLACE VIEW collective_peaks AS SELECT * FROM peak_statistics('verdict_rows');
