"""group_machine — Python analysis: the machine each process group / benchmark run ran on.

Reads: runs, ranks, collectives

One row per (run, process group) of ``collectives``: its hosts, how its ranks sit on them, the GPU
and the network, and its locality class. Where the facts come from, first that holds:

- a benchmark run of an nccl-tests log: the run config's ``groups[i].machine``, which the ingest
  wrote from the log's "Using devices" rank lines (``#  Rank 0 Group 0 Pid 123 on HOST device 0
  [...] NVIDIA H100 80GB HBM3``: each rank's host and GPU) and, when NCCL_DEBUG=INFO was set, its
  ``NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ...`` / ``NET/OFI`` lines (the NICs NCCL uses per host)
  — :func:`tracekit.ingest.nccl_tests.machine_facts`;
- a trace: the group's ranks (``collectives.pg_ranks``, global ranks) and each rank's host
  (``ranks.host``: Kineto's ``host_name`` / ``hostname``, Nsight's target); a group rank whose trace
  was not ingested, or whose trace names no host, has an unknown host. GPU: ``runs.device_name``.

locality, first rule that holds:
  intra_node  every rank of the group has a known host and it is the same one
  inter_node  two or more known hosts, at most one known rank on each: the group's traffic is all on
              the network
  mixed       two or more known hosts, some with several ranks: NVLink (or PCIe/xGMI) inside a node
              and the network between nodes
  unknown     otherwise; ``locality_reason`` says why (no host named, only one host known...)

group_machine: one row per (run, process group).

run_id             VARCHAR  run
pg_name            VARCHAR  process group (nccl-tests: one benchmark run)
group_size         INTEGER  k, ranks in the group
hosts              VARCHAR  distinct known hosts of the group's ranks, sorted, comma-separated ('' none)
nodes              INTEGER  number of distinct known hosts (NULL when no host is known: not 0 nodes)
hosts_unknown      INTEGER  group ranks whose host is unknown
ranks_per_host     INTEGER  ranks on each host when every known host holds the same number, else NULL
max_ranks_per_host INTEGER  most ranks on one known host (NULL: no host known)
gpu                VARCHAR  GPU model (device name) when the group's ranks name one, else NULL
nics_per_node      INTEGER  network devices NCCL uses per host (NCCL INFO NET lines), NULL when not logged
nic                VARCHAR  their transport and names (``IB mlx5_0,mlx5_3``), NULL when not logged
locality           VARCHAR  intra_node / inter_node / mixed / unknown (rules above)
locality_reason    VARCHAR  why the class is unknown (NULL otherwise)
source             VARCHAR  where the hosts come from, in words (NULL when nothing names them)
"""

from __future__ import annotations

import json

import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("pg_name", pa.string()), ("group_size", pa.int32()), ("hosts", pa.string()),
        ("nodes", pa.int32()), ("hosts_unknown", pa.int32()), ("ranks_per_host", pa.int32()),
        ("max_ranks_per_host", pa.int32()), ("gpu", pa.string()), ("nics_per_node", pa.int32()),
        ("nic", pa.string()), ("locality", pa.string()), ("locality_reason", pa.string()), ("source", pa.string()),
    ]
)

TRACE_SOURCE = "trace host names (ranks.host)"


def classify(per_host: dict[str, int], unknown: int) -> tuple[str, str | None]:
    """(locality, reason) of a group from ``per_host`` (known host → ranks of the group on it) and
    ``unknown`` (ranks whose host is unknown); the rules of the module docstring."""
    if len(per_host) >= 2:
        return ("inter_node" if max(per_host.values()) == 1 else "mixed"), None
    if len(per_host) == 1 and unknown == 0:
        return "intra_node", None
    if not per_host:
        return "unknown", "no input names the host of any of its ranks"
    return "unknown", f"one host known, {unknown} rank(s) with no host recorded"


def _bench_rows(con) -> list[dict]:
    rows = []
    for rid, config, device in con.execute(
            "SELECT run_id, config, device_name FROM runs WHERE source = 'nccl_tests' ORDER BY run_id").fetchall():
        try:
            groups = json.loads(config or "{}").get("groups") or []
        except (ValueError, AttributeError):
            groups = []
        for g in groups:
            if not isinstance(g, dict) or not g.get("pg_name"):
                continue
            m = g.get("machine")
            if not isinstance(m, dict):  # a store written before the ingest recorded the machine
                hosts = sorted(set(g.get("hosts") or []))
                m = dict(hosts=hosts, locality="unknown",
                         locality_reason="the store holds no per-rank hosts for this run (re-ingest it)")
            hosts = m.get("hosts") or []
            rows.append(dict(
                run_id=rid, pg_name=g["pg_name"], group_size=g.get("group_size"), hosts=",".join(hosts),
                nodes=len(hosts) or None, hosts_unknown=0 if hosts else g.get("group_size"),
                ranks_per_host=m.get("ranks_per_host"), max_ranks_per_host=m.get("max_ranks_per_host"),
                gpu=m.get("gpu") or device, nics_per_node=m.get("nics_per_node"), nic=m.get("nic"),
                locality=m.get("locality") or "unknown", locality_reason=m.get("locality_reason"),
                source=m.get("source"),
            ))
    return rows


def _trace_rows(con) -> list[dict]:
    # a group's ranks: its pg_ranks list (one per group in practice; the most common when not), each
    # rank's host from ranks; counted once per distinct (run, list)
    got = con.execute(
        """
        WITH g AS (
            SELECT c.run_id, c.pg_name, max(c.group_size) AS k, mode(c.pg_ranks) AS pg_ranks
            FROM collectives c JOIN runs r USING (run_id)
            WHERE r.source <> 'nccl_tests' GROUP BY c.run_id, c.pg_name
        ),
        m AS (SELECT run_id, pg_name, unnest(pg_ranks) AS rk FROM g WHERE pg_ranks IS NOT NULL)
        SELECT g.run_id, g.pg_name, g.k, g.pg_ranks IS NULL AS no_list, any_value(r.device_name) AS device,
               list(nullif(k.host, '')) FILTER (WHERE m.rk IS NOT NULL) AS hosts
        FROM g JOIN runs r USING (run_id)
        LEFT JOIN m USING (run_id, pg_name)
        LEFT JOIN ranks k ON k.run_id = m.run_id AND k.rank = m.rk
        GROUP BY ALL ORDER BY ALL
        """
    ).fetchall()
    rows = []
    for rid, pg, k, no_list, device, hosts in got:
        per_host: dict[str, int] = {}
        unknown = 0
        for h in hosts or []:
            if h is None:
                unknown += 1
            else:
                per_host[h] = per_host.get(h, 0) + 1
        if no_list:
            locality, reason, unknown = "unknown", "the group's ranks (pg_ranks) are not recorded", k
        else:
            locality, reason = classify(per_host, unknown)
        counts = set(per_host.values())
        rows.append(dict(
            run_id=rid, pg_name=pg, group_size=k, hosts=",".join(sorted(per_host)), nodes=len(per_host) or None,
            hosts_unknown=unknown, ranks_per_host=counts.pop() if len(counts) == 1 else None,
            max_ranks_per_host=max(per_host.values(), default=None), gpu=device, locality=locality,
            locality_reason=reason, source=TRACE_SOURCE if per_host else None,
        ))
    return rows


def create(con) -> None:
    """Create the table ``group_machine`` on ``con`` (columns in the module docstring)."""
    from tracekit.analyses import create_table_from_rows

    create_table_from_rows(con, "group_machine", SCHEMA, _bench_rows(con) + _trace_rows(con))
