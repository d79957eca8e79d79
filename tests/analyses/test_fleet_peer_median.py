"""group_plateau's peer median (tracekit.analyses.fleet._peer_median) equals its definition: the
statistics.median of every other group's plateau of the same key, in r's run or a run sharing a host."""

from __future__ import annotations

import random
from collections import defaultdict
from statistics import median

from tracekit.analyses.fleet import _peer_median


def _by_definition(r, peers, run_hosts):
    others = [o["plateau_busbw_gbps"] for o in peers if o is not r and (
        o["run_id"] == r["run_id"] or run_hosts[o["run_id"]] & run_hosts[r["run_id"]])]
    return len(others), (float(median(others)) if others else None)


def test_by_hand():
    rows = [dict(run_id="a", locality="intra_node", plateau_busbw_gbps=v) for v in (10.0, 20.0, 30.0, 20.0)]
    hosts = {"a": {"h0"}}
    pool: dict = {}
    # others of the first (10): 20, 30, 20 → 20; of the third (30): 10, 20, 20 → 20; of the second: 10, 30, 20 → 20
    assert [_peer_median(r, rows, hosts, pool, "k") for r in rows] == [(3, 20.0), (3, 20.0), (3, 20.0), (3, 20.0)]
    two = rows[:2]
    assert _peer_median(two[0], two, hosts, {}, "k") == (1, 20.0)
    one = rows[:1]
    assert _peer_median(one[0], one, hosts, {}, "k") == (0, None)
    even = [dict(run_id="a", locality="x", plateau_busbw_gbps=v) for v in (1.0, 2.0, 4.0)]
    assert _peer_median(even[0], even, hosts, {}, "k") == (2, 3.0)  # (2 + 4) / 2


def test_against_the_definition_on_random_fleets():
    rnd = random.Random(7)
    for trial in range(200):
        runs = [f"r{i}" for i in range(rnd.randint(1, 4))]
        hosts = {rid: {f"h{rnd.randint(0, 5)}" for _ in range(rnd.randint(1, 2))} for rid in runs}
        rows = [dict(run_id=rnd.choice(runs), locality=rnd.choice(["intra_node", "unknown"]),
                     plateau_busbw_gbps=rnd.choice([1.0, 2.5, 2.5, 7.0, rnd.uniform(0, 100)]))
                for _ in range(rnd.randint(1, 12))]
        if trial % 20 == 0:
            rows[0]["plateau_busbw_gbps"] = float("nan")
        peers = defaultdict(list)
        for r in rows:
            if r["locality"] != "unknown":
                peers["k"].append(r)
        pool: dict = {}
        for r in rows:
            got = _peer_median(r, peers.get("k", []) if r["locality"] != "unknown" else [], hosts, pool,
                               "k" if r["locality"] != "unknown" else "u")
            want = _by_definition(r, peers.get("k", []) if r["locality"] != "unknown" else [], hosts)
            assert got[0] == want[0]
            assert got[1] == want[1] or (got[1] != got[1] and want[1] != want[1]), (trial, r, got, want)
