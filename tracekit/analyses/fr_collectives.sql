-- fr_collectives: what a run's Flight Recorder dumps say of its collectives (fr_entries), per
-- process group, op and input bytes. The dumps hold the last TORCH_FR_BUFFER_SIZE entries of each
-- rank: the counts cover that window, not the whole job. Point-to-point entries (is_p2p) and entries
-- without a collective seq (collective_seq_id 0) are left out.
-- Reads: fr_entries (and names "ranks", a column, as the base view is named)
--
-- run_id              VARCHAR  run
-- pg_name             VARCHAR  process group name
-- op                  VARCHAR  canonical op
-- in_bytes            BIGINT   Σ numel × dtype bytes of one call's inputs, bytes (NULL: a dtype unknown)
-- calls               BIGINT   entries over ranks
-- ranks               BIGINT   distinct ranks
-- instances           BIGINT   distinct collective_seq_id
-- bytes               BIGINT   Σ in_bytes over the calls, bytes
-- timed               BIGINT   calls with a recorded duration
-- median_duration_ns  DOUBLE   median recorded duration over them, ns (NULL when none: gloo records none; NCCL
--                              only with TORCH_NCCL_ENABLE_TIMING)
-- first_seq           BIGINT   smallest collective_seq_id
-- last_seq            BIGINT   largest collective_seq_id
CREATE OR REPLACE VIEW fr_collectives AS
SELECT run_id, pg_name, op, in_bytes, count(*) AS calls, count(DISTINCT rank) AS ranks,
       count(DISTINCT collective_seq_id) AS instances, sum(in_bytes)::BIGINT AS bytes,
       count(duration_ns) AS timed, median(duration_ns)::DOUBLE AS median_duration_ns,
       min(collective_seq_id) AS first_seq, max(collective_seq_id) AS last_seq
FROM fr_entries WHERE collective_seq_id > 0 AND NOT coalesce(is_p2p, false)
GROUP BY run_id, pg_name, op, in_bytes;
