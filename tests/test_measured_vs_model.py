"""measured_vs_model on recorded workloads: the prediction's arithmetic, by hand."""

from __future__ import annotations

from tracekit import analyses
import pytest

from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.report import build_report
from tracekit.store import Store


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("mvm"))
    rid = ingest_paths([FIXTURES / "tp_2rank"], store)
    return store, rid


def test_tp_no_overlap_prediction_with_link(tp):
    store, rid = tp
    rows = analyses.connect(store, link="eth25").execute(
        "SELECT rank, steps, model, predicted_comm_ns, predicted_exposed_ns, ab_source, exposed_ns, gap_ratio, larger "
        "FROM measured_vs_model ORDER BY rank"
    ).fetchall()
    # 4 all-reduces per step of 131,072 B on k = 2 over eth25 (α 20 µs, β 2.5 GB/s), ring:
    #   T = 2(k−1)·α + 2(k−1)/k · D/β = 40 µs + 52.4288 µs = 92.4288 µs; × 4 = 369.7152 µs
    for r in rows:
        assert r[1:3] == (2, "no_overlap")
        assert r[3] == pytest.approx(369_715.2, rel=1e-9)
        assert r[4] == pytest.approx(369_715.2, rel=1e-9)
        assert r[5] == "link:eth25"
        assert r[7] == pytest.approx(r[6] / 369_715.2, rel=1e-9)
        assert r[8] == ("measured" if r[6] >= 369_715.2 else "model")


def test_without_any_alpha_beta_there_is_no_prediction(tp):
    store, rid = tp
    rep = build_report(store, rid)
    assert [r["predicted_exposed_ns"] for r in rep["measured_vs_model"]] == [None, None]
    assert "run a sweep" in rep["measured_vs_model"][0]["note"]


ETH25_ALPHA, ETH25_BETA = 20e-6, 2.5e9  # reference table: 25 GbE, α 20 µs, β 3.125 GB/s × 0.8


def _inputs(con, rid, rank):
    """Measured per-step compute (s) and the step's calls, read from the store: the model's inputs."""
    steps = con.execute(
        "SELECT step, compute_ns FROM overlap_by_step WHERE run_id = ? AND rank = ? AND comm_ns > 0", [rid, rank]
    ).fetchall()
    calls = con.execute(
        "SELECT c.op, c.size_bytes FROM collectives c JOIN events e USING (run_id, rank, event_id) "
        "WHERE c.run_id = ? AND c.rank = ? AND e.step IN (SELECT unnest(?::BIGINT[]))",
        [rid, rank, [s for s, _ in steps]],
    ).fetchall()
    return len(steps), sum(c for _, c in steps) / len(steps) * 1e-9, calls


def _row(con, rid, rank):
    return con.execute(
        "SELECT model, predicted_comm_ns, predicted_exposed_ns FROM measured_vs_model WHERE run_id = ? AND rank = ?",
        [rid, rank],
    ).fetchone()


@pytest.fixture(scope="module")
def workloads(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("mvm-w"))
    rids = {name: ingest_paths([FIXTURES / rel], store, run_id=name) for name, rel in
            [("chunks", "tp_chunks_2rank"), ("tbo", "ep_2rank/tbo"), ("kv", "kv_layerwise_2rank"), ("pp", "pp_2rank")]}
    return analyses.connect(store, link="eth25"), rids


def test_chunked_branch(workloads):
    """tp --overlap-chunks 4: per step 16 all-reduces of 32,768 B (k = 2, ring): α term 2(k−1)α = 40 µs,
    β term 2(k−1)/k·D/β = 13.1072 µs each. 16/4 = 4 pieces; per piece a = 4 × 13.1072 µs, α_c = 40 µs,
    T(4) = c/4 + (a/4 + α_c) + 3·max(c/4, a/4 + α_c) with c the piece's compute; exposed = 4·(T − c)."""
    con, rids = workloads
    for rank in (0, 1):
        n, c, calls = _inputs(con, "chunks", rank)
        assert [(op, s) for op, s in calls].count(("all_reduce", 32768)) == len(calls) == 16 * n
        cp, ap, ac = c / 4, 4 * 32768 / ETH25_BETA, 2 * ETH25_ALPHA
        t = cp / 4 + (ap / 4 + ac) + 3 * max(cp / 4, ap / 4 + ac)
        model, pred_comm, pred_exp = _row(con, "chunks", rank)
        assert model == "chunked"
        assert pred_comm == pytest.approx(16 * (40e-6 + 32768 / ETH25_BETA) * 1e9, rel=1e-9)
        assert pred_exp == pytest.approx(4 * (t - cp) * 1e9, rel=1e-9)


def test_two_batch_branch(workloads):
    """ep --two-batch-overlap, 2 MoE layers: a = Σ all-to-all times of the step (pairwise, k = 2:
    α + ½·S/β each); per layer T = max(a/2, c/2) + min(a/2, c/2)/2; exposed = 2·(T − c/2)."""
    con, rids = workloads
    for rank in (0, 1):
        n, c, calls = _inputs(con, "tbo", rank)
        a = sum(ETH25_ALPHA + 0.5 * s / ETH25_BETA for op, s in calls if op == "all_to_all") / n
        al, cl = a / 2, c / 2
        model, pred_comm, pred_exp = _row(con, "tbo", rank)
        assert model == "two_batch"
        assert pred_comm == pytest.approx(a * 1e9, rel=1e-9)
        assert pred_exp == pytest.approx(2 * (max(al, cl) + min(al, cl) / 2 - cl) * 1e9, rel=1e-9)


def test_layerwise_branch(workloads):
    """disagg-kv layer-wise, L = 4: a = Σ p2p times of the step (α + S/β each);
    exposed = a/L + (L−1)·max(0, a/L − c/L)."""
    con, rids = workloads
    for rank in (0, 1):
        n, c, calls = _inputs(con, "kv", rank)
        a = sum(ETH25_ALPHA + s / ETH25_BETA for op, s in calls) / n
        model, pred_comm, pred_exp = _row(con, "kv", rank)
        assert model == "layerwise"
        assert pred_comm == pytest.approx(a * 1e9, rel=1e-9)
        assert pred_exp == pytest.approx((a / 4 + 3 * max(0.0, a / 4 - c / 4)) * 1e9, rel=1e-9)


def test_pp_bubble(workloads):
    """pp train, 2 stages, 4 micro-batches: bubble (p−1)/(m+p−1) = 1/5."""
    con, rids = workloads
    assert con.execute("SELECT bubble_fraction FROM measured_vs_model WHERE run_id = 'pp'").fetchall() == [(0.2,), (0.2,)]
