-- verdict_summary: the verdicts per op and class, and the references they were judged against —
-- what the report shows of collective_verdicts, aggregated here; the report selects and renders.
-- Reads: verdict_rows, _most_common
--
-- Each takes the instances' rows as verdict_rows gives them (collective_verdicts with bandwidth,
-- size bucket and benchmark run; analyses/collective_sizes.sql). The macros take the name of a
-- relation with those columns (query_table): the report passes its one temporary copy of a run's
-- rows (the verdicts call the model for every instance: evaluated once); the views pass verdict_rows.
--
-- verdict_statistics(tbl) → the columns of verdict_counts.
CREATE OR REPLACE MACRO verdict_statistics(tbl) AS TABLE
SELECT run_id, op, locality, verdict, verdict_basis, coalesce(reference, 'no model') AS reference, count(*) AS count,
       median(efficiency) AS median_efficiency, median(efficiency_link) AS median_efficiency_link,
       min(link) AS link, _most_common(list(no_model_reason)) AS no_model_reason
FROM query_table(tbl)
GROUP BY run_id, op, locality, verdict, verdict_basis, coalesce(reference, 'no model');

-- verdict_counts: per run, op, locality class, verdict, kind of reference and reference, the instances.
--
-- run_id                  VARCHAR  run
-- op                      VARCHAR  canonical op
-- locality                VARCHAR  intra_node / inter_node / mixed / unknown
-- verdict                 VARCHAR  skew-bound / latency-bound / bandwidth-bound; NULL: not judged
-- verdict_basis           VARCHAR  kind of reference (collective_verdicts.verdict_basis); NULL: none
-- reference               VARCHAR  the reference in words, 'no model' when there is none
-- count                   BIGINT   instances
-- median_efficiency       DOUBLE   median over the row's instances of predicted / sync time under the reference
-- median_efficiency_link  DOUBLE   median of link prediction / sync time
-- link                    VARCHAR  the hardware link compared with, or NULL
-- no_model_reason         VARCHAR  the most frequent reason for no verdict (_most_common), NULL when judged
CREATE OR REPLACE VIEW verdict_counts AS SELECT * FROM verdict_statistics('verdict_rows');

-- reference_statistics(tbl) → the columns of verdict_references.
CREATE OR REPLACE MACRO reference_statistics(tbl) AS TABLE
SELECT run_id, op, group_size, locality, verdict_basis AS kind, coalesce(reference, 'no model') AS reference,
       ref_note AS note, _most_common(list(no_model_reason)) AS no_model_reason, count(*) AS instances,
       count(DISTINCT pg_name) AS groups,
       min(ref_alpha_s) AS alpha_s, min(ref_beta_Bps) / 1e9 AS beta_gbps,
       min(ref_alpha_s * ref_beta_Bps) AS n_half_bytes,
       -- NCCL's model as reference picks a protocol per size, each with its own latency and D*:
       -- one value when every instance agrees, else NULL and the range (never an arbitrary one)
       CASE WHEN min(crossover_bytes) = max(crossover_bytes) THEN min(crossover_bytes) END AS crossover_bytes,
       min(crossover_bytes) AS crossover_min_bytes, max(crossover_bytes) AS crossover_max_bytes,
       CASE WHEN min(ref_alpha_term_ns) = max(ref_alpha_term_ns) THEN min(ref_alpha_term_ns) END
           AS fixed_latency_ns,
       min(ref_alpha_term_ns) AS fixed_latency_min_ns, max(ref_alpha_term_ns) AS fixed_latency_max_ns,
       min(link) AS link, min(link_crossover_bytes) AS link_crossover_bytes,
       string_agg(DISTINCT nccl_algo, ', ' ORDER BY nccl_algo) AS nccl_algos
FROM query_table(tbl)
GROUP BY run_id, op, group_size, locality, verdict_basis, reference, ref_note, ref_alpha_s, ref_beta_Bps;

-- verdict_references: per run, op, k, locality class and reference (each fit or α/β its own row): what
-- the verdicts were judged against (collective_reference, through collective_verdicts).
--
-- run_id                VARCHAR  run
-- op                    VARCHAR  canonical op
-- group_size            INTEGER  k
-- locality              VARCHAR  intra_node / inter_node / mixed / unknown
-- kind                  VARCHAR  kind of reference: link / user / sweep / nccl_tests / preset / own_fit; NULL: none
-- reference             VARCHAR  the reference in words, 'no model' when there is none
-- note                  VARCHAR  fallbacks and assumptions made in choosing it (ref_note)
-- no_model_reason       VARCHAR  the most frequent reason for no verdict (_most_common), NULL when judged
-- instances             BIGINT   instances judged by it
-- groups                BIGINT   distinct process groups judged by it
-- alpha_s               DOUBLE   its α, s per step
-- beta_gbps             DOUBLE   its β, GB/s per direction (GB = 1e9)
-- n_half_bytes          DOUBLE   n½ = α·β, bytes: the link's half-performance size
-- crossover_bytes       DOUBLE   the collective's D* = A·α·β/B, bytes, when every instance agrees; else NULL
-- crossover_min_bytes   DOUBLE   smallest D* over the instances, bytes
-- crossover_max_bytes   DOUBLE   largest D*, bytes
-- fixed_latency_ns      DOUBLE   the α term A·α, ns, when every instance agrees; else NULL
-- fixed_latency_min_ns  DOUBLE   smallest α term, ns
-- fixed_latency_max_ns  DOUBLE   largest α term, ns
-- link                  VARCHAR  the hardware link compared with, or NULL
-- link_crossover_bytes  DOUBLE   smallest D* under the link, bytes
-- nccl_algos            VARCHAR  NCCL's algorithm/protocol pairs a preset reference assumed, comma-separated, sorted
CREATE OR REPLACE VIEW verdict_references AS SELECT * FROM reference_statistics('verdict_rows');
