"""α–β fit and verdict views on hand-built instances (values worked by hand)."""

from __future__ import annotations

from tracekit import analyses
import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.report import build_report
from tracekit.store import Store


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("v"))
    ingest_paths([FIXTURES / "handmade" / "two_rank"], store, run_id="two")
    ingest_paths([FIXTURES / "defects" / "two_hosts"], store, run_id="hosts")
    return store


def test_link_verdicts_follow_n_half(two):
    con = analyses.connect(two, link="nvlink4")
    rows = con.execute(
        "SELECT seq, op, model_algo, link_alpha_term_ns, link_beta_term_ns, verdict, verdict_basis, efficiency_link "
        "FROM collective_verdicts WHERE run_id = 'two' ORDER BY seq"
    ).fetchall()
    ar, ag = rows
    # all_reduce, ring, k = 2, D = 4,194,304 B on nvlink4 (α 2 µs, β 360 GB/s):
    #   α term = 2(k−1)·α = 4 µs; β term = 2(k−1)/k · D/β = 4,194,304 / 3.6e11 s = 11,650.844 ns
    #   → D/k = 2.1 MB is above n½ = 720 KB: bandwidth-bound; efficiency = 15,650.844 / 35,000
    assert ar[:3] == (0, "all_reduce", "ring")
    assert ar[3] == pytest.approx(4_000.0)
    assert ar[4] == pytest.approx(4_194_304 / 3.6e11 * 1e9, rel=1e-12)
    assert ar[5:7] == ("bandwidth-bound", "link")
    assert ar[7] == pytest.approx((4_000 + 4_194_304 / 3.6e11 * 1e9) / 35_000, rel=1e-12)
    # all_gather, ring, k = 2, D = 1,048,576 B: α term = (k−1)·α = 2 µs; β term = (k−1)/k · D/β = 1,456.356 ns
    #   → the per-step chunk D/k = 524 KB is below n½: latency-bound
    assert ag[3] == pytest.approx(2_000.0)
    assert ag[4] == pytest.approx(1_456.3556, rel=1e-7)
    assert ag[5:7] == ("latency-bound", "link")


def test_skew_bound_when_waiting_exceeds_transfer(two):
    con = analyses.connect(two)
    rows = con.execute(
        "SELECT seq, skew_ns, sync_time_ns, verdict FROM collective_verdicts WHERE run_id = 'hosts' ORDER BY seq"
    ).fetchall()
    # instance 2: rank 1 arrives 42 µs late, both end together 28 µs later → skew-bound
    assert rows[2] == (2, 42_000, 28_000.0, "skew-bound")
    # the others: 2 µs of skew against ~28 µs of transfer → not skew-bound (no fit, no link: no verdict)
    assert all(r[3] != "skew-bound" for r in rows[:2] + rows[3:])


def test_one_size_cannot_be_fitted(two):
    con = analyses.connect(two)
    rows = con.execute("SELECT run_id, op, n_samples, n_warmup, alpha_s, status FROM alpha_beta_fit ORDER BY ALL").fetchall()
    # two_hosts: 5 all-reduces of one size, the first a warm-up → 4 samples of 1 size: no α/β
    hosts = [r for r in rows if r[0] == "hosts"][0]
    assert hosts[1:5] == ("all_reduce", 4, 1, None)
    assert "1 distinct size" in hosts[5]


def test_fit_recovers_alpha_beta_from_synthetic_trace(tmp_path):
    """A 2-rank all-reduce trace with sync times from known α = 5 µs, β = 20 GB/s (ring, k = 2)."""
    import json

    alpha, beta = 5e-6, 20e9
    sizes = [2**p for p in range(10, 27, 2)]  # 1 KiB .. 64 MiB
    for rank in (0, 1):
        evs = []
        t = 1_000_000.0
        for seq, d in enumerate([sizes[0]] + sizes):  # first call: warm-up, 100× slower
            model_s = 2 * alpha + d / beta  # 2(k−1)α + 2(k−1)/k · D/β with k = 2
            dur_us = model_s * 1e6 * (100 if seq == 0 else 1)
            args = {"Collective name": "allreduce", "In msg nelems": d // 4, "Out msg nelems": d // 4,
                    "dtype": "Float", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                    "Seq": seq, "device": 0, "stream": 7}
            evs.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_RING_LL(x)", "pid": 0, "tid": 7,
                        "ts": round(t, 3), "dur": round(dur_us, 3), "args": args})
            t += dur_us + 1000
        doc = {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": evs}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(doc))
    store = Store(tmp_path / "s")
    ingest_paths([tmp_path], store, run_id="synth")
    fit = analyses.connect(store).execute(
        "SELECT op, n_warmup, n_used, alpha_s, beta_Bps, n_half_bytes, status FROM alpha_beta_fit"
    ).fetchone()
    assert fit[0:2] == ("all_reduce", 1)
    assert fit[3] == pytest.approx(alpha, rel=1e-3)  # ns rounding of the µs text only
    assert fit[4] == pytest.approx(beta, rel=1e-3)
    assert fit[5] == pytest.approx(alpha * beta, rel=2e-3)  # n½ = 100 KB
    assert fit[6] == "ok"


def test_analyze_link_option_and_bad_link(two, capsys):
    rep = build_report(two, "two", link="ib_ndr")
    assert rep["link"] == "ib_ndr"
    assert {v["verdict"] for v in rep["verdicts"]} <= {"latency-bound", "bandwidth-bound", "skew-bound"}
    assert rep["furthest_from_model"]
    assert main(["analyze", "--store", str(two.path), "--run", "two", "--link", "warp_drive"]) == 2
    assert "warp_drive" in capsys.readouterr().err
