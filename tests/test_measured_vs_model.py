"""measured_vs_model on recorded workloads: the prediction's arithmetic, by hand."""

from __future__ import annotations

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
    rows = store.connect(link="eth25").execute(
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


def test_chunked_model_arithmetic():
    """The chunked branch on numbers worked by hand, through the same model function."""
    from tracekit.model import chunked_overlap

    # c = 1 ms, a (β part) = 1 ms, n = 4, α_c = 10 µs:
    #   T = 0.25 + (0.25 + 0.01) + 3·max(0.25, 0.26) = 0.25 + 0.26 + 0.78 = 1.29 ms; exposed = 0.29 ms
    got = chunked_overlap(1e-3, 1e-3, 4, 10e-6)
    assert got.time_s == pytest.approx(1.29e-3)
    assert got.time_s - 1e-3 == pytest.approx(0.29e-3)
