"""The verdict views of analyses/verdict_summary.sql (verdict_counts, verdict_references) on the
hand-made all-reduces of tests/analyses/test_collective_sizes.py (group "0", k = 2) judged against
the user's α = 5 µs, β = 10 GB/s, with the ring all-reduce's T = 2(k−1)·α + 2(k−1)/k · D/β
(../shared/reference/alpha-beta.md) worked out here, and the report reading them."""

from __future__ import annotations

import statistics

import pytest

from tests.analyses.test_collective_sizes import CALLS, _sync_ns, _write
from tests.conftest import view_rows
from tracekit.ingest import ingest_paths
from tracekit.report.data import apply_reference_options, build_report
from tracekit.store import Store

ALPHA, BETA = 5e-6, 10e9  # s, bytes/s
K = 2


def _predicted_ns(size):
    return (2 * (K - 1) * ALPHA + 2 * (K - 1) / K * size / BETA) * 1e9


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verdict_summary")
    st = Store(tmp / "s")
    ingest_paths([_write(tmp / "t", CALLS[:5])], st, run_id="ring")  # group "0" only
    return st


def _view(st, sql):
    return view_rows(st, sql, ["ring"], setup=lambda con: apply_reference_options(con, alpha_s=ALPHA, beta_Bps=BETA))


def _efficiencies(bandwidth_bound: bool):
    # latency-bound when the α term 2(k−1)·α >= the β term 2(k−1)/k · D/β, i.e. D < D* = k·α·β = 100 kB
    return [_predicted_ns(size) / _sync_ns(per_rank) for _, _, size, per_rank in CALLS[:5]
            if (size >= K * ALPHA * BETA) == bandwidth_bound]


def test_verdict_counts_by_hand(store):
    rows = {r["verdict"]: r for r in _view(store, "SELECT * FROM verdict_counts")}
    assert set(rows) == {"latency-bound", "bandwidth-bound"}
    lat, bw = rows["latency-bound"], rows["bandwidth-bound"]
    # 4096 B in 10 and 30 µs, 6000 B in 20 µs: latency-bound; 1 MiB in 100 and 140 µs: bandwidth-bound
    assert (lat["count"], bw["count"]) == (3, 2)
    assert lat["median_efficiency"] == pytest.approx(statistics.median(_efficiencies(False)))
    assert lat["median_efficiency"] == pytest.approx((10_000 + 6000 / 10) / 20_000)  # the 6000 B call's
    assert bw["median_efficiency"] == pytest.approx(((10_000 + (1 << 20) / 10) / 100_000
                                                     + (10_000 + (1 << 20) / 10) / 140_000) / 2)
    assert lat["verdict_basis"] == bw["verdict_basis"] == "user" and lat["no_model_reason"] is None
    # the user's α/β is the link too (collective_verdicts: "the user's, else the device/topology preset")
    assert lat["median_efficiency_link"] == pytest.approx(lat["median_efficiency"])


def test_verdict_references_by_hand(store):
    (ref,) = _view(store, "SELECT * FROM verdict_references")
    assert (ref["op"], ref["group_size"], ref["kind"], ref["instances"], ref["groups"]) == ("all_reduce", 2, "user", 5, 1)
    assert ref["alpha_s"] == pytest.approx(ALPHA) and ref["beta_gbps"] == pytest.approx(10.0)
    assert ref["n_half_bytes"] == pytest.approx(ALPHA * BETA)  # 50 kB
    # ring all-reduce: D* = k·α·β = 100 kB and the fixed latency 2(k−1)·α = 10 µs, the same for every instance
    assert ref["crossover_bytes"] == pytest.approx(100_000) == ref["crossover_min_bytes"] == ref["crossover_max_bytes"]
    assert ref["fixed_latency_ns"] == pytest.approx(10_000)
    assert ref["nccl_algos"] is None and ref["no_model_reason"] is None


def test_report_reads_the_verdict_views(store):
    rep = build_report(store, "ring", alpha_s=ALPHA, beta_Bps=BETA)
    assert [(v["verdict"], v["count"]) for v in rep["verdicts"]] == [("bandwidth-bound", 2), ("latency-bound", 3)]
    (ref,) = rep["references"]
    assert ref["kind"] == "user" and ref["crossover_bytes"] == pytest.approx(100_000)
    assert "run_id" not in ref and "run_id" not in rep["verdicts"][0]
