"""Kernel summary and GPU time by launcher (analyses/kernel_summary.sql): golden rows on the
hand-made trace (fixtures/handmade/NOTE.md, "gpu_breakdown/"), and on param_dlrm_8rank_v100
totals against an independent pandas computation over the events table."""

from __future__ import annotations

import pandas as pd
import pytest

from tracekit import analyses

GEMM_A, NCCL = "sm90_gemm_a", "ncclDevKernel_AllReduce_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.fixture(scope="module")
def con(session_store):
    c = analyses.connect(session_store("gb"))
    yield c
    c.close()


def test_kernel_summary_golden(con):
    rows = con.execute("SELECT class, name, class_rank, count, total_ns, p50_ns, p95_ns, max_ns, step_total_ns "
                       "FROM kernel_summary ORDER BY class, class_rank").fetchall()
    assert rows == [
        # the two all-reduces: 30,000 and 15,000 ns; quantile_disc: p50 = the lower middle (15,000), p95 = 30,000
        ("comm", NCCL, 1, 2, 45_000, 15_000, 30_000, 30_000, 45_000),
        ("compute", GEMM_A, 1, 1, 20_000, 20_000, 20_000, 20_000, 20_000),
        ("compute", "sm90_gemm_b", 2, 1, 14_980, 14_980, 14_980, 14_980, 14_980),
        ("compute", "sm90_gemm_c", 3, 1, 10_000, 10_000, 10_000, 10_000, 10_000),  # ties by name
        ("compute", "sm90_gemm_d", 4, 1, 10_000, 10_000, 10_000, 10_000, 10_000),
        ("memory", "Memcpy HtoD (Pageable -> Device)", 1, 1, 5_000, 5_000, 5_000, 5_000, 5_000),
        ("memory", "Memset (Device)", 2, 1, 1_000, 1_000, 1_000, 1_000, 1_000),
        ("sync", "Stream Sync", 1, 1, 2_000, 2_000, 2_000, 2_000, 2_000),
    ]
    # step windows: 86,000 + 20,000 ns (gpu_time_breakdown); the all-reduces' share 45,000 / 106,000
    (share,) = con.execute("SELECT step_share FROM kernel_summary WHERE class = 'comm'").fetchone()
    assert share == pytest.approx(45_000 / 106_000, rel=1e-12)


def test_launchers_golden(con):
    rows = con.execute("SELECT launcher_kind, launcher, gpu_ops, gpu_total_ns, compute_ns, comm_ns "
                       "FROM gpu_time_by_launcher ORDER BY launcher_kind, launcher NULLS LAST").fetchall()
    assert rows == [
        # fwd [0.5, 60) µs encloses launches 1..5: gemm_a, all-reduce, memcpy, gemm_b, memset
        ("annotation", "bwd", 2, 25_000, 10_000, 15_000),
        ("annotation", "fwd", 5, 70_980, 34_980, 30_000),
        ("annotation", None, 2, 12_000, 10_000, 0),  # gemm_c (launched at 75, outside fwd) and the sync (no launch)
        # launch 4 is inside aten::add inside aten::linear: the innermost wins; launch 5 only in aten::linear
        ("cpu_op", "aten::add", 1, 14_980, 14_980, 0),
        ("cpu_op", "aten::linear", 1, 1_000, 0, 0),
        ("cpu_op", "aten::mm", 1, 20_000, 20_000, 0),
        ("cpu_op", "aten::mul", 1, 15_000, 0, 15_000),
        ("cpu_op", None, 5, 57_000, 20_000, 30_000),
    ]
    # each kind sums to every GPU op's duration once: 107,980 ns
    assert con.execute("SELECT launcher_kind, sum(gpu_total_ns)::BIGINT, sum(share) FROM gpu_time_by_launcher "
                       "GROUP BY 1 ORDER BY 1").fetchall() == [("annotation", 107_980, pytest.approx(1.0)),
                                                                ("cpu_op", 107_980, pytest.approx(1.0))]


def test_dlrm_totals_and_launchers_match_pandas(session_store):
    c = analyses.connect(session_store("dlrm"))
    ev = c.execute("SELECT rank, event_id, track_kind, track, category, class, name, ts_ns, dur_ns, step, "
                   "launch_event_id FROM events").df()
    gpu = ev[ev.track_kind == "gpu_stream"]
    # kernel_summary: count and total per (class, name) equal a pandas group-by
    want = gpu.groupby(["class", "name"]).dur_ns.agg(["count", "sum"])
    got = c.execute("SELECT class, name, count, total_ns FROM kernel_summary").df().set_index(["class", "name"])
    assert len(got) == len(want) > 50
    assert (got.loc[want.index, "count"].to_numpy() == want["count"].to_numpy()).all()
    assert (got.loc[want.index, "total_ns"].to_numpy() == want["sum"].to_numpy()).all()
    assert int(got.total_ns.sum()) == int(gpu.dur_ns.sum())
    # gpu_launchers: the innermost enclosing cpu_op by brute force (every op on the launch's thread)
    cpu = ev[(ev.track_kind == "cpu_thread") & (ev.category == "cpu_op") & (ev.dur_ns > 0)]
    by_thread = {k: g for k, g in cpu.groupby(["rank", "track"])}
    launch = ev.set_index(["rank", "event_id"])
    expect = {}
    for r in gpu.itertuples():
        name = None
        if not pd.isna(r.launch_event_id):
            lr = launch.loc[(r.rank, int(r.launch_event_id))]
            ops = by_thread.get((r.rank, lr.track))
            if ops is not None:
                t, te = lr.ts_ns, lr.ts_ns + lr.dur_ns
                enc = ops[(ops.ts_ns <= t) & (ops.ts_ns + ops.dur_ns >= te)]
                if len(enc):
                    enc = enc.assign(neg_e=-(enc.ts_ns + enc.dur_ns)).sort_values(["ts_ns", "neg_e", "event_id"])
                    name = enc.iloc[-1]["name"]
        expect[(r.rank, r.event_id)] = name
    got = {(r, e): n for r, e, n in c.execute("SELECT rank, event_id, cpu_op FROM gpu_launchers").fetchall()}
    assert got == expect
    attributed = sum(v is not None for v in expect.values())
    assert attributed >= 0.9 * len(expect)  # DLRM links every kernel through cudaLaunchKernel to an op
    per_kind = c.execute("SELECT launcher_kind, sum(gpu_total_ns)::BIGINT FROM gpu_time_by_launcher GROUP BY 1").fetchall()
    assert dict(per_kind) == {"cpu_op": int(gpu.dur_ns.sum()), "annotation": int(gpu.dur_ns.sum())}
    c.close()


def test_report_sections_and_figure(con):
    import io

    from rich.console import Console

    from tracekit.report.html import kernel_figure
    from tracekit.report.data import build_report, print_report

    rep = build_report(run_id="gb", con=con)
    assert [(r["class"], r["name"], r["total_ns"]) for r in rep["kernel_summary"]][:2] == [
        ("comm", NCCL, 45_000), ("compute", GEMM_A, 20_000)]
    assert len(rep["kernel_summary"]) == 8  # every op: at most 5 per class here
    # the unattributed rows are kept beside the top launchers
    assert [(r["launcher_kind"], r["launcher"], r["gpu_total_ns"]) for r in rep["gpu_time_by_launcher"]] == [
        ("annotation", "fwd", 70_980), ("annotation", "bwd", 25_000), ("annotation", None, 12_000),
        ("cpu_op", "aten::mm", 20_000), ("cpu_op", "aten::mul", 15_000), ("cpu_op", "aten::add", 14_980),
        ("cpu_op", "aten::linear", 1_000), ("cpu_op", None, 57_000)]
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=250))
    text = buf.getvalue()
    assert "Top GPU ops per class" in text and "GPU time by the CPU op" in text
    assert "0.071" in next(l for l in text.splitlines() if " fwd " in f" {l} ").split()  # 70,980 ns in ms
    fig = kernel_figure({"report": rep})
    assert list(fig.data[0].x)[-1] == pytest.approx(45.0)  # largest bar: the all-reduces, 45 µs
    assert list(fig.data[1].y) == ["(none)", "bwd", "fwd"]
