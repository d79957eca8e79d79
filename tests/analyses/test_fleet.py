"""Degraded links and the fleet view (tracekit/analyses/fleet.py) on the shared H100 acceptance sweep
(../shared/traces/nccltests_h100_fleet: 10 nodes, every pair): the healthy fleet raises no degraded
warning, every group has a locality class and a reference from its own machine; a pair's log with
its times × 3 is named the slow pair, and three such pairs sharing a node name that node."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.conftest import shared_trace
from tracekit import analyses
from tracekit.analyses.fleet import PLATEAU_WITHIN, pair_rows, plateau
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.store import Store

_ROW = re.compile(r"^\s*\d+\s+\d+\s+\S+")


def _slowed_copy(src, dst, factor=3.0):
    """``src`` written to ``dst`` with every result row's times × factor and algbw/busbw ÷ factor."""
    out = []
    for line in src.read_text().splitlines():
        if _ROW.match(line) and not line.lstrip().startswith("#"):
            tok = line.split()
            for i in (5, 9):  # time, then algbw, busbw of each half (size count type redop root time algbw busbw #wrong)
                tok[i] = f"{float(tok[i]) * factor:.1f}"
                tok[i + 1] = f"{float(tok[i + 1]) / factor:.2f}"
                tok[i + 2] = f"{float(tok[i + 2]) / factor:.2f}"
            line = "  ".join(tok)
        out.append(line)
    dst.write_text("\n".join(out) + "\n")
    return dst


def _pair_logs(g=8):
    folder = shared_trace("nccltests_h100_fleet/pairwise")
    return sorted(folder.glob(f"nccl_N2_G{g}_*.log"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The whole sweep (180 pairwise + 4 multi-node logs) as one run."""
    root = shared_trace("nccltests_h100_fleet")
    store = Store(tmp_path_factory.mktemp("fleet"))
    ingest_paths([root / "pairwise", root / "multi_node"], store, run_id="fleet")
    con = analyses.connect(store)
    yield store, con
    con.close()


def test_every_group_has_a_class_and_a_machine_reference(fleet):
    _, con = fleet
    rows = con.execute("SELECT pg_name, locality, nodes, ranks_per_host, gpu, source FROM group_machine").fetchall()
    assert len(rows) == 180 * 2 + 4 * 5  # two benchmark runs per pair log, five per multi-node log
    assert {r[1] for r in rows} == {"inter_node", "mixed"}  # 1 GPU per node: inter-node; 2–8: mixed
    assert {(r[2], r[3]) for r in rows if r[1] == "inter_node"} == {(2, 1), (10, 1)}
    assert {r[4] for r in rows} == {"NVIDIA H100 80GB HBM3"} and {r[5] for r in rows} == {"nccl-tests 'Using devices'"}
    refs = con.execute("SELECT pg_name, locality, ref_kind, reference, ref_note, no_model_reason "
                       "FROM collective_reference").fetchall()
    assert refs and all(r[1] in ("inter_node", "mixed") and r[2] is not None and r[5] is None for r in refs)
    # a fit serves only groups of its class and ranks per host: the 10-node groups without an ok fit
    # of their own (k = 10, 20) take the machine model's preset, never the k = 40/80 fits
    fits = {(r[0], r[1]) for r in con.execute(
        "SELECT pg_name, group_size FROM alpha_beta_fit WHERE status = 'ok' AND scope = 'group'").fetchall()}
    for pg, loc, kind, ref, note, _ in refs:
        if kind == "nccl_tests":
            assert "own fit" in note or "another of its groups" in note
        else:
            assert kind == "preset" and "no ok" in note and "fit of the same class" in note
    assert not any(k in (10, 20) for _, k in fits if k)  # (why those fell back)


def _sendrecv_plateau(path):
    """Independent of tracekit's parser and SQL: the sendrecv run's busbw per size (size / time, the
    median of the out-of-place and in-place times), and the median over the largest sizes within
    90 % of the peak."""
    txt = path.read_text().split("sendrecv_perf", 1)[1].split("concluded", 1)[0]
    pts = {}
    for line in txt.splitlines():
        t = line.split()
        if len(t) >= 12 and t[0].isdigit():
            pts[int(t[0])] = float(np.median([int(t[0]) / float(t[5]) / 1e3, int(t[0]) / float(t[9]) / 1e3]))
    sizes, peak = sorted(pts), max(pts.values())
    i = len(sizes)
    while i > 0 and pts[sizes[i - 1]] >= 0.9 * peak:
        i -= 1
    return float(np.median([pts[s] for s in sizes[i:]]))


def test_healthy_fleet_raises_no_degraded_warning(fleet):
    store, con = fleet
    # no node pair and no 10-node collective is flagged; only the 10-node sendrecv runs (next test)
    assert con.execute("SELECT count(*) FROM group_plateau WHERE degraded AND NOT (op = 'send' AND nodes = 10)"
                       ).fetchone()[0] == 0
    # identical nodes agree: every pair within 10 % of its peers' median (so far from the 70 % bound)
    lo, hi = con.execute("SELECT min(peer_ratio), max(peer_ratio) FROM group_plateau").fetchone()
    assert 0.9 < lo <= hi < 1.15
    rep = build_report(store, "fleet", con=con)
    assert {d["op"] for d in rep["degraded_links"]} == {"send"}
    assert not [w for w in rep["warnings"] if "link degraded" in w]
    assert rep["fleet"]["slow_pairs"] == [] and rep["fleet"]["suspect_nodes"] == []
    assert len(rep["fleet"]["pairs"]) == 45 * 4 * 2  # 45 pairs × 4 GPUs-per-node × 2 ops
    assert any(line.startswith("machine: 2 node(s) × 8 rank(s) of NVIDIA H100 80GB HBM3") and
               "source: nccl-tests 'Using devices'" in line
               for line in __import__("tracekit.report.data", fromlist=["machine_lines"]).machine_lines(rep))


def test_sendrecv_over_ten_nodes_is_flagged_against_its_node_pairs(fleet):
    # nccl-tests' sendrecv loads each host with one send and one receive at any host count, so the ten
    # hosts at once should reach what each pair reaches alone; on this fleet they reach 35-63 % of it
    store, con = fleet
    root = shared_trace("nccltests_h100_fleet")
    rows = con.execute("SELECT ranks_per_host, plateau_busbw_gbps, pair_peers, pair_busbw_gbps, pair_ratio, "
                       "degraded_basis FROM group_plateau WHERE op = 'send' AND nodes = 10 ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == [1, 2, 4, 8]
    for g, plat, n, pair_bw, ratio, basis in rows:
        want = _sendrecv_plateau(root / "multi_node" / f"nccl_N10_G{g}.log")
        pairs = float(np.median([_sendrecv_plateau(p) for p in _pair_logs(g)]))
        assert plat == pytest.approx(want, rel=1e-9) and pair_bw == pytest.approx(pairs, rel=1e-9)
        assert n == 45 and ratio == pytest.approx(want / pairs, rel=1e-9) and basis == "pairs"
    assert [round(r[4], 3) for r in rows] == [0.628, 0.632, 0.630, 0.354]
    # pair groups, other ops and the 10-node collectives get no node-pair comparison
    assert con.execute("SELECT count(*) FROM group_plateau WHERE pair_peers IS NOT NULL").fetchone()[0] == 4
    rep = build_report(store, "fleet", con=con)
    w = [x for x in rep["warnings"] if "node pairs" in x]
    assert len(w) == 4 and all("fabric under the whole group's traffic" in x for x in w)
    assert any(x.startswith("send on 80 ranks (mixed): large-message busbw 15.23 GB/s") and "35% of the median of "
               "its 45 node pairs' 43.05 GB/s" in x for x in w)
    from tracekit.report.glance import glance_summary
    rec = glance_summary(con, rep)["recommendation"]
    assert rec["kind"] == "degraded" and rec["text"].startswith(
        "send on 80 ranks over 10 host(s) reaches 35% of its node pairs' 43.0 GB/s")


def test_node_pairs_only_for_send_over_more_than_two_hosts():
    from tracekit.analyses.fleet import _node_pairs

    def g(op="send", nodes=3, rph=1, hosts="a,b,c", loc="inter_node", bw=10.0, gpu="H100"):
        return dict(op=op, nodes=nodes, ranks_per_host=rph, hosts=hosts, locality=loc, plateau_busbw_gbps=bw,
                    gpu=gpu)
    big = g()
    rows = [big, g(nodes=2, hosts="a,b", bw=40.0), g(nodes=2, hosts="b,c", bw=30.0),
            g(nodes=2, hosts="a,d", bw=1.0),  # a host outside the group
            g(nodes=2, hosts="a,c", rph=2, bw=2.0, loc="mixed"),  # other ranks per host and class
            g(nodes=2, hosts="a,c", gpu="A100", bw=3.0),  # other GPU
            g(op="all_to_all", nodes=2, hosts="a,c", bw=4.0)]  # other op
    assert sorted(_node_pairs(big, rows)) == [30.0, 40.0]
    assert _node_pairs(rows[1], rows) == []  # a pair has no node pairs
    assert _node_pairs(g(op="all_to_all"), rows) == []  # the rule is sendrecv's load (one send, one receive per host)


def _fleet_with(tmp_path, slow: list[str]):
    """The G8 pair logs, those whose name contains one of ``slow`` replaced by a copy with times × 3."""
    logs = []
    for f in _pair_logs(8):
        if any(s in f.name for s in slow):
            logs.append(_slowed_copy(f, tmp_path / f.name))
        else:
            logs.append(f)
    store = Store(tmp_path / "s")
    ingest_paths(logs, store, run_id="g8")
    return store


def test_a_pair_three_times_slower_is_named(tmp_path):
    store = _fleet_with(tmp_path, ["cnode3-004_cnode3-007"])
    rep = build_report(store, "g8")
    slow = {(p["host_a"], p["host_b"], p["op"]) for p in rep["fleet"]["slow_pairs"]}
    assert slow == {("cnode3-004", "cnode3-007", "all_to_all"), ("cnode3-004", "cnode3-007", "send")}
    assert rep["fleet"]["suspect_nodes"] == []  # one slow pair: either node could be the cause
    p = next(p for p in rep["fleet"]["slow_pairs"] if p["op"] == "all_to_all")
    assert p["ratio"] == pytest.approx(1 / 3, rel=0.03)  # ÷ 3 against the other 44 pairs' median
    warn = [w for w in rep["warnings"] if "degraded" in w]
    assert len(warn) == 2 and all("cnode3-004,cnode3-007" in w and "peers' median" in w for w in warn)


def test_three_slow_pairs_sharing_a_node_name_it(tmp_path):
    store = _fleet_with(tmp_path, ["cnode3-002_cnode3-005", "cnode3-005_cnode3-009", "cnode3-005_cnode3-011"])
    rep = build_report(store, "g8")
    assert {(n["host"], n["op"], n["slow_pairs"], n["pairs"]) for n in rep["fleet"]["suspect_nodes"]} == {
        ("cnode3-005", "all_to_all", 3, 9), ("cnode3-005", "send", 3, 9)}
    assert len(rep["fleet"]["slow_pairs"]) == 6
    # the 3 groups of each op fold into one line with their count
    warn = [w for w in rep["warnings"] if "degraded" in w]
    assert len(warn) == 2 and all("[3 groups: " in w and "cnode3-005" in w for w in warn)


def test_plateau_by_hand():
    # a curve that ramps then flattens: the plateau is the run of largest sizes within 90 % of the peak
    curve = [(1 << 20, 10.0), (1 << 22, 40.0), (1 << 24, 91.0), (1 << 26, 100.0), (1 << 28, 98.0)]
    assert PLATEAU_WITHIN == 0.9
    assert plateau(curve) == (98.0, 1 << 24, 1 << 28, 3, 100.0)
    # a dip below 90 % near the top cuts the plateau there
    assert plateau([(1, 100.0), (2, 80.0), (4, 95.0)]) == (95.0, 4, 4, 1, 100.0)
    assert plateau([]) is None


def test_pairs_and_common_node_by_hand():
    g = lambda a, b, bw, bad: dict(run_id="r", op="send", nodes=2, hosts=f"{a},{b}", ranks_per_host=8,  # noqa: E731
                                   plateau_busbw_gbps=bw, degraded=bad, degraded_basis="peers" if bad else None)
    groups = [g("n1", "n2", 10.0, True), g("n1", "n3", 12.0, True), g("n2", "n3", 40.0, False),
              g("n2", "n4", 42.0, False), g("n3", "n4", 41.0, False)]
    pairs, nodes = pair_rows(groups)
    assert [(p["host_a"], p["host_b"], p["slow"]) for p in pairs][:2] == [("n1", "n2", True), ("n1", "n3", True)]
    assert pairs[0]["fleet_busbw_gbps"] == 40.0 and pairs[0]["ratio"] == 0.25  # median of 10, 12, 40, 42, 41
    assert [(n["host"], n["slow_pairs"], n["suspect"]) for n in nodes] == [
        ("n1", 2, True), ("n2", 1, False), ("n3", 1, False), ("n4", 0, False)]


def test_a_run_far_below_its_one_peer_is_flagged_the_peer_is_not(tmp_path):
    # two 2-node × 8 H100 all_reduce runs on the same hosts: 216 GB/s and 28.6 GB/s of busbw at large
    # sizes (7.6× lower). Its peer catches it, and so does the model: a group of 8 ranks per node runs
    # rings over the nodes' 8 NICs, 8 × 40 GB/s = 320 GB/s (one GPU's share, 40 GB/s, would not: 72 %)
    from tests.analyses.test_machine_reference import _allreduce_log

    k = 16

    def rows(busbw):  # t = S/busbw · 2(k−1)/k, µs
        return [(2**p, 2**p / (busbw * 1e9) * 2 * (k - 1) / k * 1e6) for p in (28, 29, 30)]

    store = Store(tmp_path / "s")
    ingest_paths([_allreduce_log(tmp_path / "good_all_reduce.log", ["n1", "n2"], 8, rows(216.0)),
                  _allreduce_log(tmp_path / "slow_all_reduce.log", ["n1", "n2"], 8, rows(28.6))], store, run_id="r")
    rep = build_report(store, "r")
    (d,) = rep["degraded_links"]
    assert (d["pg_name"], d["degraded_basis"], d["peers"]) == ("nccl_tests:all_reduce:run1", "peers,model", 1)
    assert d["model_busbw_gbps"] == pytest.approx(320.0) and d["model_ratio"] == pytest.approx(28.6 / 320, rel=1e-3)
    assert d["plateau_busbw_gbps"] == pytest.approx(28.6, rel=1e-3) and d["peer_busbw_gbps"] == pytest.approx(216, rel=1e-3)
    assert d["peer_ratio"] == pytest.approx(28.6 / 216, rel=2e-3)
    (w,) = [w for w in rep["warnings"] if "degraded" in w]
    assert "13% of its peers' median 216.00 GB/s" in w and "n1,n2" in w


@pytest.mark.parametrize("slow_hosts, basis", [(["n1", "n2"], "peers,model"), (["m1", "m2"], "model")])
def test_peers_in_another_run_only_on_shared_hosts(tmp_path, slow_hosts, basis):
    # the same two logs ingested as two runs: the healthy run is a peer of the slow one only when the
    # runs share a host (one fleet); on other hosts the slow run is judged against the model alone
    # (28.6 GB/s against the 320 GB/s of rings over 8 NICs: flagged by the model)
    from tests.analyses.test_machine_reference import _allreduce_log

    def rows(busbw):
        return [(2**p, 2**p / (busbw * 1e9) * 2 * 15 / 16 * 1e6) for p in (28, 29, 30)]

    store = Store(tmp_path / "s")
    ingest_paths([_allreduce_log(tmp_path / "good_all_reduce.log", ["n1", "n2"], 8, rows(216.0))], store,
                 run_id="good")
    ingest_paths([_allreduce_log(tmp_path / "slow_all_reduce.log", slow_hosts, 8, rows(28.6))], store, run_id="slow")
    rep = build_report(store, "slow")
    assert [d["degraded_basis"] for d in rep["degraded_links"]] == [basis]


def test_fleet_in_json_and_html(fleet):
    import json

    from tracekit.report.data import report_json
    from tracekit.report.html import fleet_heatmap

    store, con = fleet
    rep = build_report(store, "fleet", con=con)
    back = json.loads(report_json(rep))
    assert len(back["fleet"]["pairs"]) == 360 and back["fleet"]["slow_pairs"] == []
    assert {m["locality"] for m in back["machine"]} == {"inter_node", "mixed"}
    fig = fleet_heatmap({"report": rep})
    # one heatmap per op (all_to_all, send) and GPUs per node (1, 2, 4, 8), 10 × 10 nodes each
    assert len(fig.data) == 8
    z = np.array(fig.data[0].z, dtype=float)
    assert z.shape == (10, 10) and np.isnan(np.diag(z)).all()
    assert np.allclose(z, z.T, equal_nan=True)  # a pair's value on both sides of the diagonal
    pair = next(p for p in rep["fleet"]["pairs"] if p["op"] == "all_to_all" and p["ranks_per_host"] == 1)
    assert z[0, 1] == pytest.approx(pair["plateau_busbw_gbps"] / pair["fleet_busbw_gbps"])
