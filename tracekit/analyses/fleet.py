"""group_plateau, fleet_pairs and fleet_nodes — Python analysis: degraded links and the fleet view.

Reads: collective_bandwidth, group_machine, collective_reference

A degraded link is found the way an operator looks for one: each group's large-message bus
bandwidth — the sizes where its own busbw curve has flattened — against (a) its peers, the other
groups of the same op, rank count, locality class, ranks per host, node count and GPU model in the
same run or in another connected run sharing a host with it (a fleet: every node pair of a cluster
acceptance sweep), and (b) the machine model (the group's link from collective_reference).

The plateau of a group: the per-size median busbw (collective_bandwidth: S / sync time × the
nccl-tests bus factor, GB/s with GB = 1e9), sizes ascending; the plateau sizes are the largest
sizes from which every busbw stays >= ``PLATEAU_WITHIN`` × the curve's peak (the curve has stopped
rising), and the plateau busbw is the median busbw over them. Not a fixed multiple of D*: point-to-
point and all-to-all reach their plateau later than the α–β line's crossover suggests.

A group is judged only where its plateau lies in the model's bandwidth regime (every plateau size
>= ``MODEL_CROSSOVERS`` × the model's D*; any plateau when there is no model): below that, busbw
measures latency and launch jitter, not the link. It is degraded when (a) it has >= ``MIN_PEERS``
peers and its plateau is below ``PEER_FRACTION`` × the median of their plateaus (basis ``peers``), or (b) its plateau is below
``MODEL_FRACTION`` × the model's busbw (the link's effective β: for the ring-type algorithms the
model uses, busbw at large sizes → β; basis ``model``; not against ``NO_MODEL_CHECK_LINKS``), or
(c) it is a point-to-point group over more than two hosts and its plateau is below
``PEER_FRACTION`` × the median plateau of its node pairs (basis ``pairs``): the two-host send groups
of the same ranks per host, locality and GPU on two of its own hosts. In nccl-tests' sendrecv (rank
r sends to r + 1 and receives from r − 1, ranks placed host by host) every host carries one send to
the next host and one receive from the previous one at any host count >= 2, so on a non-blocking
fabric the busbw of all hosts at once equals that of each pair alone: a shortfall is the fabric
under the whole group's traffic (routing, oversubscription), not one link. Bases join with commas
(``peers,model``) when several hold.

group_plateau: one row per (run, process group, op, k) with busbw (a group that runs several ops has
one curve per op: busbw factors and models differ by op).

run_id              VARCHAR  run
pg_name             VARCHAR  process group (nccl-tests: one benchmark run)
op                  VARCHAR  canonical op (send for send/recv)
group_size          INTEGER  k
locality            VARCHAR  intra_node / inter_node / mixed / unknown (group_machine)
nodes               INTEGER  distinct known hosts
ranks_per_host      INTEGER  ranks on each host (NULL: uneven or unknown)
hosts               VARCHAR  the hosts, sorted, comma-separated ('' unknown)
gpu                 VARCHAR  GPU model
sizes               INTEGER  distinct sizes with a busbw
peak_busbw_gbps     DOUBLE   best per-size median busbw, GB/s
plateau_min_bytes   BIGINT   smallest plateau size, bytes
plateau_max_bytes   BIGINT   largest plateau size, bytes
plateau_sizes       INTEGER  sizes in the plateau
plateau_busbw_gbps  DOUBLE   median busbw over the plateau sizes, GB/s
peers               INTEGER  peer groups (same op, k, locality, ranks per host, nodes, GPU; same run or one
                             sharing a host; itself excluded)
peer_busbw_gbps     DOUBLE   median plateau busbw of the peers, GB/s (NULL: no peers)
peer_ratio          DOUBLE   plateau / peer median (NULL: fewer than MIN_PEERS peers)
pair_peers          INTEGER  its node pairs (send groups over > 2 hosts only, rule (c); else NULL)
pair_busbw_gbps     DOUBLE   median plateau busbw of those pairs, GB/s (NULL: none)
pair_ratio          DOUBLE   plateau / pair median (NULL: no pairs)
model               VARCHAR  the machine model's link (collective_reference.link), NULL when none
model_busbw_gbps    DOUBLE   its effective β, GB/s
model_ratio         DOUBLE   plateau / model busbw
model_crossover_bytes DOUBLE the model's D* = A·α·β/B for the op on k ranks (default algorithm), bytes
degraded            BOOLEAN  true when flagged (rules above)
degraded_basis      VARCHAR  peers / model / pairs, comma-joined when several (NULL when not degraded)

fleet_pairs: one row per node pair (groups on exactly two hosts), op and ranks per host.

run_id              VARCHAR  run
op                  VARCHAR  canonical op
ranks_per_host      INTEGER  ranks on each of the two hosts
host_a              VARCHAR  first host (sorted)
host_b              VARCHAR  second host
groups              INTEGER  groups (benchmark runs) of this pair
plateau_busbw_gbps  DOUBLE   median plateau busbw of those groups, GB/s
fleet_busbw_gbps    DOUBLE   median plateau busbw over every pair of this op and ranks per host, GB/s
ratio               DOUBLE   plateau / fleet median
slow                BOOLEAN  a group of the pair is degraded against its peers

fleet_nodes: one row per host of fleet_pairs, op and ranks per host.

run_id              VARCHAR  run
op                  VARCHAR  canonical op
ranks_per_host      INTEGER  ranks per host
host                VARCHAR  the node
pairs               INTEGER  pairs it is in
slow_pairs          INTEGER  of them slow
suspect             BOOLEAN  slow_pairs >= SUSPECT_SLOW_PAIRS: the node common to several slow pairs
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median

import pyarrow as pa

from tracekit.model.fit import PLATEAU_WITHIN  # noqa: E402 - the plateau's one definition (0.9 of the peak)

MIN_PEERS = 1
"""Peers needed to judge a group against them. One suffices: of two groups only the slower can fall
below PEER_FRACTION (< 1) of the other."""

PEER_FRACTION = 0.7
"""Degraded against peers: plateau below this fraction of the peers' median plateau. Identical healthy
nodes of one fleet agree to far better than 30 % at large sizes; a link running at a lower rate or
width, or traffic on a slower path, costs 2× or more."""

MODEL_CROSSOVERS = 4
"""Both checks look only at a plateau whose sizes are all >= this many of the model's crossovers D*
(where its β term is >= 80 % of its time): below, busbw measures latency, not the link."""

MODEL_FRACTION = 0.25
"""Degraded against the model: plateau below this fraction of the model's busbw. Loose on purpose:
the model's multi-node link is a preset (one NIC per GPU assumed when the NICs are not logged), not
NCCL's algorithm choice on this machine, so only a shortfall of 4× or more is beyond its error."""

NO_MODEL_CHECK_LINKS = ("loopback_gloo",)
"""Presets with no data sheet behind them: no degraded verdict against the model."""

SUSPECT_SLOW_PAIRS = 2
"""A node in at least this many slow pairs (of one op and ranks per host) is named as their common node."""

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("pg_name", pa.string()), ("op", pa.string()), ("group_size", pa.int32()),
        ("locality", pa.string()), ("nodes", pa.int32()), ("ranks_per_host", pa.int32()), ("hosts", pa.string()),
        ("gpu", pa.string()), ("sizes", pa.int32()), ("peak_busbw_gbps", pa.float64()),
        ("plateau_min_bytes", pa.int64()), ("plateau_max_bytes", pa.int64()), ("plateau_sizes", pa.int32()),
        ("plateau_busbw_gbps", pa.float64()), ("peers", pa.int32()), ("peer_busbw_gbps", pa.float64()),
        ("peer_ratio", pa.float64()), ("pair_peers", pa.int32()), ("pair_busbw_gbps", pa.float64()),
        ("pair_ratio", pa.float64()), ("model", pa.string()), ("model_busbw_gbps", pa.float64()),
        ("model_ratio", pa.float64()), ("model_crossover_bytes", pa.float64()), ("degraded", pa.bool_()),
        ("degraded_basis", pa.string()),
    ]
)

PAIRS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("op", pa.string()), ("ranks_per_host", pa.int32()), ("host_a", pa.string()),
        ("host_b", pa.string()), ("groups", pa.int32()), ("plateau_busbw_gbps", pa.float64()),
        ("fleet_busbw_gbps", pa.float64()), ("ratio", pa.float64()), ("slow", pa.bool_()),
    ]
)

NODES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("op", pa.string()), ("ranks_per_host", pa.int32()), ("host", pa.string()),
        ("pairs", pa.int32()), ("slow_pairs", pa.int32()), ("suspect", pa.bool_()),
    ]
)


def plateau(curve: list[tuple[int, float]]) -> tuple[float, int, int, int, float] | None:
    """(plateau busbw, its smallest size, its largest size, sizes in it, peak busbw) of a busbw curve
    ``curve`` ((size bytes, busbw GB/s) per size, any order); None when empty. The plateau is the
    run of largest sizes whose busbw all stay >= PLATEAU_WITHIN × the peak; its busbw their median."""
    pts = sorted((s, b) for s, b in curve if b is not None)
    if not pts:
        return None
    peak = max(b for _, b in pts)
    i = len(pts)
    while i > 0 and pts[i - 1][1] >= PLATEAU_WITHIN * peak:
        i -= 1
    top = pts[i:] or pts[-1:]
    return float(median(b for _, b in top)), top[0][0], top[-1][0], len(top), peak


def _crossover(op: str, k, alpha, beta) -> float | None:
    """The model's D* = A·α·β/B for ``op`` on ``k`` ranks under its default algorithm
    (tracekit.model.algorithm_coefficients), bytes; None where the model has no answer."""
    from tracekit.model import ALGORITHMS, algorithm_coefficients

    algos = ALGORITHMS.get(op)
    if not algos or alpha is None or not beta or not k:
        return None
    try:
        c = algorithm_coefficients(op, algos[0], int(k))
    except Exception:  # noqa: BLE001 - a group size the algorithm cannot run on: no crossover
        return None
    return c.alpha_coeff * alpha * beta / c.beta_coeff if c.beta_coeff else None


def _peer_median(r: dict, peers: list[dict], run_hosts: dict, pool: dict, k) -> tuple[int, float | None]:
    """(how many peers, the median of their plateau busbw, GB/s; None without peers) of group row
    ``r`` among ``peers`` (the rows of its key ``k``): every other row of r's run, and of each run
    sharing a host with it. The median is ``statistics.median`` of that list, taken from the sorted
    plateaus of the runs r sees (cached in ``pool`` per key and run) with r's own plateau left out
    once: a sort per (key, run) instead of one per row. A NaN plateau (no order): the list itself."""
    import bisect

    rid = r["run_id"]
    got = pool.get((k, rid))
    if got is None:
        vals = [o["plateau_busbw_gbps"] for o in peers if o["run_id"] == rid or run_hosts[o["run_id"]] & run_hosts[rid]]
        got = pool[(k, rid)] = (any(v != v for v in vals), sorted(vals))
    nan, vals = got
    x = r["plateau_busbw_gbps"]
    mine = r["locality"] != "unknown"  # peers holds every row of its key but those of unknown locality
    if nan:
        others = [o["plateau_busbw_gbps"] for o in peers if o is not r and (
            o["run_id"] == rid or run_hosts[o["run_id"]] & run_hosts[rid])]
        return len(others), float(median(others)) if others else None
    skip = bisect.bisect_left(vals, x) if mine else len(vals)  # r's own entry, left out once
    n = len(vals) - (1 if mine else 0)
    if not n:
        return 0, None
    at = lambda i: vals[i] if i < skip else vals[i + 1]  # noqa: E731 - the i-th of the others, sorted
    if n % 2:
        return n, float(at(n // 2))
    return n, float((at(n // 2 - 1) + at(n // 2)) / 2)


def group_rows(con) -> list[dict]:
    """The rows of group_plateau (module docstring)."""
    curves: dict = defaultdict(list)
    # one curve per group, op (send for send/recv) and k: a group that runs several ops (all_reduce and
    # broadcast on one communicator) has one busbw curve per op, each with its own model
    for rid, pg, op, k, size, bw in con.execute(
        """SELECT run_id, pg_name, CASE WHEN op = 'recv' THEN 'send' ELSE op END AS op1, group_size, size_bytes,
                  median(busbw_gbps)
           FROM collective_bandwidth WHERE busbw_gbps IS NOT NULL AND size_bytes > 0
           GROUP BY run_id, pg_name, op1, group_size, size_bytes"""
    ).fetchall():
        curves[(rid, pg, op, k)].append((op, k, size, bw))
    shape = {(r[0], r[1]): r[2:] for r in con.execute(
        "SELECT run_id, pg_name, locality, nodes, ranks_per_host, hosts, gpu FROM group_machine").fetchall()}
    model = {(r[0], r[1]): r[2:] for r in con.execute(
        "SELECT run_id, pg_name, any_value(link), any_value(link_beta_Bps), any_value(link_alpha_s) "
        "FROM collective_reference GROUP BY ALL").fetchall()}
    rows = []
    for (rid, pg, op, _), pts in sorted(curves.items(), key=lambda kv: (*kv[0][:3], -1 if kv[0][3] is None else kv[0][3])):
        p = plateau([(s, b) for _, _, s, b in pts])
        loc, nodes, rph, hosts, gpu = shape.get((rid, pg), ("unknown", 0, None, "", None))
        link, beta, alpha = model.get((rid, pg), (None, None, None))
        row = dict(run_id=rid, pg_name=pg, op=op, group_size=pts[0][1], locality=loc, nodes=nodes,
                   ranks_per_host=rph, hosts=hosts, gpu=gpu, sizes=len(pts), peak_busbw_gbps=p[4],
                   plateau_busbw_gbps=p[0], plateau_min_bytes=p[1], plateau_max_bytes=p[2], plateau_sizes=p[3],
                   model=link, model_busbw_gbps=beta / 1e9 if beta else None,
                   model_crossover_bytes=_crossover(op, pts[0][1], alpha, beta))
        if row["model_busbw_gbps"]:
            row["model_ratio"] = row["plateau_busbw_gbps"] / row["model_busbw_gbps"]
        rows.append(row)
    peers: dict = defaultdict(list)
    key = lambda r: (r["op"], r["group_size"], r["locality"], r["ranks_per_host"], r["nodes"], r["gpu"])  # noqa: E731
    for r in rows:
        if r["locality"] != "unknown":
            peers[key(r)].append(r)
    run_hosts: dict = defaultdict(set)
    for r in rows:
        run_hosts[r["run_id"]].update(h for h in (r["hosts"] or "").split(",") if h)
    pool: dict = {}  # (key, run) → the sorted plateaus of the groups of that key in the runs it sees
    for r in rows:
        # peers: this run's groups, and another run's only where the two runs share a host (one fleet)
        n_others, peer_median = _peer_median(r, peers.get(key(r), []), run_hosts, pool, key(r))
        r["peers"] = n_others
        basis = []
        # judged only on a plateau in the model's bandwidth regime (all its sizes >= MODEL_CROSSOVERS·D*;
        # any plateau when the model has no D*): below, busbw measures latency and launch jitter
        bandwidth = (r["model_crossover_bytes"] is None
                     or r["plateau_min_bytes"] >= MODEL_CROSSOVERS * r["model_crossover_bytes"])
        if n_others:
            r["peer_busbw_gbps"] = peer_median
            if n_others >= MIN_PEERS and r["peer_busbw_gbps"] > 0:
                r["peer_ratio"] = r["plateau_busbw_gbps"] / r["peer_busbw_gbps"]
                if r["peer_ratio"] < PEER_FRACTION and bandwidth:
                    basis.append("peers")
        if (r.get("model_ratio") is not None and r["model"] not in NO_MODEL_CHECK_LINKS
                and r["model_crossover_bytes"] is not None and bandwidth and r["model_ratio"] < MODEL_FRACTION):
            basis.append("model")
        pairs = _node_pairs(r, rows)
        if pairs:
            r["pair_peers"] = len(pairs)
            r["pair_busbw_gbps"] = float(median(pairs))
            if r["pair_busbw_gbps"] > 0:
                r["pair_ratio"] = r["plateau_busbw_gbps"] / r["pair_busbw_gbps"]
                if r["pair_ratio"] < PEER_FRACTION and bandwidth:
                    basis.append("pairs")
        r["degraded"] = bool(basis)
        r["degraded_basis"] = ",".join(basis) or None
    return rows


def _node_pairs(r: dict, rows: list[dict]) -> list[float]:
    """Plateau busbw (GB/s) of the node pairs of group ``r`` (rule (c) of the module docstring): for a
    send group over more than two known hosts, the two-host send groups of the same locality, ranks
    per host and GPU whose two hosts are both among ``r``'s; [] for any other group."""
    if r["op"] != "send" or not r["nodes"] or r["nodes"] <= 2 or not r["ranks_per_host"] or not r["hosts"]:
        return []
    hosts = set(r["hosts"].split(","))
    return [o["plateau_busbw_gbps"] for o in rows
            if o["op"] == "send" and o["nodes"] == 2 and o["locality"] == r["locality"]
            and o["ranks_per_host"] == r["ranks_per_host"] and o["gpu"] == r["gpu"]
            and o["hosts"] and set(o["hosts"].split(",")) <= hosts]


def pair_rows(groups: list[dict]) -> tuple[list[dict], list[dict]]:
    """(fleet_pairs rows, fleet_nodes rows) from group_plateau rows (module docstring)."""
    pairs: dict = defaultdict(list)
    for g in groups:
        if g["nodes"] == 2 and g["hosts"] and g["ranks_per_host"]:
            a, b = sorted(g["hosts"].split(","))
            pairs[(g["run_id"], g["op"], g["ranks_per_host"], a, b)].append(g)
    fleet: dict = defaultdict(list)
    out = []
    for (rid, op, rph, a, b), gs in sorted(pairs.items()):
        bw = float(median(g["plateau_busbw_gbps"] for g in gs))
        fleet[(rid, op, rph)].append(bw)
        out.append(dict(run_id=rid, op=op, ranks_per_host=rph, host_a=a, host_b=b, groups=len(gs),
                        plateau_busbw_gbps=bw, slow=any(g["degraded"] and "peers" in (g["degraded_basis"] or "")
                                                        for g in gs)))
    nodes: dict = defaultdict(lambda: [0, 0])
    for p in out:
        m = float(median(fleet[(p["run_id"], p["op"], p["ranks_per_host"])]))
        p["fleet_busbw_gbps"] = m
        p["ratio"] = p["plateau_busbw_gbps"] / m if m > 0 else None
        for h in (p["host_a"], p["host_b"]):
            n = nodes[(p["run_id"], p["op"], p["ranks_per_host"], h)]
            n[0] += 1
            n[1] += int(p["slow"])
    node_rows = [dict(run_id=rid, op=op, ranks_per_host=rph, host=h, pairs=n[0], slow_pairs=n[1],
                      suspect=n[1] >= SUSPECT_SLOW_PAIRS)
                 for (rid, op, rph, h), n in sorted(nodes.items())]
    return out, node_rows


def create(con) -> None:
    """Create the tables ``group_plateau``, ``fleet_pairs`` and ``fleet_nodes`` on ``con``."""
    from tracekit.analyses import create_table_from_rows

    groups = group_rows(con)
    pairs, nodes = pair_rows(groups)
    create_table_from_rows(con, "group_plateau", SCHEMA, groups)
    create_table_from_rows(con, "fleet_pairs", PAIRS_SCHEMA, pairs)
    create_table_from_rows(con, "fleet_nodes", NODES_SCHEMA, nodes)
