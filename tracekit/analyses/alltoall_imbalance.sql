-- alltoall_imbalance: how unevenly each all-to-all(v) call spreads its bytes over the ranks (EP
-- dispatch/combine), the rank × peer byte matrix, and what the imbalance cost.
-- Reads: collectives, collective_instances, __instance_calls
--
-- Bytes: collectives.in_splits / out_splits are in ELEMENTS (tracekit.ingest.collectives); the
-- bytes per element of a call on a rank are size_bytes / sum(in_splits) (for all_to_all the
-- nccl-tests S is the send buffer, i.e. the input elements × the dtype's size). Entry j of a rank's
-- in_splits goes to the group's j-th rank (pg_ranks[j]); entry j of out_splits comes from it. A
-- call with even splits (empty lists) sends S / group_size to every peer. Calls whose splits were
-- truncated by the profiler (approx) or whose group ranks are unknown are left out. An instance is
-- (pg_name, win, seq), as the matching keys it (instance_rows.sql: profiler windows concatenated in
-- one file restart seq); each call's win comes from __instance_calls.
--
-- alltoall_matrix: one row per all-to-all instance and (sender, receiver) pair, own chunk included.
--
-- run_id      VARCHAR  run
-- pg_name     VARCHAR  process group
-- win         INTEGER  profiler window (collective_instances.win)
-- seq         BIGINT   instance sequence number in the group
-- src         INTEGER  global rank that sends
-- dst         INTEGER  global rank that receives
-- bytes       BIGINT   bytes src sends to dst, from src's in_splits
-- recv_bytes  BIGINT   bytes dst says it receives from src (its out_splits); NULL when dst's row is missing
CREATE OR REPLACE VIEW _a2a_rows AS
SELECT c.run_id, c.rank, c.pg_name, k.win, c.seq, c.pg_ranks, c.group_size, c.size_bytes, c.in_splits, c.out_splits,
       CASE WHEN len(c.in_splits) > 0 AND list_sum(c.in_splits) > 0 THEN c.size_bytes / list_sum(c.in_splits) END AS elem_bytes
FROM collectives c
JOIN __instance_calls k ON k.run_id = c.run_id AND k.rank = c.rank AND k.event_id = c.event_id
WHERE c.op = 'all_to_all' AND NOT coalesce(c.approx, false) AND c.pg_ranks IS NOT NULL AND len(c.pg_ranks) = c.group_size
  AND c.group_size > 0 AND c.size_bytes IS NOT NULL;

CREATE OR REPLACE VIEW _a2a_cells AS
SELECT run_id, pg_name, win, seq, rank::INTEGER AS me, pg_ranks[j + 1]::INTEGER AS peer,
       CASE WHEN len(in_splits) = 0 THEN size_bytes // group_size ELSE (in_splits[j + 1] * elem_bytes)::BIGINT END AS sent,
       CASE WHEN len(out_splits) = 0 THEN size_bytes // group_size
            WHEN elem_bytes IS NOT NULL THEN (out_splits[j + 1] * elem_bytes)::BIGINT END AS received
FROM (SELECT *, unnest(range(group_size)) AS j FROM _a2a_rows)
WHERE len(in_splits) = 0 OR (len(in_splits) = group_size AND (len(out_splits) = 0 OR len(out_splits) = group_size));

CREATE OR REPLACE VIEW alltoall_matrix AS
SELECT s.run_id, s.pg_name, s.win, s.seq, s.me AS src, s.peer AS dst, s.sent AS bytes, r.received AS recv_bytes
FROM _a2a_cells s
LEFT JOIN _a2a_cells r ON r.run_id = s.run_id AND r.pg_name = s.pg_name AND r.win = s.win AND r.seq = s.seq
                      AND r.me = s.peer
                      AND r.peer = s.me;

-- alltoall_matrix_total: the matrix summed over the run's all-to-all instances.
--
-- run_id      VARCHAR  run
-- src         INTEGER  global rank that sends
-- dst         INTEGER  global rank that receives
-- calls       BIGINT   instances with this pair
-- bytes       BIGINT   bytes sent src → dst over the run
CREATE OR REPLACE VIEW alltoall_matrix_total AS
SELECT run_id, src, dst, count(*) AS calls, sum(bytes)::BIGINT AS bytes
FROM alltoall_matrix GROUP BY run_id, src, dst;

-- alltoall_imbalance: one row per all-to-all instance with splits.
--
-- run_id              VARCHAR  run
-- pg_name             VARCHAR  process group
-- win                 INTEGER  profiler window (collective_instances.win)
-- seq                 BIGINT   instance sequence number
-- group_size          INTEGER  ranks in the group
-- ranks_seen          BIGINT   ranks with a row in alltoall_matrix as sender
-- total_bytes         BIGINT   all bytes of the call, every pair (own chunks included)
-- send_max_bytes      BIGINT   the most any rank sends, bytes
-- send_mean_bytes     DOUBLE   total_bytes / ranks_seen, bytes
-- send_imbalance      DOUBLE   send_max_bytes / send_mean_bytes (1 = even); NULL when the mean is 0
-- recv_max_bytes      BIGINT   the most any rank receives (column sums of the matrix), bytes
-- recv_mean_bytes     DOUBLE   mean over receivers, bytes
-- recv_imbalance      DOUBLE   recv_max_bytes / recv_mean_bytes; NULL when the mean is 0
-- heaviest_sender     INTEGER  rank that sends the most (lowest rank on ties)
-- heaviest_receiver   INTEGER  rank that receives the most (lowest rank on ties)
-- sync_time_ns        DOUBLE   collective_instances.sync_time_ns: median over ranks of end − last arrival, ns
-- slowest_rank        INTEGER  rank whose call ends last
-- slowest_excess_ns   BIGINT   the slowest rank's excess: its end − the median end over the ranks, ns
-- imbalance_cost_ns   DOUBLE   sync_time_ns × (1 − 1 / max(send_imbalance, recv_imbalance)): the part of
--                              the transfer a balanced call would not need if the time scales with the
--                              heaviest rank's bytes (bandwidth-bound, alpha-beta.md's β term), ns
CREATE OR REPLACE VIEW alltoall_imbalance AS
WITH sends AS (
    SELECT run_id, pg_name, win, seq, src AS r, sum(bytes) AS b FROM alltoall_matrix GROUP BY ALL
),
recvs AS (
    SELECT run_id, pg_name, win, seq, dst AS r, sum(bytes) AS b FROM alltoall_matrix GROUP BY ALL
),
s AS (
    SELECT run_id, pg_name, win, seq, count(*) AS ranks_seen, sum(b)::BIGINT AS total_bytes, max(b)::BIGINT AS send_max_bytes,
           avg(b) AS send_mean_bytes, first(r ORDER BY b DESC, r) AS heaviest_sender
    FROM sends GROUP BY ALL
),
v AS (
    SELECT run_id, pg_name, win, seq, max(b)::BIGINT AS recv_max_bytes, avg(b) AS recv_mean_bytes,
           first(r ORDER BY b DESC, r) AS heaviest_receiver
    FROM recvs GROUP BY ALL
),
ends AS (
    SELECT run_id, pg_name, win, seq, first(rank ORDER BY ts_ns + dur_ns DESC, rank)::INTEGER AS slowest_rank,
           (max(ts_ns + dur_ns) - quantile_disc(ts_ns + dur_ns, 0.5))::BIGINT AS slowest_excess_ns
    FROM __instance_calls WHERE op = 'all_to_all' GROUP BY ALL
)
SELECT s.run_id, s.pg_name, s.win, s.seq, i.group_size, s.ranks_seen, s.total_bytes,
       s.send_max_bytes, s.send_mean_bytes,
       CASE WHEN s.send_mean_bytes > 0 THEN s.send_max_bytes / s.send_mean_bytes END AS send_imbalance,
       v.recv_max_bytes, v.recv_mean_bytes,
       CASE WHEN v.recv_mean_bytes > 0 THEN v.recv_max_bytes / v.recv_mean_bytes END AS recv_imbalance,
       s.heaviest_sender::INTEGER AS heaviest_sender, v.heaviest_receiver::INTEGER AS heaviest_receiver,
       i.sync_time_ns, e.slowest_rank, e.slowest_excess_ns,
       CASE WHEN s.send_mean_bytes > 0 AND v.recv_mean_bytes > 0
            THEN i.sync_time_ns * (1 - 1 / greatest(s.send_max_bytes / s.send_mean_bytes,
                                                    v.recv_max_bytes / v.recv_mean_bytes)) END AS imbalance_cost_ns
FROM s JOIN v USING (run_id, pg_name, win, seq)
LEFT JOIN collective_instances i USING (run_id, pg_name, win, seq)
LEFT JOIN ends e USING (run_id, pg_name, win, seq);
