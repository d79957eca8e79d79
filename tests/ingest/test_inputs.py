"""Input classes of issue 16 (items 3 and 4): CPU-only traces and their CPU-side collectives,
same-stream kernel overlap on devices with programmatic dependent launch.

Expected values are computed by hand in fixtures/inputs/NOTE.md.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tests.conftest import FIXTURES, TRACES
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.ingest.linkpass import supports_pdl
from tracekit.report.data import build_report, print_report
from tracekit.store import Store

US = 1000  # ns
T0 = 1_000_000 * US


def _store(tmp_path, *paths) -> Store:
    store = Store(tmp_path / "s")
    ingest_paths(list(paths), store, run_id="r")
    return store


@pytest.fixture(scope="module")
def cpu_nccl(tmp_path_factory):
    store = _store(tmp_path_factory.mktemp("cpu_nccl"), FIXTURES / "inputs" / "cpu_nccl_2rank")
    return store, analyses.connect(store)


def test_cpu_side_calls_are_collectives(cpu_nccl):
    _, con = cpu_nccl
    rows = con.execute("SELECT rank, seq, op, pg_name, size_bytes, meta_source, cpu_side, ts_ns, dur_ns "
                       "FROM collectives ORDER BY pg_name, seq, rank").fetchall()
    assert rows == [
        (0, 0, "all_reduce", "0", 4096, "record_param_comms", True, T0 + 100 * US, 200 * US),
        (1, 0, "all_reduce", "0", 4096, "record_param_comms", True, T0 + 150 * US, 150 * US),
        (0, 1, "all_reduce", "0", 2048, "cpu_op_dims", True, T0 + 400 * US, 20 * US),
        (1, 1, "all_reduce", "0", 2048, "cpu_op_dims", True, T0 + 380 * US, 45 * US),
        (0, 0, "send", "p2p:0->1", 32768, "cpu_op_dims", True, T0 + 500 * US, 40 * US),
        (1, 0, "recv", "p2p:0->1", 32768, "cpu_op_dims", True, T0 + 480 * US, 60 * US),
    ]
    assert con.execute("SELECT rank, peer, wire_bytes FROM collectives WHERE peer IS NOT NULL ORDER BY rank"
                       ).fetchall() == [(0, 1, 32768), (1, 0, 0)]
    # the calls are the outer ops; the ops inside them are neither comm nor compute
    got = con.execute("SELECT rank, name, class FROM events WHERE rank = 0 ORDER BY ts_ns, dur_ns DESC").fetchall()
    assert [(n, c) for _, n, c in got] == [
        ("ProfilerStep#1", "cpu"), ("aten::mm", "compute"), ("c10d::allreduce_", "comm"),
        ("record_param_comms", "cpu"), ("nccl:all_reduce", "cpu"), ("aten::empty", "cpu"),
        ("aten::add", "compute"), ("c10d::wait", "cpu"), ("nccl:all_reduce", "comm"),
        ("c10d::send", "comm"), ("nccl:send", "cpu"),
    ]


def test_cpu_side_instances_waits_and_overlap(cpu_nccl):
    _, con = cpu_nccl
    assert con.execute("SELECT pg_name, seq, sync_time_ns, skew_ns, straggler, complete FROM collective_instances "
                       "ORDER BY pg_name, seq").fetchall() == [
        # NCCL calls on the CPU only enqueue GPU work: no transfer time (sync NULL; NOTE.md's 150, 22.5
        # and 40 µs are the calls' spans after the last arrival, not transfers)
        ("0", 0, None, 50 * US, 1, True), ("0", 1, None, 20 * US, 0, True),
        ("p2p:0->1", 0, None, 20 * US, 0, True)]
    assert con.execute("SELECT pg_name, seq, rank, wait_ns FROM collective_waits ORDER BY ALL").fetchall() == [
        ("0", 0, 0, 50 * US), ("0", 0, 1, 0), ("0", 1, 0, 0), ("0", 1, 1, 20 * US),
        ("p2p:0->1", 0, 0, 0), ("p2p:0->1", 0, 1, 20 * US)]
    assert con.execute("SELECT rank, comm_ns, compute_ns, overlap_ns FROM overlap_by_rank ORDER BY rank").fetchall() == [
        (0, 260 * US, 100 * US, 60 * US), (1, 255 * US, 40 * US, 0)]


def test_cpu_compute_excludes_ops_blocked_in_a_collective(tmp_path):
    """cpu_gloo_tp_2rank (NOTE.md): ReduceFromTP encloses a blocking all-reduce call and its
    c10d::wait, so it is no compute (before: 300 µs of compute hiding the whole TP all-reduce);
    the ops it runs outside the call stay compute, and the async all-reduce keeps its overlap
    with the aten::mm before its wait."""
    con = analyses.connect(_store(tmp_path, FIXTURES / "inputs" / "cpu_gloo_tp_2rank"))
    got = con.execute("SELECT name, ts_ns, class FROM events WHERE rank = 0 ORDER BY ts_ns, dur_ns DESC").fetchall()
    assert [(n, (t - T0) // US, c) for n, t, c in got] == [
        ("ProfilerStep#1", 0, "cpu"), ("aten::mm", 10, "compute"), ("ReduceFromTP", 120, "cpu"),
        ("aten::clone", 130, "compute"), ("c10d::allreduce_", 160, "cpu"), ("gloo:all_reduce", 170, "comm"),
        ("c10d::wait", 180, "cpu"), ("aten::add", 405, "compute"), ("aten::mm", 430, "compute"),
        ("c10d::allreduce_", 540, "cpu"), ("gloo:all_reduce", 555, "comm"), ("aten::mm", 560, "compute"),
        ("c10d::wait", 660, "cpu"),
    ]
    want = [(0, 365 * US, 330 * US, 100 * US, 265 * US), (1, 225 * US, 400 * US, 40 * US, 185 * US)]
    for view in ("overlap_by_rank", "overlap_by_step"):
        assert con.execute(f"SELECT rank, comm_ns, compute_ns, overlap_ns, exposed_comm_ns FROM {view} "
                           "ORDER BY rank").fetchall() == want
    # per call: the blocking (TP-like) all-reduce fully exposed, the async one hidden while aten::mm runs
    assert con.execute("SELECT rank, (ts_ns - ?) // 1000, dur_ns // 1000, overlap_ns // 1000 FROM collective_overlap "
                       "ORDER BY rank, ts_ns", [T0]).fetchall() == [
        (0, 170, 220, 0), (0, 555, 145, 100), (1, 310, 80, 0), (1, 555, 145, 40)]


def test_cpu_only_report_says_so(cpu_nccl):
    store, _ = cpu_nccl
    rep = build_report(store, "r")
    assert rep["cpu_side"] == {"cpu_only_ranks": [0, 1], "cpu_side_calls": 6, "same_stream_overlaps": {}}
    assert [r["gpu_events"] for r in rep["ranks"]] == [0, 0]
    assert not any("no communication" in w for w in rep["warnings"])
    assert rep["gpu_time_breakdown"] == {"by_rank": [], "by_step": []}  # no GPU: no GPU time at all
    out = io.StringIO()
    print_report(rep, Console(file=out, width=100))
    text = out.getvalue()
    assert "ranks 0, 1: no GPU activity in the trace; compute = CPU op time, not GPU compute" in text
    assert "6 CPU-side collective call(s), no GPU kernel: span = the CPU call" in text
    assert "CPU compute ms" in text


def test_gloo_and_gpu_collectives_cpu_side_flag(tmp_path):
    """The gloo fixture's collectives are its gloo spans (cpu_side); a GPU trace's kernels are not."""
    con = analyses.connect(_store(tmp_path / "g", FIXTURES / "tp_2rank"))
    assert con.execute("SELECT count(*) > 0, bool_and(cpu_side) FROM collectives").fetchone() == (True, True)
    assert con.execute("SELECT min(gpu_events) FROM ranks").fetchone() == (0,)
    con = analyses.connect(_store(tmp_path / "k", FIXTURES / "handmade" / "two_rank"))
    assert con.execute("SELECT count(*) > 0, bool_or(cpu_side) FROM collectives").fetchone() == (True, False)
    assert con.execute("SELECT min(gpu_events) > 0 FROM ranks").fetchone() == (True,)


@pytest.mark.parametrize("device, overlaps, k1_ns, clipped", [("h100", 2, 10 * US, 0), ("v100", 1, 8 * US, 1)])
def test_same_stream_overlap(tmp_path, device, overlaps, k1_ns, clipped):
    store = _store(tmp_path, FIXTURES / "inputs" / f"stream_overlap_{device}.json")
    con = analyses.connect(store)
    n, warnings = con.execute("SELECT same_stream_overlaps, warnings FROM ranks").fetchone()
    assert n == overlaps
    assert con.execute("SELECT dur_ns FROM events WHERE name = 'k1'").fetchone() == (k1_ns,)
    assert con.execute("SELECT count(*) FILTER (WHERE clipped) FROM events").fetchone() == (clipped,)
    clip_warnings = [w for w in warnings if "clipped" in w]
    if clipped:
        assert clip_warnings == [
            "1 GPU event(s) overlapped the next on their stream by more than 100 ns and were clipped to its start "
            "(largest cut 2.000 µs; a clock defect: the device is not known to run programmatic dependent launch, "
            "sm_90+)"]
    else:
        assert clip_warnings == []
    # the union counts the overlap once: [0, 22.95] µs
    assert con.execute("SELECT compute_ns FROM overlap_by_rank").fetchone() == (22_950,)


@pytest.mark.parametrize("props, pdl", [
    ([{"name": "NVIDIA H100 80GB HBM3"}], True),
    ([{"name": "NVIDIA H100 PCIe"}], True),
    ([{"name": "NVIDIA GH200 480GB"}], True),
    ([{"name": "NVIDIA B200"}], True),
    ([{"name": "NVIDIA GB200"}], True),
    ([{"name": "Tesla V100-SXM2-32GB"}], False),
    ([{"name": "NVIDIA A100-SXM4-80GB"}], False),
    ([{"name": "Handmade GPU"}], False),
    ([{"name": "some GPU", "computeMajor": 9}], True),
    ([{"name": "NVIDIA H100 80GB HBM3", "computeMajor": 8}], False),  # the recorded capability decides
    ([{"name": "AMD Instinct MI300X", "computeMajor": 9}], False),  # gfx942: not NVIDIA's sm_90
    ([{"name": "NVIDIA B200"}, {"name": "Tesla V100-SXM2-32GB"}], False),
    ([], False), (None, False), ("NVIDIA H100", False),
])
def test_supports_pdl(props, pdl):
    assert supports_pdl(props) is pdl


def test_b200_trace_overlaps_counted_not_clipped(tmp_path):
    """tracelens_b200_r0of8 (B200, sm_100): 74 kernels ran into the next one on their stream (PDL);
    before, 74 were clipped with a warning; now none is, and the 74 are counted."""
    src = TRACES / "tracelens_b200_r0of8"
    if not src.exists():
        pytest.skip("../shared/traces is not available")
    con = analyses.connect(_store(tmp_path, src))
    n, warnings = con.execute("SELECT same_stream_overlaps, warnings FROM ranks").fetchone()
    assert n == 74
    assert not [w for w in warnings if "clipped" in w]
    assert con.execute("SELECT count(*) FILTER (WHERE clipped) FROM events").fetchone() == (0,)
