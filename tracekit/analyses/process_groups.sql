-- process_groups: one row per (run, process group): which parallel dimension it is, its ranks,
-- and what it carried (calls, instances, bytes, sync time, overlap with compute).
-- Reads: runs, collectives, collective_instances, collective_overlap
--
-- Where a group's dimension comes from, in order:
--   1. the run config's "process_groups" list ({"pg_name", "desc", "ranks"}, written by the
--      collectors that name their groups, torch.distributed.new_group(..., group_desc=...)):
--      the description, when it is one of tp / pp / dp / ep / cp;
--   2. the run config's "parallel_layout" ({"order": "tp-dp-pp", "tp": T, "dp": D, "pp": P}:
--      the dimensions fastest first, global rank = Σ index_i · stride_i, stride_i = Π sizes
--      before i, Megatron-LM's convention): a group whose sorted ranks are an arithmetic
--      progression of one dimension's size and stride, inside one block of stride × size ranks,
--      is that dimension; a send/recv pair
--      (pg_name 'p2p:a->b') whose ranks differ by one dimension's stride, inside one group
--      of it, is that dimension;
--   3. else 'other' (the world group, groups of a run without a layout).
--
-- _pg_layout: per run, each layout dimension: run_id, dim VARCHAR, size INTEGER, stride BIGINT.
-- _pg_desc:   per run, the config's named groups: run_id, pg_name VARCHAR, description VARCHAR.
--
-- process_groups:
-- run_id              VARCHAR   run
-- pg_name             VARCHAR   process group name as the store has it ('p2p:a->b' for a send/recv pair)
-- description         VARCHAR   the group's description from the run config; NULL when it has none
-- dimension           VARCHAR   tp / pp / dp / ep / cp / other (see above)
-- group_size          INTEGER   ranks in the group (max over its calls)
-- ranks               INTEGER[] the group's global ranks, sorted (as the collectives rows record them)
-- ops                 VARCHAR   the ops it ran, alphabetical, comma-separated
-- calls               BIGINT    collectives rows: one per rank per call
-- instances           BIGINT    matched instances (collective_instances rows of the group; mismatched
--                               instances left out, as in every count)
-- incomplete          BIGINT    instances that are NOT collective_instances.complete (the one definition)
-- bytes               BIGINT    Σ size_bytes over instances (nccl-tests S), bytes
-- sync_time_ns        DOUBLE    Σ sync_time_ns over instances, ns; NULL for a nccl-tests log (its rows are
--                               per-size averages of a benchmark, not time the job spent)
-- median_sync_time_ns DOUBLE    median sync_time_ns over instances, ns, when the group ran one op in one
--                               size bucket (tk_size_bucket); NULL otherwise (a median across ops and
--                               sizes describes no call): see process_group_sizes
-- comm_ns             BIGINT    Σ dur_ns of the group's calls over ranks, ns
-- overlap_ns          BIGINT    Σ over those calls of the part covered by compute (collective_overlap), ns
-- overlap_fraction    DOUBLE    overlap_ns / comm_ns; NULL when comm_ns = 0
CREATE OR REPLACE VIEW _pg_layout AS
WITH dims AS (
    SELECT run_id, config,
           unnest(string_split(json_extract_string(config, '$.parallel_layout.order'), '-')) AS dim,
           unnest(generate_series(1, len(string_split(json_extract_string(config, '$.parallel_layout.order'), '-')))) AS i
    FROM runs
    WHERE json_valid(config) AND json_extract_string(config, '$.parallel_layout.order') IS NOT NULL
),
sized AS (
    SELECT run_id, dim, i, TRY_CAST(json_extract_string(config, '$.parallel_layout.' || dim) AS INTEGER) AS size
    FROM dims
)
SELECT run_id, dim, size,
       coalesce(round(exp(sum(ln(size)) OVER (PARTITION BY run_id ORDER BY i
                                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))), 1)::BIGINT AS stride
FROM sized
WHERE size IS NOT NULL AND size >= 1;

CREATE OR REPLACE VIEW _pg_desc AS
WITH g AS (
    SELECT run_id, unnest(json_extract(config, '$.process_groups[*]')) AS j
    FROM runs
    WHERE json_valid(config) AND json_type(config, '$.process_groups') = 'ARRAY'
)
SELECT run_id, j ->> 'pg_name' AS pg_name, any_value(j ->> 'desc') AS description
FROM g WHERE j ->> 'pg_name' IS NOT NULL
GROUP BY ALL;

CREATE OR REPLACE VIEW process_groups AS
WITH calls AS (
    SELECT run_id, pg_name,
           max(group_size)::INTEGER AS group_size,
           list_sort(any_value(pg_ranks)) AS ranks,
           string_agg(DISTINCT op, ',' ORDER BY op) AS ops,
           count(*) AS calls,
           sum(dur_ns)::BIGINT AS comm_ns
    FROM collectives
    WHERE pg_name IS NOT NULL
    GROUP BY run_id, pg_name
),
inst AS (
    SELECT i.run_id, i.pg_name, count(*) AS instances, count(*) FILTER (WHERE NOT i.complete) AS incomplete,
           sum(i.size_bytes)::BIGINT AS bytes, sum(i.sync_time_ns) AS sync_time_ns,
           -- one median only where it describes one kind of call: a single op in a single size bucket
           CASE WHEN count(DISTINCT (i.op, tk_size_bucket(i.size_bytes))) = 1 THEN median(i.sync_time_ns) END
               AS median_sync_time_ns
    FROM collective_instances i
    WHERE NOT i.mismatched
    GROUP BY i.run_id, i.pg_name
),
ov AS (
    SELECT c.run_id, c.pg_name, sum(o.overlap_ns)::BIGINT AS overlap_ns
    FROM collectives c JOIN collective_overlap o USING (run_id, rank, event_id)
    WHERE c.pg_name IS NOT NULL
    GROUP BY c.run_id, c.pg_name
),
shape AS (
    -- the group's ranks as a progression: size n, stride (0 for one rank), whether evenly spaced
    SELECT run_id, pg_name, len(ranks) AS n,
           CASE WHEN len(ranks) > 1 THEN ranks[2] - ranks[1] ELSE 0 END AS stride,
           len(ranks) = len(list_distinct(ranks))
             AND (len(ranks) < 2 OR ranks[len(ranks)] - ranks[1] = (ranks[2] - ranks[1]) * (len(ranks) - 1)) AS even,
           ranks
    FROM calls WHERE ranks IS NOT NULL
),
inferred AS (
    SELECT s.run_id, s.pg_name, min(l.dim) AS dim
    FROM shape s JOIN _pg_layout l ON l.run_id = s.run_id AND l.size > 1
    WHERE s.even AND s.n > 1 AND s.stride = l.stride
          -- inside one group of the dimension (its groups are blocks of stride × size ranks) ...
          AND s.ranks[1] // (l.stride * l.size) = s.ranks[s.n] // (l.stride * l.size)
          -- ... and all of it, or a send/recv pair of neighbours along it
          AND (s.n = l.size OR (s.pg_name LIKE 'p2p:%' AND s.n = 2))
    GROUP BY s.run_id, s.pg_name
    HAVING count(*) = 1
)
SELECT c.run_id, c.pg_name, d.description,
       CASE WHEN d.description IN ('tp', 'pp', 'dp', 'ep', 'cp') THEN d.description
            ELSE coalesce(i.dim, 'other') END AS dimension,
       c.group_size, c.ranks, c.ops, c.calls,
       coalesce(n.instances, 0) AS instances, coalesce(n.incomplete, 0) AS incomplete,
       n.bytes, CASE WHEN NOT coalesce(rr.source = 'nccl_tests', false) THEN n.sync_time_ns END AS sync_time_ns,
       n.median_sync_time_ns,
       c.comm_ns, coalesce(o.overlap_ns, 0)::BIGINT AS overlap_ns,
       CASE WHEN c.comm_ns > 0 THEN coalesce(o.overlap_ns, 0) / c.comm_ns END AS overlap_fraction
FROM calls c
LEFT JOIN _pg_desc d USING (run_id, pg_name)
LEFT JOIN inferred i USING (run_id, pg_name)
LEFT JOIN inst n USING (run_id, pg_name)
LEFT JOIN ov o USING (run_id, pg_name)
LEFT JOIN runs rr ON rr.run_id = c.run_id;


-- process_group_sizes: per run, process group, op and power-of-two size bucket (tk_size_bucket), the
-- statistics of the group's instances (mismatched ones left out): a group's numbers per kind of call.
--
-- run_id              VARCHAR  run
-- pg_name             VARCHAR  process group name
-- op                  VARCHAR  canonical op
-- bucket_bytes        BIGINT   size bucket: sizes in [bucket_bytes, 2·bucket_bytes), bytes (NULL: size unknown)
-- instances           BIGINT   instances
-- incomplete          BIGINT   instances that are NOT collective_instances.complete
-- median_sync_time_ns DOUBLE   median sync_time_ns over the bucket's instances, ns (NULL: none has one)
CREATE OR REPLACE VIEW process_group_sizes AS
SELECT run_id, pg_name, op, tk_size_bucket(size_bytes) AS bucket_bytes, count(*) AS instances,
       count(*) FILTER (WHERE NOT complete) AS incomplete, median(sync_time_ns)::DOUBLE AS median_sync_time_ns
FROM collective_instances WHERE NOT mismatched
GROUP BY run_id, pg_name, op, tk_size_bucket(size_bytes);
