"""α–β fit and verdict views on hand-built instances (values worked by hand)."""

from __future__ import annotations

from tracekit import analyses
import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
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
    rows = con.execute(
        "SELECT run_id, op, n_samples, n_warmup, alpha_s, status, status_reason FROM alpha_beta_fit ORDER BY ALL"
    ).fetchall()
    # two_hosts: 5 all-reduces of one size, the first a warm-up → 4 samples of 1 size: no α/β
    hosts = [r for r in rows if r[0] == "hosts"][0]
    assert hosts[1:5] == ("all_reduce", 4, 1, None)
    assert hosts[5] == "insufficient" and "1 distinct size" in hosts[6]


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


# -- issue 15: the right reference, chosen and shown; D* in the report; degraded links ------------


@pytest.fixture(scope="module")
def sweep_then_tp(tmp_path_factory):
    """fixtures/sweep_2rank, then fixtures/tp_2rank (same machine: host 'vm', CPU gloo), in one store."""
    store = Store(tmp_path_factory.mktemp("sweep-tp"))
    ingest_paths([FIXTURES / "sweep_2rank"], store, run_id="sweep")
    ingest_paths([FIXTURES / "tp_2rank"], store, run_id="tp")
    return store


def test_tp_after_sweep_is_judged_by_the_sweep(sweep_then_tp):
    rep = build_report(sweep_then_tp, "tp")
    fit = {(r["op"], r["group_size"]): r for r in build_report(sweep_then_tp, "sweep")["fit"]}
    sweep_ar = fit[("all_reduce", 2)]
    assert sweep_ar["status"] == "ok"
    con = analyses.connect(sweep_then_tp, run_ids=["tp", "sweep"])
    rows = con.execute(
        "SELECT op, verdict, verdict_basis, reference, ref_alpha_s, ref_beta_Bps FROM collective_verdicts "
        "WHERE run_id = 'tp' AND op <> 'barrier'"
    ).fetchall()
    assert rows and len(rows) == sum(r["count"] for r in rep["verdicts"])
    for op, verdict, basis, ref, a, b in rows:
        assert verdict is not None and basis == "sweep" and ref == "sweep run sweep", (op, verdict, basis, ref)
        assert a == pytest.approx(sweep_ar["alpha_s"]) and b == pytest.approx(sweep_ar["beta_gbps"] * 1e9)
    # the TP run's own fit (one size) judges nothing, and the report names the reference of every verdict
    assert {r["status"] for r in rep["fit"]} == {"insufficient"}
    assert all(r["reference"] == "sweep run sweep" for r in rep["verdicts"])
    (ref,) = rep["references"]
    assert ref["kind"] == "sweep" and ref["instances"] == len(rows)


def test_report_json_boundary_is_where_the_terms_are_equal(sweep_then_tp):
    """D* printed per op is the size at which the model's α and β terms are equal, for its op and k."""
    from tracekit.model import custom_link, predict_collective

    rep = build_report(sweep_then_tp, "sweep")
    seen = set()
    for r in rep["references"]:
        if r["kind"] is None or r["op"] not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            continue
        lk = custom_link(r["alpha_s"], r["beta_gbps"] * 1e9)
        p = predict_collective(r["op"], r["crossover_bytes"], r["group_size"], lk)
        assert p.alpha_term_s == pytest.approx(p.beta_term_s, rel=1e-9), r["op"]
        # ring / pairwise on k ranks: D* = k·α·β, not the link's n½ = α·β
        assert r["crossover_bytes"] == pytest.approx(r["group_size"] * r["n_half_bytes"], rel=1e-9)
        assert r["fixed_latency_ns"] == pytest.approx(p.alpha_term_s * 1e9, rel=1e-9)
        seen.add(r["op"])
    assert seen == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    # each fit row carries its own D* = a/b
    for f in rep["fit"]:
        if f["status"] == "ok":
            lk = custom_link(f["alpha_s"], f["beta_gbps"] * 1e9)
            p = predict_collective(f["op"], f["crossover_bytes"], f["group_size"], lk, algo=f["algo"])
            assert p.alpha_term_s == pytest.approx(p.beta_term_s, rel=1e-9)


def test_no_model_says_why(two):
    rep = build_report(two, "hosts")
    # CPU-only handmade trace across two hosts, no --link, no sweep, no fit: no model, and the reason
    rows = [r for r in rep["verdicts"] if r["verdict_basis"] is None]
    assert rows
    for r in rows:
        assert r["reference"] == "no model" and r["no_model_reason"]
        assert "no ok sweep/nccl-tests fit" in r["no_model_reason"]


def _nccl_log(path, busbw_fraction, device="A100-SXM4-40GB"):
    """A hand-made all_reduce_perf log, 8 ranks on one host, 1 KB … 1 GB, times from nvlink3's α–β
    (α = 2 µs, β = 300 GB/s × 0.8 = 240 GB/s) with β scaled by busbw_fraction."""
    k, alpha, beta = 8, 2e-6, 240e9 * busbw_fraction
    lines = ["# nThread 1 nGpus 8 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20",
             "#", "# Using devices"]
    lines += [f"#   Rank  {r} Pid 4242 on node7 device  {r} [0x00] {device}" for r in range(k)]
    lines += ["#", "#                                                     out-of-place                       in-place",
              "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
              "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    size = 1024
    while size <= 1 << 30:
        t = 2 * (k - 1) * alpha + 2 * (k - 1) / k * size / beta
        algbw = size / t / 1e9
        busbw = algbw * 2 * (k - 1) / k
        half = f"{t * 1e6:10.2f} {algbw:7.2f} {busbw:7.2f}    N/A"
        lines.append(f"{size:12d} {size // 4:13d}   float     sum {half} {half}")
        size *= 4
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", "#"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_degraded_link_is_flagged_and_a_healthy_one_is_not(tmp_path):
    store = Store(tmp_path / "s")
    ingest_paths([_nccl_log(tmp_path / "healthy_allreduce.log", 0.95)], store, run_id="healthy")
    ingest_paths([_nccl_log(tmp_path / "degraded_allreduce.log", 0.13)], store, run_id="degraded")
    ok = build_report(store, "healthy")
    bad = build_report(store, "degraded")
    assert ok["degraded_links"] == [] and not [w for w in ok["warnings"] if "degraded" in w]
    # verdicts: a nccl-tests log calibrates its machine, so its own (ok) fit is the reference — which
    # cannot see a slow link (efficiency ≈ 1); the efficiency against the link uses nvlink3, the
    # A100-SXM4's preset, and that one does
    assert {r["reference"] for r in bad["verdicts"]} == {"nccl_tests run degraded"}
    assert all(r["median_efficiency"] == pytest.approx(1.0, rel=1e-3) for r in bad["verdicts"])
    eff = {r["bucket_bytes"]: r for r in bad["by_size"] if r["op"] == "all_reduce"}
    big = eff[1 << 30]
    assert big["link"] == "nvlink3" and big["link_regime"] == "bandwidth"
    # at 1 GiB the β term dominates: efficiency ≈ 0.13 (α term 14 µs against 7.8 ms of β term)
    assert big["median_efficiency_link"] == pytest.approx(0.13, rel=0.01)
    assert ok_eff(ok) == pytest.approx(0.95, rel=0.01)
    warn = [w for w in bad["warnings"] if "degraded" in w]
    # one line for the group: its busbw plateau (the sizes within 90 % of its peak, 16 MiB – 1 GiB on
    # this curve) against nvlink3's β (its D* = 14·2 µs·240 GB/s / 1.75 = 3.84 MB: the plateau is at
    # >= 4·D*) and against the healthy run, its peer on the same host node7 (analyses/fleet.py)
    assert len(warn) == 1 and "all_reduce on 8 ranks" in warn[0] and "13% of nvlink3" in warn[0]
    assert "14% of its peers' median" in warn[0]  # 0.13 / 0.95 of the same curve
    (d,) = bad["degraded_links"]
    assert (d["plateau_min_bytes"], d["plateau_max_bytes"], d["degraded_basis"]) == (1 << 24, 1 << 30, "peers,model")
    assert d["model_crossover_bytes"] == pytest.approx(3.84e6)
    # by hand: busbw(S) = S/T · 2(k−1)/k with T = 2(k−1)·α + 2(k−1)/k · S/β, β = 240 GB/s × 0.13;
    # the median of the 4 plateau sizes is the mean of the 64 MiB and 256 MiB values
    k, alpha, beta = 8, 2e-6, 240e9 * 0.13
    bw = lambda s: s / (2 * (k - 1) * alpha + 2 * (k - 1) / k * s / beta) * 2 * (k - 1) / k / 1e9  # noqa: E731
    assert d["plateau_busbw_gbps"] == pytest.approx((bw(1 << 26) + bw(1 << 28)) / 2, rel=1e-4)
    assert d["model_ratio"] == pytest.approx(d["plateau_busbw_gbps"] / 240, rel=1e-9)


def ok_eff(rep):
    return [r for r in rep["by_size"] if r["bucket_bytes"] == 1 << 30][0]["median_efficiency_link"]


def test_users_alpha_beta_is_the_reference(two, capsys):
    # α = 10 µs, β = 5 GB/s for every verdict; all_reduce ring k = 2, D = 4,194,304 B:
    #   α term 2(k−1)·α = 20 µs; β term 2(k−1)/k·D/β = 838.8608 µs → bandwidth-bound
    rep = build_report(two, "two", alpha_s=10e-6, beta_Bps=5e9)
    assert {r["verdict_basis"] for r in rep["verdicts"]} == {"user"}
    (ar,) = [r for r in rep["references"] if r["op"] == "all_reduce"]
    assert ar["fixed_latency_ns"] == pytest.approx(20_000.0) and ar["crossover_bytes"] == pytest.approx(2 * 10e-6 * 5e9)
    assert rep["reference_options"] == {"alpha_s": 10e-6, "beta_Bps": 5e9}
    assert main(["analyze", "--store", str(two.path), "--run", "two", "--alpha", "10us", "--beta", "5GB/s", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert {r["reference"] for r in out["verdicts"]} == {"user α/β"}
    assert main(["analyze", "--store", str(two.path), "--run", "two", "--alpha", "10us"]) == 2
    assert "both α and β" in capsys.readouterr().err


def test_html_marks_the_collectives_boundary_and_shows_the_reference(sweep_then_tp):
    """The HTML's model lines carry D* (where the α and β terms are equal), not n½, as the boundary;
    the page lists each verdict's reference and the device-chosen presets."""
    from tracekit.report.html import html_data, render_html, report_tables
    from tracekit.model import link_from_preset, predict_collective

    data = html_data(sweep_then_tp, "tp")
    assert data["presets"] == ["eth25", "eth100"]  # CPU run, no GPU preset: the gloo backend's
    assert {r["reference"] for r in data["bandwidth"] if r["op"] == "all_reduce"} == {"sweep run sweep"}
    for c in data["curves"]:
        if c["kind"] != "preset":
            continue
        p = predict_collective(c["op"], c["crossover_bytes"], c["group_size"], link_from_preset(c["name"]), algo=c["algo"])
        assert p.alpha_term_s == pytest.approx(p.beta_term_s, rel=1e-9)
        # all_reduce ring on k = 2: D* = 2·n½
        if c["op"] == "all_reduce":
            assert c["crossover_bytes"] == pytest.approx(2 * c["n_half_bytes"])
    ids = [t.id for t in report_tables(data["report"])]
    assert "references" in ids and "verdicts" in ids and "fit" in ids
    page = render_html(data)
    assert "sweep run sweep" in page and "D*" in page


def test_incomplete_instances_are_not_judged(tmp_path):
    """Rank 1 of 2 alone (HTA's DDP trace, V100): every all-reduce is seen by 1 of its 2 ranks, so its
    'sync time' still holds the wait for the other rank: no verdict, no efficiency, and the reason."""
    from tests.conftest import shared_trace

    store = Store(tmp_path / "s")
    ingest_paths([shared_trace("hta_ddp_v100_r1of2")], store, run_id="ddp")
    rep = build_report(store, "ddp")
    (v,) = rep["verdicts"]
    assert v["op"] == "all_reduce" and v["verdict"] is None and v["median_efficiency"] is None
    assert v["no_model_reason"].startswith("incomplete: 1 of 2 ranks recorded")
    assert v["count"] == 2020


def test_best_algorithm_per_instance_is_the_models_fastest(two):
    """collective_verdicts asks the model once per distinct (op, size, k, α, β, in-switch) and joins
    the answer back: each instance's best_algo and best_predicted_ns are what predict_collective
    says for that instance's own arguments (nvls only where the reference is an nvlink4/5 link)."""
    from tracekit.model import custom_link, predict_collective

    con = analyses.connect(two, link="nvlink4")
    rows = con.execute(
        "SELECT op, size_bytes, group_size, ref_alpha_s, ref_beta_Bps, verdict_basis, best_algo, best_predicted_ns "
        "FROM collective_verdicts ORDER BY run_id, pg_name, seq").fetchall()
    assert len(rows) >= 6
    for op, size, k, a, b, basis, algo, t_ns in rows:
        preds = predict_collective(op, float(size), k, custom_link(a, b), algo="all")
        if basis not in ("link", "preset"):
            preds = [p for p in preds if p.algo != "nvls"] or preds
        best = min(preds, key=lambda p: p.time_s)
        assert (algo, t_ns) == (best.algo, best.time_s * 1e9)
    # by hand, nvlink4 (α 2 µs, β 360 GB/s), k = 2: an all-reduce by recursive doubling is one step,
    # α + D/β (ring: 2α + D/β); an all-gather by ring is α + D/2β
    by_size = {(op, size): (algo, t) for op, size, _k, _a, _b, _basis, algo, t in rows}
    assert by_size[("all_reduce", 4_194_304)][0] == "recursive_doubling"
    assert by_size[("all_reduce", 4_194_304)][1] == pytest.approx(2_000 + 4_194_304 / 3.6e11 * 1e9, rel=1e-12)
    assert by_size[("all_reduce", 4_096)][1] == pytest.approx(2_000 + 4_096 / 3.6e11 * 1e9, rel=1e-12)
    assert by_size[("all_gather", 1_048_576)] == ("ring", pytest.approx(2_000 + 1_048_576 / 7.2e11 * 1e9, rel=1e-12))
