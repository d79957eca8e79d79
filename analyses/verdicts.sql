-- collective_verdicts: each collective instance against the α–β model — predicted time, α and β
-- terms, verdict, efficiency and the best algorithm for its size.
-- Depends on: collective_instances, collective_samples, alpha_beta_fit
--
-- Two predictions per instance (../shared/reference/alpha-beta.md; every number from
-- tracekit.model through tk_* UDFs, T = A·α + B·D/β with (A, B) = algorithm_coefficients):
--   fit:  α, β fitted on this run's own samples for (op, group size) (alpha_beta_fit, status 'ok');
--   link: the preset named by the DuckDB variable tk_link (`tracekit analyze --link nvlink4`);
--         NULL when unset.
-- The link prediction uses the algorithm the kernel name reports when the model has it (RING → ring,
-- TREE → tree, NVLS → nvls), else the op's default (ring; pairwise for all-to-all; p2p for send);
-- the fit prediction uses the algorithm the fit derived α and β through (alpha_beta_fit.algo), so
-- that it reproduces the fitted line.
-- verdict: 'skew-bound' when the longest wait before the instance (skew) exceeds its sync time;
-- else 'latency-bound' when the α term >= the β term, 'bandwidth-bound' otherwise — terms from the
-- fit when there is one, else from the link (verdict_basis says which); NULL when neither applies
-- or when the instance has no sync time (collective_instances: a conflict, or clocks that disagree).
--
-- run_id              VARCHAR  run
-- pg_name             VARCHAR  process group name
-- seq                 BIGINT   per-group sequence number
-- op                  VARCHAR  canonical op
-- size_bytes          BIGINT   nccl-tests S, bytes
-- group_size          INTEGER  k
-- model_algo          VARCHAR  algorithm the link prediction assumes
-- sync_time_ns        DOUBLE   measured transfer time after the last arrival, ns
-- skew_ns             BIGINT   longest wait of any rank for the last one, ns
-- fit_alpha_s         DOUBLE   fitted α, s (NULL without a fit)
-- fit_beta_Bps        DOUBLE   fitted β, bytes/s per direction
-- fit_alpha_term_ns   DOUBLE   A·α, ns
-- fit_beta_term_ns    DOUBLE   B·D/β, ns
-- fit_predicted_ns    DOUBLE   α term + β term, ns
-- link                VARCHAR  preset name (tk_link), or NULL
-- link_alpha_term_ns  DOUBLE   A·α of the preset, ns
-- link_beta_term_ns   DOUBLE   B·D/β of the preset (β = nominal × 0.8), ns
-- link_predicted_ns   DOUBLE   preset prediction, ns
-- verdict             VARCHAR  skew-bound / latency-bound / bandwidth-bound
-- verdict_basis       VARCHAR  'fit' or 'link': which terms decided the verdict
-- efficiency          DOUBLE   fit_predicted / sync_time (1 = as the model says; < 1 slower)
-- efficiency_link     DOUBLE   link_predicted / sync_time
-- best_algo           VARCHAR  fastest model algorithm for this op, size and k under the basis' α, β
--                               (in-switch nvls considered only against an nvlink* preset)
-- best_predicted_ns   DOUBLE   its predicted time, ns
CREATE OR REPLACE VIEW collective_verdicts AS
WITH i AS (
    SELECT i.*, tk_model_algo(i.op, i.algo, i.group_size) AS model_algo FROM collective_instances i
),
f AS (
    SELECT run_id, op, group_size, algo AS fit_algo, alpha_s, beta_Bps FROM alpha_beta_fit WHERE status = 'ok'
),
t AS (
    SELECT i.run_id, i.pg_name, i.seq, i.op, i.size_bytes, i.group_size, i.model_algo, i.sync_time_ns, i.skew_ns,
           f.alpha_s AS fit_alpha_s, f.beta_Bps AS fit_beta_Bps,
           -- the fit's α, β are defined through its own algorithm's coefficients: predict with those
           tk_alpha_coeff(i.op, f.fit_algo, i.group_size) * f.alpha_s * 1e9 AS fit_alpha_term_ns,
           tk_beta_coeff(i.op, f.fit_algo, i.group_size) * i.size_bytes / f.beta_Bps * 1e9 AS fit_beta_term_ns,
           getvariable('tk_link') AS link,
           tk_alpha_coeff(i.op, i.model_algo, i.group_size) * tk_link_alpha(getvariable('tk_link')) * 1e9 AS link_alpha_term_ns,
           tk_beta_coeff(i.op, i.model_algo, i.group_size) * i.size_bytes
               / tk_link_beta(getvariable('tk_link')) * 1e9 AS link_beta_term_ns
    FROM i LEFT JOIN f ON f.run_id = i.run_id AND f.op = i.op AND f.group_size = i.group_size
),
p AS (
    SELECT *, fit_alpha_term_ns + fit_beta_term_ns AS fit_predicted_ns,
           link_alpha_term_ns + link_beta_term_ns AS link_predicted_ns,
           CASE WHEN fit_alpha_term_ns IS NOT NULL AND fit_beta_term_ns IS NOT NULL THEN 'fit'
                WHEN link_alpha_term_ns IS NOT NULL AND link_beta_term_ns IS NOT NULL THEN 'link' END AS verdict_basis
    FROM t
)
SELECT run_id, pg_name, seq, op, size_bytes, group_size, model_algo, sync_time_ns, skew_ns,
       fit_alpha_s, fit_beta_Bps, fit_alpha_term_ns, fit_beta_term_ns, fit_predicted_ns,
       link, link_alpha_term_ns, link_beta_term_ns, link_predicted_ns,
       CASE
         WHEN sync_time_ns IS NULL THEN NULL  -- no measured transfer time (a conflict): no verdict
         WHEN skew_ns > sync_time_ns THEN 'skew-bound'
         WHEN verdict_basis = 'fit' THEN tk_verdict(fit_alpha_term_ns, fit_beta_term_ns)
         WHEN verdict_basis = 'link' THEN tk_verdict(link_alpha_term_ns, link_beta_term_ns)
       END AS verdict,
       verdict_basis,
       CASE WHEN sync_time_ns > 0 THEN fit_predicted_ns / sync_time_ns END AS efficiency,
       CASE WHEN sync_time_ns > 0 THEN link_predicted_ns / sync_time_ns END AS efficiency_link,
       tk_best_algo(op, size_bytes, group_size,
                    CASE verdict_basis WHEN 'fit' THEN fit_alpha_s ELSE tk_link_alpha(link) END,
                    CASE verdict_basis WHEN 'fit' THEN fit_beta_Bps ELSE tk_link_beta(link) END,
                    verdict_basis = 'link' AND link LIKE 'nvlink%') AS best_algo,
       tk_best_time(op, size_bytes, group_size,
                    CASE verdict_basis WHEN 'fit' THEN fit_alpha_s ELSE tk_link_alpha(link) END,
                    CASE verdict_basis WHEN 'fit' THEN fit_beta_Bps ELSE tk_link_beta(link) END,
                    verdict_basis = 'link' AND link LIKE 'nvlink%') * 1e9 AS best_predicted_ns
FROM p;
