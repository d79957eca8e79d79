-- machine_summary: the machines a run's groups ran on, one row per distinct description: what the
-- report's "machine:" lines say (group_machine rolled up).
-- Reads: group_machine
--
-- run_id           VARCHAR    run
-- gpu              VARCHAR    GPU model (group_machine.gpu), NULL when unnamed
-- nodes            INTEGER    distinct known hosts of each group (NULL: none known)
-- ranks_per_host   INTEGER    ranks on each host (NULL: uneven or unknown)
-- nics_per_node    INTEGER    NICs NCCL uses per host (NCCL INFO NET lines), NULL when not logged
-- nic              VARCHAR    their transport and names, NULL when not logged
-- locality         VARCHAR    intra_node / inter_node / mixed / unknown
-- locality_reason  VARCHAR    why the class is unknown (NULL otherwise)
-- source           VARCHAR    where the hosts come from, in words (NULL when nothing names them)
-- groups           BIGINT     process groups with this description
-- hosts            VARCHAR[]  the distinct hosts over those groups, sorted
CREATE OR REPLACE VIEW machine_summary AS
SELECT run_id, gpu, nodes, ranks_per_host, nics_per_node, nic, locality, locality_reason, source,
       count(*) AS groups,
       list_sort(list_distinct(list_filter(flatten(list(string_split(coalesce(hosts, ''), ','))), lambda h: h <> '')))
           AS hosts
FROM group_machine
GROUP BY run_id, gpu, nodes, ranks_per_host, nics_per_node, nic, locality, locality_reason, source;
