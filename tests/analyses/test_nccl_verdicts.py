"""collective_verdicts against NCCL's own model where the reference falls back to a preset.

A nccl-tests log of too few sizes has no ok fit, so its verdicts fall back to the device's preset
(collective_reference ref_kind 'preset'); the verdict then compares with the fastest NCCL
algorithm/protocol for that op, size, k and node count (tracekit.model.nccl_tuning, NCCL 2.20.3
src/graph/tuning.cc) and names it in nccl_algo.
"""

from __future__ import annotations

import pytest

from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _log(path, hosts: int, per_host: int, rows: list[tuple[int, float]], device="NVIDIA H100 80GB HBM3"):
    """An all_reduce_perf log of hosts × per_host ranks (one GPU per process), given (size, µs) rows."""
    k = hosts * per_host
    lines = [f"# nThread 1 nGpus 1 minBytes {rows[0][0]} maxBytes {rows[-1][0]} step: 2(factor) warmup iters: 5 "
             "iters: 20", "#", "# Using devices"]
    lines += [f"#  Rank {r:4d} Group  0 Pid {1000 + r} on host{r // per_host:03d} device  {r % per_host} [0x1b] {device}"
              for r in range(k)]
    lines += ["#", "#                                                     out-of-place                       in-place",
              "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
              "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    for size, us in rows:
        algbw = size / (us * 1e-6) / 1e9
        half = f"{us:10.2f} {algbw:7.2f} {algbw * 2 * (k - 1) / k:7.2f}    N/A"
        lines.append(f"{size:12d} {max(size // 4, 1):13d}   float     sum {half} {half}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", "#"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _verdicts(store):
    con = analyses.connect(store)
    return con.execute(
        "SELECT size_bytes, group_size, verdict_basis, nccl_algo, ref_alpha_term_ns, ref_beta_term_ns, predicted_ns, "
        "crossover_bytes, verdict, efficiency, sync_time_ns FROM collective_verdicts ORDER BY size_bytes").fetchall()


def test_small_all_reduce_at_scale_is_judged_against_tree_latency(tmp_path):
    store = Store(tmp_path / "s")
    # 256 hosts × 8 H100: 2,048 ranks; two sizes only, so no ok fit: the preset path
    ingest_paths([_log(tmp_path / "scale_allreduce.log", 256, 8, [(8, 130.0), (16, 131.0)])], store, run_id="scale")
    rows = _verdicts(store)
    assert len(rows) == 4  # out-of-place and in-place per size
    size, k, basis, algo, a_ns, b_ns, pred, dstar, verdict, eff, sync = rows[0]
    assert (size, k, basis, algo) == (8, 2048, "preset", "tree/LL")
    # NCCL tree/LL on 256 nodes: 6.8 + 2 × (7 × 0.6 + ⌊log₂256⌋ × 5.0) = 95.2 µs; algbw
    # min(min(320 × 0.92, 16 × 36.0) / 3.8, 20.4) × 0.5 = 10.2 GB/s (path min(360, 8 × 40) = 320)
    assert a_ns == pytest.approx(95_200.0)
    assert b_ns == pytest.approx(8 / 10.2e9 * 1e9)
    assert pred == pytest.approx(95_200.0 + 8 / 10.2)
    assert dstar == pytest.approx(95.2e-6 * 10.2e9)  # its crossover: 971 KB
    assert verdict == "latency-bound"
    assert eff == pytest.approx(pred / sync) and sync == pytest.approx(130_000.0)
    # the α–β ring of the preset would have said 2 × 2047 × 5 µs = 20.47 ms: 157× the measured time


def test_one_node_large_all_reduce_is_judged_against_nvls(tmp_path):
    store = Store(tmp_path / "s")
    ingest_paths([_log(tmp_path / "node_allreduce.log", 1, 8, [(1 << 30, 2400.0), (1 << 31, 4700.0)])], store,
                 run_id="node")
    rows = _verdicts(store)
    size, k, basis, algo, a_ns, b_ns, pred, *_ = rows[0]
    assert (size, k, basis, algo) == (1 << 30, 8, "preset", "nvls/Simple")
    # NVLS on one node: 23 µs + 2^30 / (360 × 5/6 GB/s)
    assert a_ns == pytest.approx(23_000.0) and b_ns == pytest.approx((1 << 30) / 300e9 * 1e9)


def test_a_fitted_reference_is_left_alone(tmp_path):
    store = Store(tmp_path / "s")
    rows = [(1 << p, 20.0 + (1 << p) / 200e3) for p in range(10, 31, 2)]  # many sizes: an ok fit
    ingest_paths([_log(tmp_path / "fit_allreduce.log", 1, 8, rows)], store, run_id="fit")
    got = _verdicts(store)
    assert {r[2] for r in got} == {"nccl_tests"} and {r[3] for r in got} == {None}


def test_measured_vs_model_call_terms_follow_the_same_rule():
    from tracekit.analyses.measured_vs_model import _call_terms

    # a preset reference with its device and node count: NCCL's tree/LL of the first test
    a, b = _call_terms("all_reduce", 8, 2048, (5e-6, 40e9, "preset:ib_ndr", ("NVIDIA H100 80GB HBM3", 256, None)))
    assert a == pytest.approx(95.2e-6) and b == pytest.approx(8 / 10.2e9)
    # a fit (3 items) keeps the α–β ring: 2·2047·α + 2·2047/2048·D/β
    a, b = _call_terms("all_reduce", 8, 2048, (5e-6, 40e9, "nccl_tests:x"))
    assert a == pytest.approx(2 * 2047 * 5e-6) and b == pytest.approx(2 * 2047 / 2048 * 8 / 40e9)
    # a device NCCL's model does not know: the α–β line too
    a, _ = _call_terms("all_reduce", 8, 16, (5e-6, 40e9, "preset:x", ("Mystery GPU", 2, None)))
    assert a == pytest.approx(2 * 15 * 5e-6)


def test_report_names_the_nccl_pair(tmp_path):
    from tracekit.report.data import build_report

    store = Store(tmp_path / "s")
    ingest_paths([_log(tmp_path / "scale_allreduce.log", 256, 8, [(8, 130.0), (16, 131.0)])], store, run_id="scale")
    rep = build_report(store, "scale")
    (ref,) = [r for r in rep["references"] if r["op"] == "all_reduce"]
    assert ref["kind"] == "preset" and ref["nccl_algos"] == "tree/LL"
    assert ref["crossover_bytes"] == pytest.approx(95.2e-6 * 10.2e9)


def test_the_nics_the_log_names_feed_nccls_model(tmp_path):
    from tracekit.analyses._nccl_udfs import nccl_reference

    store = Store(tmp_path / "s")
    dev = "NVIDIA H100 80GB HBM3"
    rows = [(1 << 30, 30_000.0), (1 << 31, 60_000.0)]  # two sizes: no ok fit, the preset path
    plain = _log(tmp_path / "plain_allreduce.log", 2, 8, rows)
    nets = _log(tmp_path / "nets_allreduce.log", 2, 8, rows)
    # NCCL_DEBUG=INFO: each host's ranks use 2 IB NICs (the preset's default is one NIC per GPU, 8)
    nets.write_text(nets.read_text() + "".join(
        f"host{h:03d}:{1000 + 8 * h + g}:{1000 + 8 * h + g} [{g}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB "
        f"[1]mlx5_3:1/IB ; OOB ib0:10.0.0.{h + 1}<0>\n" for h in range(2) for g in range(8)))
    ingest_paths([plain], store, run_id="plain")
    ingest_paths([nets], store, run_id="nets")
    con = analyses.connect(store)
    assert con.execute("SELECT DISTINCT run_id, nics_per_node FROM group_machine ORDER BY 1").fetchall() == [
        ("nets", 2), ("plain", None)]
    got = dict(con.execute("SELECT run_id, ref_beta_term_ns FROM collective_verdicts WHERE size_bytes = ? "
                           "AND verdict_basis = 'preset'", [1 << 30]).fetchall())
    two, eight = nccl_reference("all_reduce", 1 << 30, 16, 2, dev, 2), nccl_reference("all_reduce", 1 << 30, 16, 2, dev, None)
    assert got["nets"] == pytest.approx(two.beta_term_s * 1e9)
    assert got["plain"] == pytest.approx(eight.beta_term_s * 1e9)
    assert got["nets"] > 2 * got["plain"]  # 2 NICs for 8 GPUs: the network share per GPU is a quarter


def test_a_busbw_no_algorithm_reaches_is_not_judged(tmp_path):
    # 8 H100 (NVLink4: 450 GB/s per direction): 1 GiB all-reduce in 1,000 µs is algbw 1,073.7 GB/s,
    # busbw × 2·7/8 = 1,879 GB/s > 2 × 450 (an in-switch reduction stays under 2 × the link): impossible;
    # 2,400 µs (busbw 783 GB/s: above the link, under 2 ×, algorithm unknown: NVLS could) is judged
    store = Store(tmp_path / "s")
    ingest_paths([_log(tmp_path / "fast_allreduce.log", 1, 8, [(1 << 30, 1000.0), (1 << 31, 4700.0)])], store,
                 run_id="fast")
    con = analyses.connect(store)
    rows = con.execute("SELECT size_bytes, verdict, efficiency, efficiency_link, verdict_basis, no_model_reason "
                       "FROM collective_verdicts ORDER BY size_bytes, seq").fetchall()
    busbw = (1 << 30) / 1000e-6 / 1e9 * 2 * 7 / 8
    assert busbw == pytest.approx(1879.05, abs=0.01)
    for size, verdict, eff, eff_link, basis, why in rows:
        if size == 1 << 30:
            assert (verdict, eff, eff_link, basis) == (None, None, None, None)
            assert why.startswith("busbw 1879.0 GB/s is above the device's fastest link (450.0 GB/s)")
        else:
            assert verdict == "bandwidth-bound" and eff is not None and why is None


def test_an_impossible_span_in_an_nsys_job_is_not_judged(tmp_path):
    from tests.conftest import FIXTURES

    # fixtures/nsys_job/job_2proc.sqlite: a 1 MiB all-reduce whose kernels span 100 ns (10,486 GB/s busbw)
    store = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "nsys_job" / "job_2proc.sqlite"], store, run_id="nsys")
    con = analyses.connect(store)
    got = dict(con.execute("SELECT op, efficiency FROM collective_verdicts").fetchall())
    assert got["all_reduce"] is None and got["all_to_all"] == pytest.approx(23.6228, rel=1e-4)
