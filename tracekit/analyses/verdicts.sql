-- collective_verdicts: each collective instance against the α–β model — predicted time, α and β
-- terms, verdict, efficiency, the collective's crossover size and the best algorithm for its size.
-- Reads: collective_instances, collective_samples, alpha_beta_fit, collective_reference, group_machine, runs,
--        collective_bandwidth
--
-- Every number from tracekit.model through tk_* UDFs: T = A·α + B·D/β with (A, B) =
-- algorithm_coefficients (../shared/reference/alpha-beta.md). Three α/β sources per instance:
--   ref:  the reference chosen for its (run, group, op, k) by collective_reference (the user's link
--         or α/β; else the group's own ok fit; else the machine's newest ok sweep / nccl-tests fit;
--         else the preset of its device and locality class; else none, with no_model_reason; the
--         order and its reasons: analyses/fit.py) — the verdict and `efficiency` use it;
--   link: the hardware link (the user's, else the device/topology preset) — `efficiency_link`;
--   fit:  the ok fit of the instance's own process group for (op, k) (alpha_beta_fit, scope 'group';
--         fits that are insufficient or poor are never used) — shown for comparison (and the
--         reference itself when collective_reference chose it).
-- The algorithm modelled: the kernel's when the model has it (RING → ring, TREE → double_binary_tree,
-- NVLS → nvls), else the op's default (ring; pairwise for all-to-all; p2p for send); a fit's own
-- prediction uses the algorithm its α, β were derived through (so that it reproduces the fitted line).
-- A preset reference (verdict_basis 'preset': no user link, no fit of this machine) is NCCL's own
-- cost model rather than the preset's α–β line: the fastest algorithm × protocol NCCL 2.20 would
-- run for the instance's op, size, k and node count on the machine its device implies
-- (tracekit.analyses._nccl_udfs, tracekit.model.nccl_tuning), named in nccl_algo; its latency
-- is the α term, size / its algbw the β term, latency × algbw the crossover. Node count: the
-- group's recorded hosts, 1 for a one-host group; unknown hosts across nodes keep the preset line.
-- NICs per node: --nics-per-node (tk_nics_per_node), else the group's own log (group_machine
-- nics_per_node, from NCCL INFO NET lines), else one per GPU.
-- verdict: 'skew-bound' when the longest wait before the instance (skew) exceeds its sync time;
-- else 'latency-bound' when the reference's α term >= its β term, i.e. size < crossover_bytes D*,
-- 'bandwidth-bound' otherwise; NULL without a reference (no_model_reason says why). An instance
-- recorded by fewer ranks than its group (a trace of rank 0 of 8) is not judged, and gets no
-- efficiency: its "sync time" still holds the wait for the ranks not recorded (nccl-tests rows,
-- already per-size averages over the whole communicator, are judged); and NULL when the
-- instance has no sync time (collective_instances: a conflict, or clocks that disagree; a CPU-side
-- call of an asynchronous backend, no_model_reason 'async call: no transfer time in this trace').
-- Mismatched instances (collective_instances.mismatched) have no row.
--
-- run_id              VARCHAR  run
-- pg_name             VARCHAR  process group name
-- seq                 BIGINT   per-group sequence number
-- op                  VARCHAR  canonical op
-- size_bytes          BIGINT   nccl-tests S, bytes
-- group_size          INTEGER  k
-- locality            VARCHAR  intra_node / inter_node / mixed / unknown: the group's class (collective_reference)
-- model_algo          VARCHAR  algorithm the link prediction assumes
-- sync_time_ns        DOUBLE   measured transfer time after the last arrival, ns
-- skew_ns             BIGINT   longest wait of any rank for the last one, ns
-- reference           VARCHAR  the verdict's reference in words (collective_reference.reference)
-- ref_note            VARCHAR  fallbacks and assumptions made in choosing it
-- no_model_reason     VARCHAR  why there is no verdict: no reference, not judged (incomplete) or no sync
--                               time (collective_instances); NULL when there is a verdict
-- ref_alpha_s         DOUBLE   reference α, s per step
-- ref_beta_Bps        DOUBLE   reference β, bytes/s per direction
-- ref_alpha_term_ns   DOUBLE   A·α under the reference = the collective's fixed latency, ns
-- ref_beta_term_ns    DOUBLE   B·D/β under the reference, ns
-- predicted_ns        DOUBLE   reference prediction, ns
-- crossover_bytes     DOUBLE   D* = A·α·β/B under the reference: the latency/bandwidth boundary of
--                               this op, algorithm and k (n½ = α·β is the link's, not this)
-- fit_alpha_s         DOUBLE   its own group's ok fit: α, s (NULL without one)
-- fit_beta_Bps        DOUBLE   its β, bytes/s per direction
-- fit_alpha_term_ns   DOUBLE   A·α, ns
-- fit_beta_term_ns    DOUBLE   B·D/β, ns
-- fit_predicted_ns    DOUBLE   α term + β term, ns
-- link                VARCHAR  the hardware link (user's or preset), or NULL
-- link_alpha_term_ns  DOUBLE   A·α of the link, ns
-- link_beta_term_ns   DOUBLE   B·D/β of the link (β = nominal × 0.8), ns
-- link_predicted_ns   DOUBLE   link prediction, ns
-- link_crossover_bytes DOUBLE  D* under the link, bytes
-- verdict             VARCHAR  skew-bound / latency-bound / bandwidth-bound, NULL without a reference
-- verdict_basis       VARCHAR  kind of reference: link (--link) / user (α/β) / sweep / nccl_tests /
--                               preset / own_fit; NULL without one
-- efficiency          DOUBLE   predicted / sync_time under the reference (1 = as the model says; < 1 slower)
-- efficiency_link     DOUBLE   link_predicted / sync_time: against the hardware link
-- best_algo           VARCHAR  fastest model algorithm for this op, size and k under the reference's α, β
--                               (in-switch nvls considered only against an nvlink4/nvlink5 link: NVLS
--                               needs third-generation NVSwitch, H100 and later)
-- best_predicted_ns   DOUBLE   its predicted time, ns
-- nccl_algo           VARCHAR  NCCL's algorithm/protocol the reference assumed (e.g. 'tree/LL'), NULL
--                               unless the reference is NCCL's model (a preset reference)
-- win                 INTEGER  profiler window (collective_instances.win): (run_id, pg_name, win, seq) is the key
CREATE OR REPLACE VIEW collective_verdicts AS
-- The model UDFs whose arguments are the instance's (op, algorithm, k) run once per distinct tuple
-- (a few per run) and are joined back on it (IS NOT DISTINCT FROM: a NULL argument is a key too),
-- not once per instance: the same function on the same arguments, so the same values.
WITH ma AS MATERIALIZED (
    SELECT op, algo, group_size, tk_model_algo(op, algo, group_size) AS model_algo
    FROM (SELECT DISTINCT op, algo, group_size FROM collective_instances)
),
i AS (
    SELECT i.*, m.model_algo, (i.complete OR r.source = 'nccl_tests') AS judged, r.device_name AS run_device,
           -- a busbw above the device's fastest link (collective_bandwidth.over_cap) that no algorithm can
           -- reach: the span cannot be the transfer, so nothing is judged on it. An in-switch reduction (NVLS,
           -- CollNet/SHARP) sends each byte over a rank's link once each way, so its algbw stays under the
           -- link rate and its busbw (algbw × 2(k−1)/k, nccl-tests' PERFORMANCE.md) under 2 × the link: over
           -- 2 × cap is impossible whatever the algorithm; over the cap, impossible when the kernel names an
           -- algorithm that is not in-switch (RING, TREE...). Unknown algorithm under 2 × cap: judged.
           coalesce(b.over_cap AND (b.busbw_gbps > 2 * b.cap_gbps
                                    OR (i.algo IS NOT NULL AND NOT (upper(i.algo) LIKE 'NVLS%'
                                                                    OR upper(i.algo) LIKE 'COLLNET%'))), false)
               AS impossible,
           b.busbw_gbps AS over_busbw_gbps, b.cap_gbps AS over_cap_gbps
    FROM collective_instances i LEFT JOIN runs r USING (run_id)
    LEFT JOIN collective_bandwidth b ON b.run_id = i.run_id AND b.pg_name = i.pg_name AND b.win = i.win
                                     AND b.seq = i.seq
    -- mismatched instances (ranks' calls disagree) are listed by the view `mismatched_instances`, never judged
    LEFT JOIN ma m ON m.op IS NOT DISTINCT FROM i.op AND m.algo IS NOT DISTINCT FROM i.algo
                  AND m.group_size IS NOT DISTINCT FROM i.group_size
    WHERE NOT i.mismatched
),
f AS (
    SELECT run_id, pg_name, op, group_size, algo AS fit_algo, alpha_s, beta_Bps FROM alpha_beta_fit
    WHERE status = 'ok' AND scope = 'group'
),
j AS MATERIALIZED (
    SELECT i.run_id, i.pg_name, i.win, i.seq, i.op, i.size_bytes, i.group_size, i.model_algo,
           i.sync_time_ns, i.skew_ns, i.judged, i.ranks_seen, i.async_cpu,
           i.impossible, i.over_busbw_gbps, i.over_cap_gbps,
           r.locality, r.reference, r.ref_note, r.no_model_reason, r.ref_kind, r.ref_alpha_s, r.ref_beta_Bps,
           coalesce(r.ref_algo, i.model_algo) AS ref_algo,
           f.alpha_s AS fit_alpha_s, f.beta_Bps AS fit_beta_Bps, f.fit_algo,
           r.link, r.link_alpha_s, r.link_beta_Bps, i.run_device,
           CASE WHEN coalesce(r.hosts, '') <> '' THEN len(string_split(r.hosts, ','))::INTEGER
                WHEN r.locality NOT IN ('inter_node', 'mixed') THEN 1 END::INTEGER AS ref_nodes,
           -- NICs per node: the user's (tk_nics_per_node), else the group's own log (NCCL INFO NET lines)
           coalesce(TRY_CAST(getvariable('tk_nics_per_node') AS INTEGER), gm.nics_per_node) AS ref_nics
    FROM i
    LEFT JOIN f ON f.run_id = i.run_id AND f.pg_name = i.pg_name AND f.op = i.op AND f.group_size = i.group_size
    LEFT JOIN collective_reference r
           ON r.run_id = i.run_id AND r.pg_name = i.pg_name AND r.op = i.op AND r.group_size = i.group_size
    LEFT JOIN group_machine gm ON gm.run_id = i.run_id AND gm.pg_name = i.pg_name
),
-- NCCL's pick for preset references, once per distinct (op, size, k, nodes, device)
nm AS MATERIALIZED (
    SELECT op, size_bytes, group_size, ref_nodes, run_device, ref_nics,
           tk_nccl_algo(op, size_bytes, group_size, ref_nodes, run_device, ref_nics) AS nccl_algo,
           tk_nccl_latency(op, size_bytes, group_size, ref_nodes, run_device, ref_nics) AS nccl_latency_s,
           tk_nccl_beta_term(op, size_bytes, group_size, ref_nodes, run_device, ref_nics) AS nccl_beta_term_s,
           tk_nccl_crossover(op, size_bytes, group_size, ref_nodes, run_device, ref_nics) AS nccl_crossover_bytes
    FROM (SELECT DISTINCT op, size_bytes, group_size, ref_nodes, run_device, ref_nics FROM j WHERE ref_kind = 'preset')
),
-- (A, B) of T = A·α + B·D/β per distinct (op, algorithm, k): the fit's, the link's (model_algo) and
-- the reference's algorithm
co AS MATERIALIZED (
    SELECT op, algo, group_size, tk_alpha_coeff(op, algo, group_size) AS a, tk_beta_coeff(op, algo, group_size) AS b
    FROM (SELECT op, fit_algo AS algo, group_size FROM j UNION SELECT op, model_algo, group_size FROM j
          UNION SELECT op, ref_algo, group_size FROM j)
),
t AS (
    SELECT j.* EXCLUDE (fit_algo),
           -- the fit's α, β are defined through its own algorithm's coefficients: predict with those
           cf.a * j.fit_alpha_s * 1e9 AS fit_alpha_term_ns,
           cf.b * j.size_bytes / j.fit_beta_Bps * 1e9 AS fit_beta_term_ns,
           cl.a * j.link_alpha_s * 1e9 AS link_alpha_term_ns,
           cl.b * j.size_bytes / j.link_beta_Bps * 1e9 AS link_beta_term_ns,
           cl.a * j.link_alpha_s * j.link_beta_Bps / cl.b AS link_crossover_bytes,
           cr.a AS ref_a, cr.b AS ref_b, nm.nccl_algo, nm.nccl_latency_s, nm.nccl_beta_term_s, nm.nccl_crossover_bytes
    FROM j
    LEFT JOIN nm ON j.ref_kind = 'preset' AND nm.op IS NOT DISTINCT FROM j.op
                AND nm.size_bytes IS NOT DISTINCT FROM j.size_bytes AND nm.group_size IS NOT DISTINCT FROM j.group_size
                AND nm.ref_nodes IS NOT DISTINCT FROM j.ref_nodes AND nm.run_device IS NOT DISTINCT FROM j.run_device
                AND nm.ref_nics IS NOT DISTINCT FROM j.ref_nics
    LEFT JOIN co cf ON cf.op IS NOT DISTINCT FROM j.op AND cf.algo IS NOT DISTINCT FROM j.fit_algo
                   AND cf.group_size IS NOT DISTINCT FROM j.group_size
    LEFT JOIN co cl ON cl.op IS NOT DISTINCT FROM j.op AND cl.algo IS NOT DISTINCT FROM j.model_algo
                   AND cl.group_size IS NOT DISTINCT FROM j.group_size
    LEFT JOIN co cr ON cr.op IS NOT DISTINCT FROM j.op AND cr.algo IS NOT DISTINCT FROM j.ref_algo
                   AND cr.group_size IS NOT DISTINCT FROM j.group_size
),
p AS (
    SELECT * EXCLUDE (ref_a, ref_b, nccl_latency_s, nccl_beta_term_s, nccl_crossover_bytes),
           CASE WHEN nccl_algo IS NOT NULL THEN nccl_latency_s * 1e9 ELSE ref_a * ref_alpha_s * 1e9 END
               AS ref_alpha_term_ns,
           CASE WHEN nccl_algo IS NOT NULL THEN nccl_beta_term_s * 1e9 ELSE ref_b * size_bytes / ref_beta_Bps * 1e9 END
               AS ref_beta_term_ns,
           CASE WHEN nccl_algo IS NOT NULL THEN nccl_crossover_bytes ELSE ref_a * ref_alpha_s * ref_beta_Bps / ref_b END
               AS crossover_bytes,
           fit_alpha_term_ns + fit_beta_term_ns AS fit_predicted_ns,
           link_alpha_term_ns + link_beta_term_ns AS link_predicted_ns
    FROM t
),
q AS MATERIALIZED (
    SELECT *, ref_alpha_term_ns + ref_beta_term_ns AS predicted_ns,
           CASE WHEN judged AND NOT impossible AND ref_alpha_term_ns IS NOT NULL AND ref_beta_term_ns IS NOT NULL
                THEN ref_kind END
               AS verdict_basis
    FROM p
),
-- the best algorithm once per distinct (op, size, k, α, β, in-switch) and joined back; α and β keyed
-- by their text (DuckDB's shortest round-trip form: one text per double, and -0.0 is not 0.0). A
-- NULL key matches nothing, and leaves NULL, as the UDFs answer for a NULL argument.
bq AS (
    SELECT *, ref_alpha_s::VARCHAR AS a_key, ref_beta_Bps::VARCHAR AS b_key,
           coalesce(link IN ('nvlink4', 'nvlink5') AND verdict_basis IN ('link', 'preset'), false) AS in_switch
    FROM q
),
best AS MATERIALIZED (
    SELECT op, size_bytes, group_size, a_key, b_key, in_switch,
           tk_best_algo(op, size_bytes, group_size, a, b, in_switch) AS best_algo,
           tk_best_time(op, size_bytes, group_size, a, b, in_switch) AS best_time_s
    FROM (SELECT op, size_bytes, group_size, a_key, b_key, in_switch, any_value(ref_alpha_s) AS a,
                 any_value(ref_beta_Bps) AS b
          FROM bq GROUP BY op, size_bytes, group_size, a_key, b_key, in_switch)
)
SELECT run_id, pg_name, seq, op, size_bytes, group_size, locality, model_algo, sync_time_ns, skew_ns,
       reference, ref_note,
       CASE WHEN async_cpu THEN 'async call: no transfer time in this trace'
            WHEN group_size IS NULL THEN 'group size unknown (no metadata, tensor shapes or world size in the trace)'
            WHEN judged AND sync_time_ns IS NULL THEN
                 'no sync time: the ranks'' clocks disagree by more than the transfer, or conflicting spans'
            WHEN impossible THEN 'busbw ' || round(over_busbw_gbps, 1) || ' GB/s is above the device''s fastest link ('
                 || round(over_cap_gbps, 1) || ' GB/s): the span cannot be the transfer (a wrong size or group size, '
                 || 'or clocks); not judged'
            WHEN verdict_basis IS NOT NULL THEN NULL
            WHEN NOT judged THEN 'incomplete: ' || ranks_seen || ' of ' || group_size
                 || ' ranks recorded, its sync time still holds the wait for the others'
            WHEN no_model_reason IS NOT NULL THEN no_model_reason
            WHEN size_bytes IS NULL THEN 'size unknown (no collective metadata for this call)'
            ELSE 'the model has no prediction for ' || op || ' of this size' END
           AS no_model_reason,
       ref_alpha_s, ref_beta_Bps, ref_alpha_term_ns, ref_beta_term_ns, predicted_ns, crossover_bytes,
       fit_alpha_s, fit_beta_Bps, fit_alpha_term_ns, fit_beta_term_ns, fit_predicted_ns,
       link, link_alpha_term_ns, link_beta_term_ns, link_predicted_ns, link_crossover_bytes,
       CASE
         WHEN NOT judged THEN NULL
         WHEN sync_time_ns IS NULL THEN NULL  -- no measured transfer time (a conflict): no verdict
         WHEN impossible THEN NULL            -- above the physical cap: the span is not the transfer
         WHEN skew_ns > sync_time_ns THEN 'skew-bound'
         WHEN verdict_basis IS NOT NULL THEN tk_verdict(ref_alpha_term_ns, ref_beta_term_ns)
       END AS verdict,
       verdict_basis,
       CASE WHEN judged AND NOT impossible AND sync_time_ns > 0 THEN predicted_ns / sync_time_ns END AS efficiency,
       CASE WHEN judged AND NOT impossible AND sync_time_ns > 0 THEN link_predicted_ns / sync_time_ns END
           AS efficiency_link,
       best.best_algo, best.best_time_s * 1e9 AS best_predicted_ns, nccl_algo, win
FROM bq
LEFT JOIN best USING (op, size_bytes, group_size, a_key, b_key, in_switch);
