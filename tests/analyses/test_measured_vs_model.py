"""measured_vs_model on recorded workloads: the prediction's arithmetic, by hand."""

from __future__ import annotations

from tracekit import analyses
import pytest

from tests.conftest import FIXTURES
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.store import Store


@pytest.fixture(scope="module")
def tp(session_store):
    return session_store("tp"), "tp"


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


def test_without_link_or_sweep_the_device_preset_is_used(tp):
    store, rid = tp
    rep = build_report(store, rid)
    # a CPU gloo run on one host, no --link, no sweep: the loopback_gloo preset (α 100 µs, β 2.5 GB/s × 0.8):
    #   4 × (2(k−1)·α + 2(k−1)/k·D/β) = 4 × (200 µs + 131,072 B / 2e9 B/s) = 4 × 265.536 µs = 1,062.144 µs
    for r in rep["measured_vs_model"]:
        assert r["ab_source"] == "preset:loopback_gloo"
        assert r["predicted_exposed_ns"] == pytest.approx(1_062_144.0, rel=1e-9)


def test_gap_decomposition_adds_up_and_skew_is_the_waiting(tp):
    """gap = skew + transfer beyond the model + exposure; skew = the rank's waits for the last arrival,
    computed here independently from the collectives table (pandas)."""
    store, rid = tp
    con = analyses.connect(store, link="eth25")
    rows = con.execute(
        "SELECT rank, steps, comm_ns, overlap_ns, exposed_ns, predicted_comm_ns, predicted_exposed_ns, wait_ns, "
        "gap_ns, gap_skew_ns, gap_transfer_ns, gap_exposure_ns FROM measured_vs_model ORDER BY rank"
    ).fetchall()
    calls = con.execute(
        "SELECT c.rank, c.pg_name, c.seq, c.ts_ns, e.step FROM collectives c JOIN events e USING (run_id, rank, event_id) "
        "WHERE c.op IS NOT NULL"
    ).df()
    steps = con.execute("SELECT rank, step FROM overlap_by_step WHERE comm_ns > 0").df()
    calls["wait"] = calls.groupby(["pg_name", "seq"])["ts_ns"].transform("max") - calls["ts_ns"]
    calls = calls.merge(steps, on=["rank", "step"])
    for rank, n, comm, ov, exp, pc, pe, w, gap, g_skew, g_tr, g_exp in rows:
        want = calls.loc[calls["rank"] == rank, "wait"].sum() / n
        assert w == pytest.approx(min(want, comm), rel=1e-9) and g_skew == w
        assert gap == pytest.approx(exp - pe, rel=1e-9)
        assert g_skew + g_tr + g_exp == pytest.approx(gap, rel=1e-9, abs=1e-3)
        assert g_tr == pytest.approx(comm - w - pc, rel=1e-9)
        assert g_exp == pytest.approx(pc - pe - ov, rel=1e-9, abs=1e-6)


def test_straggler_imposed_wait_on_dlrm(tmp_path):
    """Each rank's imposed wait = Σ over the instances where it arrived last of the other ranks' waits,
    checked against pandas on the collectives table of the real 8-rank DLRM set."""
    from tests.conftest import shared_trace

    d = shared_trace("param_dlrm_8rank_v100")
    store = Store(tmp_path / "s")
    ingest_paths([d], store, run_id="dlrm")
    rep = build_report(store, "dlrm")
    c = store.connect().execute(
        "SELECT rank, pg_name, seq, ts_ns FROM collectives WHERE op IS NOT NULL AND op <> 'barrier'"
    ).df()
    c = c[c.groupby(["pg_name", "seq"])["rank"].transform("nunique") > 1]
    last = c.groupby(["pg_name", "seq"])["ts_ns"].transform("max")
    c["wait"] = last - c["ts_ns"]
    strag = c.loc[c["ts_ns"] == last].groupby(["pg_name", "seq"])["rank"].agg(list)
    assert all(len(v) == 1 for v in strag), "ties for last arrival: the straggler is ambiguous"
    imposed = c.groupby(["pg_name", "seq"])["wait"].sum().rename("imposed").to_frame().join(strag.str[0])
    want = imposed.groupby("rank")["imposed"].sum().to_dict()
    got = {r["rank"]: r["wait_caused_ns"] for r in rep["straggler_ranks"]}
    assert got == {k: pytest.approx(v) for k, v in want.items()}
    # not the straggler's own skews: those are the largest single wait per instance, a smaller sum
    own = {r["rank"]: r["skew_sum_ns"] for r in rep["straggler_ranks"]}
    assert sum(own.values()) < sum(got.values())
    # the decomposition on real GPU data adds up too
    for r in rep["measured_vs_model"]:
        if r["gap_ns"] is not None:
            assert r["gap_skew_ns"] + r["gap_transfer_ns"] + r["gap_exposure_ns"] == pytest.approx(r["gap_ns"], abs=1e-3)


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


# --------------------------------------------------------------------------- per dimension (3d fixture)


@pytest.fixture(scope="module")
def threed(tmp_path_factory):
    import json

    store = Store(tmp_path_factory.mktemp("mvm3d"))
    conf = json.loads((FIXTURES / "3d_2x2x2" / "run_config.json").read_text())
    rid = ingest_paths([FIXTURES / "3d_2x2x2"], store, workload="3d", config=conf, run_id="3d")
    return store, rid


def test_3d_each_dimension_gets_its_own_model(threed):
    """nvlink4: α = 2 µs, β = 450 GB/s × 0.8 = 3.6e11 B/s. Per rank and step (fixtures/3d_2x2x2/NOTE.md):
    tp: 8 ring all-reduces of 8,192 B on k = 2: 8 × (2α + D/β) = 8 × 4.022756 µs = 32.182044 µs, all exposed;
    pp: 2 sends + 2 recvs of 8,192 B: 4 × (α + D/β) = 8.091022 µs, exposed, bubble (2−1)/(2+2−1) = 1/3;
    dp: 2 buckets (stage 0: 73,728 and 33,280 B; stage 1: 73,984 and 33,280 B), DDP: the first hidden,
    the last exposed: 2α + 33,280/β = 4.092444 µs of 4.204800 + 4.092444 (stage 1: 4.205511 + 4.092444)."""
    store, rid = threed
    con = analyses.connect(store, link="nvlink4")
    rows = con.execute("SELECT rank, dimension, calls, model, predicted_comm_ns, predicted_exposed_ns, bubble_fraction "
                       "FROM measured_vs_model_by_dimension ORDER BY rank, dimension").fetchall()
    assert len(rows) == 8 * 3
    ar = lambda d: 2 * 2e-6 + d / 3.6e11  # noqa: E731
    for rank, dim, calls, model, comm, exposed, bubble in rows:
        if dim == "tp":
            assert (calls, model, bubble) == (8, "no_overlap", None)
            assert comm == pytest.approx(8 * ar(8192) * 1e9) == exposed
            assert comm == pytest.approx(32_182.044, abs=1e-3)
        elif dim == "pp":
            assert (calls, model) == (4, "pipeline") and bubble == pytest.approx(1 / 3)
            assert comm == pytest.approx(4 * (2e-6 + 8192 / 3.6e11) * 1e9) == exposed
        else:
            first = 73_728 if rank < 4 else 73_984
            assert (dim, calls, model) == ("dp", 2, "bucket_overlap")
            assert comm == pytest.approx((ar(first) + ar(33_280)) * 1e9)
            assert exposed == pytest.approx(ar(33_280) * 1e9) == pytest.approx(4_092.444, abs=1e-3)


def test_3d_measured_side_per_dimension_is_the_sum_over_its_calls(threed):
    """Measured comm and overlap per dimension, recomputed from the collectives and collective_overlap
    tables with the group → dimension map the run config gives (tp/dp by desc, p2p pairs are pp)."""
    import json

    store, rid = threed
    con = analyses.connect(store, link="nvlink4")
    conf = json.loads((FIXTURES / "3d_2x2x2" / "run_config.json").read_text())
    dim_of = {g["pg_name"]: g["desc"] for g in conf["process_groups"]}
    want = {}
    for rank, pg, dur, ov in con.execute(
            "SELECT c.rank, c.pg_name, c.dur_ns, o.overlap_ns FROM collectives c "
            "JOIN collective_overlap o USING (run_id, rank, event_id) JOIN events e USING (run_id, rank, event_id) "
            "WHERE e.step IS NOT NULL").fetchall():
        d = "pp" if pg.startswith("p2p:") else dim_of[pg]
        acc = want.setdefault((rank, d), [0, 0])
        acc[0] += dur
        acc[1] += ov
    got = {(r, d): (c, o, e) for r, d, c, o, e in con.execute(
        "SELECT rank, dimension, comm_ns, overlap_ns, exposed_ns FROM measured_vs_model_by_dimension").fetchall()}
    assert set(got) == set(want)
    for k, (c, o) in want.items():  # one profiled step
        assert got[k] == (c, o, c - o)


def test_3d_blocking_tp_all_reduces_are_exposed(threed):
    """The TP all-reduces are blocking: ReduceFromTP / CopyToTPBackward enclose the call and its wait,
    so on these CPU-only ranks no compute op meets a TP span (checked span by span against every
    compute row, not through the unions) and the TP communication is all exposed (before CPU compute
    left out the ops blocked in a collective, ReduceFromTP hid it all: 0 ms exposed of ~123 ms per
    rank). The DP buckets, async, still overlap the compute after their launch."""
    store, rid = threed
    con = analyses.connect(store)
    met = con.execute(
        "SELECT count(*) FROM collectives c JOIN process_groups g USING (run_id, pg_name) "
        "JOIN events k ON k.run_id = c.run_id AND k.rank = c.rank AND k.class = 'compute' "
        " AND k.ts_ns < c.ts_ns + c.dur_ns AND c.ts_ns < k.ts_ns + k.dur_ns "
        "WHERE g.dimension = 'tp'").fetchone()[0]
    assert met == 0
    rows = con.execute("SELECT rank, comm_ns, overlap_ns, exposed_ns FROM measured_vs_model_by_dimension "
                       "WHERE dimension = 'tp' ORDER BY rank").fetchall()
    assert [r[0] for r in rows] == list(range(8))
    for _, comm, overlap, exposed in rows:
        assert comm > 0 and overlap == 0 and exposed == comm
    dp_overlap = con.execute("SELECT sum(overlap_ns) FROM measured_vs_model_by_dimension WHERE dimension = 'dp'").fetchone()[0]
    assert dp_overlap > 0
