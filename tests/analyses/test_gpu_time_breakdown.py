"""GPU time breakdown (analyses/gpu_time_breakdown.py) on a hand-made trace, every number worked
out by hand in fixtures/handmade/NOTE.md ("gpu_breakdown/"), and its identities on real traces."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import FIXTURES, REPO, shared_trace
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

PARTS = ("compute_only_ns", "comm_exposed_ns", "comm_hidden_ns", "memory_ns", "sync_ns", "other_ns", "idle_ns")
COLS = ("grp", "window_start_ns", "window_end_ns", "window_ns") + PARTS + (
    "idle_host_wait_ns", "idle_kernel_wait_ns", "idle_other_ns")


@pytest.fixture(scope="module")
def con(session_store):
    c = analyses.connect(session_store("gb"))
    yield c
    c.close()


def test_breakdown_golden(con):
    rows = con.execute(f"SELECT {', '.join(COLS)} FROM gpu_time_breakdown ORDER BY grp").fetchall()
    t0 = 1_000_000  # BASE = 1000 µs
    assert rows == [
        # whole trace [10, 170) µs: compute only 34,980 + 5,000; hidden 10,000 + 5,000; exposed 20,000 + 10,000;
        # memory 6,000; sync 2,000; idle 13,020 + 54,000 (= host 10,000 + 54,000, kernel 20, other 3,000)
        (-1, t0 + 10_000, t0 + 170_000, 160_000, 39_980, 30_000, 15_000, 6_000, 2_000, 0, 67_020, 64_000, 20, 3_000),
        # step 1 [10, 96) µs
        (1, t0 + 10_000, t0 + 96_000, 86_000, 34_980, 20_000, 10_000, 6_000, 2_000, 0, 13_020, 10_000, 20, 3_000),
        # step 2 [150, 170) µs
        (2, t0 + 150_000, t0 + 170_000, 20_000, 5_000, 10_000, 5_000, 0, 0, 0, 0, 0, 0, 0),
    ]
    (frac,) = con.execute("SELECT idle_fraction FROM gpu_time_breakdown WHERE grp = -1").fetchone()
    assert frac == pytest.approx(67_020 / 160_000, rel=1e-12)


def test_idle_gaps_classes(con):
    rows = con.execute("SELECT s, e, idle_ns, launch_ts_ns, idle_class FROM gpu_idle_gaps WHERE grp = 1 ORDER BY s").fetchall()
    t0 = 1_000_000
    assert rows == [
        (t0 + 55_000, t0 + 55_020, 20, t0 + 4_000, "kernel_wait"),  # launched before the gap, 20 ns < 30 ns
        (t0 + 70_000, t0 + 80_000, 10_000, t0 + 75_000, "host_wait"),  # launched inside the gap
        (t0 + 92_000, t0 + 95_000, 3_000, t0 + 5_000, "other"),  # launched long before, 3 µs gap
    ]


def test_hidden_plus_exposed_is_overlap_windows_comm(con):
    # an independent path: overlap_windows' sweep (tracekit/timeline/intervals.py) over the same GPU events
    got = con.execute(
        "SELECT b.grp, b.comm_hidden_ns + b.comm_exposed_ns, o.comm_ns, b.comm_hidden_ns, o.overlap_ns, "
        "       b.compute_only_ns + b.comm_hidden_ns, o.compute_ns "
        "FROM gpu_time_breakdown b JOIN overlap_windows o USING (run_id, rank, grp) ORDER BY b.grp").fetchall()
    assert len(got) == 3
    for grp, comm, o_comm, hidden, o_overlap, compute, o_compute in got:
        assert (comm, hidden, compute) == (o_comm, o_overlap, o_compute), grp


def _independent(events):
    """Per (rank, grp): the seven parts and the window, computed another way than the SQL: the
    elementary segments between sorted boundaries, each tested for coverage per class by binary
    search (numpy), then labelled by the module's rules."""
    import numpy as np

    out = {}
    for key, g in events.groupby(["rank", "grp"]):
        s = g["s"].to_numpy(np.int64)
        e = g["e"].to_numpy(np.int64)
        cls = g["class"].to_numpy()
        t = np.unique(np.concatenate([s, e]))
        mid_lo, mid_hi = t[:-1], t[1:]
        cover = {}
        for c in ("compute", "comm", "memory", "sync"):
            m = cls == c
            cover[c] = _covered(s[m], e[m], mid_lo)
        cover["other"] = _covered(s[~np.isin(cls, ["compute", "comm", "memory", "sync"])],
                                  e[~np.isin(cls, ["compute", "comm", "memory", "sync"])], mid_lo)
        length = mid_hi - mid_lo
        hid = cover["comm"] & cover["compute"]
        comp = cover["compute"] & ~cover["comm"]
        exp = cover["comm"] & ~cover["compute"]
        rest = ~(cover["comm"] | cover["compute"])
        mem = rest & cover["memory"]
        syn = rest & ~cover["memory"] & cover["sync"]
        oth = rest & ~cover["memory"] & ~cover["sync"] & cover["other"]
        idle = rest & ~cover["memory"] & ~cover["sync"] & ~cover["other"]
        out[key] = tuple(int(length[m].sum()) for m in (comp, exp, hid, mem, syn, oth, idle)) + (int(t[-1] - t[0]),)
    return out


def _covered(s, e, points):
    """For each point p: is p inside some [s, e)? (count of starts <= p minus count of ends <= p > 0)."""
    import numpy as np

    return (np.searchsorted(np.sort(s), points, side="right") - np.searchsorted(np.sort(e), points, side="right")) > 0


def test_real_trace_parts_sum_and_match_an_independent_sweep(session_store):
    c = analyses.connect(session_store("dlrm"))
    ev = c.execute(
        "SELECT rank, -1::BIGINT AS grp, class, ts_ns AS s, ts_ns + dur_ns AS e FROM events "
        "WHERE track_kind = 'gpu_stream' AND dur_ns > 0 "
        "UNION ALL SELECT rank, step, class, ts_ns, ts_ns + dur_ns FROM events "
        "WHERE track_kind = 'gpu_stream' AND dur_ns > 0 AND step IS NOT NULL").df()
    want = _independent(ev)
    rows = c.execute(f"SELECT rank, grp, {', '.join(PARTS)}, window_ns, idle_host_wait_ns, idle_kernel_wait_ns, "
                     "idle_other_ns FROM gpu_time_breakdown").fetchall()
    assert len(rows) == len(want) >= 8
    for r in rows:
        rank, grp, *parts, window, hw, kw, ot = r
        assert sum(parts) == window, (rank, grp)
        assert hw + kw + ot == parts[-1], (rank, grp)
        assert tuple(parts) + (window,) == want[(rank, grp)], (rank, grp)
    c.close()


def test_the_sweep_in_small_chunks_gives_the_same_tables(tmp_path, monkeypatch):
    """Windows swept a few spans at a time (CHUNK_SPANS = 5: many chunks, a window larger than a
    chunk alone), at ingest (in this process, jobs=1, so the patched size applies) and by
    gpu_launchers from the events, give the same rows as the default chunks."""
    import tracekit.timeline.gpu as gtb

    def tables(name):
        store = Store(tmp_path / name)
        ingest_paths([shared_trace("param_dlrm_8rank_v100")], store, run_id="dlrm", jobs=1)
        c = analyses.connect(store)
        out = {t: c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
               for t in ("gpu_time_breakdown", "gpu_idle_gaps", "gpu_launchers")}
        c.close()
        return out

    whole = tables("whole")
    monkeypatch.setattr(gtb, "CHUNK_SPANS", 5)
    assert tables("small") == whole
    assert len(whole["gpu_time_breakdown"]) > 4 and len(whole["gpu_idle_gaps"]) > 10


HTA_PY = REPO / ".venv-hta" / "bin" / "python"


def test_whole_trace_agrees_with_hta_temporal_breakdown(tmp_path):
    """HTA 0.5's get_temporal_breakdown (benchmarks/hta_breakdown.py, HTA's defaults) against
    grp = -1 on param_dlrm_8rank_v100, every rank, exactly (HTA reports whole µs; this trace's
    timestamps are whole µs). HTA's columns map to ours as
        kernel_time      = window_ns (first GPU op start to last GPU op end),
        idle_time        = idle_ns,
        compute_time     = compute_only_ns + comm_hidden_ns (|∪ compute|),
        non_compute_time = comm_exposed_ns + memory_ns + sync_ns + other_ns.
    Differences of definition, none of which is active on this trace:
      - HTA classes kernels by name (``nccl`` → communication, memcpy/memset → memory, the rest
        computation); tracekit by metadata first, then name: the same 64 NCCL kernels here;
      - HTA counts every event with a stream arg (a cuda_sync included) as GPU work; tracekit every
        event on a GPU track with dur > 0: the trace has no sync events and no zero-length GPU ops;
      - HTA rounds float timestamps to whole µs (start up, end down) and by default drops GPU work
        launched in the last ProfilerStep: the timestamps are integers and there is one step;
      - HTA gives no per-step rows and no split of non-compute time; its idle-time breakdown (host
        wait / kernel wait / other) is per stream, ours on the rank's union of streams (so a gap on
        one stream covered by another stream's work is not idle here), and is not compared.
    """
    src = shared_trace("param_dlrm_8rank_v100")
    if not HTA_PY.exists():
        pytest.skip(f"HTA environment {HTA_PY.parent.parent} is absent (make it with: bash benchmarks/setup_hta.sh)")
    links = tmp_path / "traces"
    links.mkdir()
    for f in sorted(src.iterdir()):
        (links / f.name).symlink_to(f)
    proc = subprocess.run([str(HTA_PY), str(REPO / "benchmarks" / "hta_breakdown.py"), str(links)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    hta = {int(k): v for k, v in json.loads(proc.stdout).items()}
    store = Store(tmp_path / "s")
    ingest_paths([src], store, run_id="dlrm")
    c = analyses.connect(store)
    ours = {r[0]: r[1:] for r in c.execute(
        "SELECT rank, window_ns, idle_ns, compute_only_ns + comm_hidden_ns, "
        "comm_exposed_ns + memory_ns + sync_ns + other_ns FROM gpu_time_breakdown WHERE grp = -1").fetchall()}
    c.close()
    assert sorted(hta) == sorted(ours) == list(range(8))
    for rank, h in hta.items():
        want = tuple(round(h[k] * 1000) for k in ("kernel_us", "idle_us", "compute_us", "non_compute_us"))
        assert ours[rank] == want, rank


def test_report_json_and_terminal_sections(con, tmp_path, capsys):
    import io

    from rich.console import Console

    from tracekit.cli import main
    from tracekit.report.data import build_report, print_report

    rep = build_report(run_id="gb", con=con)
    sec = rep["gpu_time_breakdown"]
    assert [(r["rank"], r["window_ns"], r["idle_ns"], r["idle_host_wait_ns"]) for r in sec["by_rank"]] == [
        (0, 160_000, 67_020, 64_000)]
    assert [(r["step"], r["window_ns"], r["comm_exposed_ns"]) for r in sec["by_step"]] == [(1, 86_000, 20_000),
                                                                                          (2, 20_000, 10_000)]
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=250))
    text = buf.getvalue()
    assert "GPU time per rank" in text
    # rank 0's row: window 0.160 ms, compute only 39,980 / 160,000 = 25.0 %, idle 67,020 / 160,000 = 41.9 %
    line = next(l for l in text.splitlines() if "0.160" in l)
    assert "25.0%" in line and "41.9%" in line
    # its idle classes, a table of their own: idle 0.067 ms, of which host wait 0.064 ms
    idle = text[text.index("GPU idle time per rank"):].splitlines()
    row = next(l for l in idle if l.split()[:1] == ["0"])
    assert row.split()[:3] == ["0", "0.067", "0.064"]


def test_html_section_renders_in_chromium(session_store, tmp_path):
    """The GPU breakdown figure on the hand-made run: stacked parts whose heights are the windows;
    it and the kernel summary's figure drawn by plotly in headless Chromium (skips like the report
    test without chromium)."""
    from tests.report.test_html_report import _run_chromium
    from tracekit.report.html import gpu_breakdown_figure, html_data, write_html_report

    store = session_store("gb")
    fig = gpu_breakdown_figure(html_data(store, "gb"))
    whole = [t for t in fig.data if t.xaxis == "x"]
    # the nine stacked parts of rank 0's whole-trace bar sum to its window, 160,000 ns = 160 µs
    assert len(whole) == 9 and sum(t.y[0] for t in whole) == pytest.approx(160.0)
    assert [t.name for t in whole if t.y[0]] == ["compute only", "comm hidden by compute", "comm exposed",
                                                  "memcpy/memset", "sync", "idle: host wait", "idle: kernel wait",
                                                  "idle: other"]
    page = write_html_report(store, tmp_path / "gb.html", run_id="gb")
    dom, log = _run_chromium(page, tmp_path, None)
    for name in ("gpu-breakdown", "kernels"):  # this breakdown and the kernel summary's figure
        sec = dom.split(f'id="tk-sec-{name}"', 1)[1].split("</section>", 1)[0]
        assert f'id="tk-fig-{name}"' in sec and 'class="main-svg"' in sec, name
    assert "Uncaught" not in log


def test_gpu_annotation_ranges_are_not_gpu_work(con, tmp_path):
    """Kineto draws record_function ranges on the GPU track too (cat gpu_user_annotation), spanning
    the work they name: the fixture with one such range over [5, 200) µs on its compute stream has
    the same breakdown (no 'other', the same idle) and no annotation among the GPU ops."""
    doc = json.loads((FIXTURES / "handmade" / "gpu_breakdown" / "rank0.json").read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "model_forward", "pid": 0, "tid": 13,
                   "ts": 1005.0, "dur": 195.0, "args": {"device": 0, "stream": 13}})
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "rank0.json").write_text(json.dumps(doc))
    store = Store(tmp_path / "s")
    ingest_paths([tmp_path / "t"], store, run_id="ann")
    c = analyses.connect(store)
    try:
        with_ann = c.execute(f"SELECT {', '.join(COLS)} FROM gpu_time_breakdown ORDER BY grp").fetchall()
        names = [r[0] for r in c.execute("SELECT name FROM kernel_summary").fetchall()]
        n_ann = c.execute("SELECT count(*) FROM events WHERE category = 'gpu_user_annotation'").fetchone()[0]
    finally:
        c.close()
    assert n_ann == 1 and "model_forward" not in names
    assert with_ann == con.execute(f"SELECT {', '.join(COLS)} FROM gpu_time_breakdown ORDER BY grp").fetchall()


def _three_ranks(tmp_path):
    """fixtures/handmade/gpu_breakdown as rank 0 of 3; rank 1 the same ops 1 µs later on other
    streams (21, 9), its CPU ops and annotations renamed "<name>@1"; rank 2 its CPU events only."""
    src = json.loads((FIXTURES / "handmade" / "gpu_breakdown" / "rank0.json").read_text())
    d = tmp_path / "job"
    d.mkdir()
    for rank in range(3):
        doc = json.loads(json.dumps(src))
        doc["distributedInfo"].update(rank=rank, world_size=3)
        evs = []
        for ev in doc["traceEvents"]:
            gpu = ev.get("pid") == 0
            if rank == 2 and gpu:
                continue
            if rank == 1:
                ev["ts"] += 1  # so that rank 0's aten::add, aten::linear enclose its launch 3
                if gpu and "stream" in ev.get("args", {}):
                    ev["tid"] = ev["args"]["stream"] = {13: 21, 7: 9}[ev["args"]["stream"]]
                if ev.get("cat") in ("cpu_op", "user_annotation") and not ev["name"].startswith("ProfilerStep#"):
                    ev["name"] += "@1"
            evs.append(ev)
        doc["traceEvents"] = evs
        (d / f"rank{rank}.json").write_text(json.dumps(doc))
    return d


def test_ranks_swept_together_keep_to_their_own_rank(tmp_path, monkeypatch):
    """All ranks of a chunk are swept and searched at once: a rank shifted in time on other streams
    gets the hand-worked rows of rank 0 shifted (the gap [96, 150) µs straddling the step boundary
    included), its launchers only among its own CPU ranges, and a rank without GPU ops no rows; the
    same per-op tables as with every rank read from the events and swept alone (CHUNK_EVENTS = 1)."""
    import tracekit.analyses.gpu_launchers as gl

    store = Store(tmp_path / "s")
    ingest_paths([_three_ranks(tmp_path)], store, run_id="r3")

    def tables():
        c = analyses.connect(store)
        out = {t: c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
               for t in ("gpu_time_breakdown", "gpu_idle_gaps", "gpu_launchers")}
        out["rows"] = c.execute(f"SELECT rank, {', '.join(COLS)} FROM gpu_time_breakdown ORDER BY rank, grp").fetchall()
        out["names"] = c.execute("SELECT l.rank, l.cpu_op, l.annotation FROM gpu_launchers l "
                                 "JOIN events e USING (run_id, rank, event_id) ORDER BY l.rank, e.ts_ns").fetchall()
        c.close()
        return out

    got = tables()
    t0 = 1_000_000
    rank0 = [  # test_breakdown_golden's rows
        (-1, t0 + 10_000, t0 + 170_000, 160_000, 39_980, 30_000, 15_000, 6_000, 2_000, 0, 67_020, 64_000, 20, 3_000),
        (1, t0 + 10_000, t0 + 96_000, 86_000, 34_980, 20_000, 10_000, 6_000, 2_000, 0, 13_020, 10_000, 20, 3_000),
        (2, t0 + 150_000, t0 + 170_000, 20_000, 5_000, 10_000, 5_000, 0, 0, 0, 0, 0, 0, 0),
    ]
    rows = got["rows"]
    assert [r[0] for r in rows] == [0, 0, 0, 1, 1, 1]  # rank 2 (no GPU ops): no windows
    assert [r[1:] for r in rows[:3]] == rank0
    shift = rows[3][2] - rank0[0][1]  # rank 1 as stored (the ingest may align its clock to rank 0)
    assert shift in (0, 1_000)
    assert [r[1:] for r in rows[3:]] == [(g, s + shift, e + shift, *rest) for g, s, e, *rest in rank0]
    gaps = [r for r in got["gpu_idle_gaps"] if r[1] == 1 and r[2] == -1]
    assert [(r[3] - shift, r[4] - shift, r[7]) for r in gaps] == [
        (t0 + 55_000, t0 + 55_020, "kernel_wait"), (t0 + 70_000, t0 + 80_000, "host_wait"),
        (t0 + 92_000, t0 + 95_000, "other"), (t0 + 96_000, t0 + 150_000, "host_wait")]
    # per GPU op by start (NOTE.md's table): the innermost cpu_op and annotation around its launch
    # (fwd [0.5, 60), mm [0.8, 1.8), linear [3.5, 6), add [3.8, 4.8), bwd [100.5, 103), mul [101.8, 102.8))
    want = [("aten::mm", "fwd"), (None, "fwd"), (None, "fwd"), ("aten::add", "fwd"), (None, None),
            (None, None), ("aten::linear", "fwd"), (None, "bwd"), ("aten::mul", "bwd")]
    assert got["names"] == [(0, *w) for w in want] + [
        (1, *(None if x is None else x + "@1" for x in w)) for w in want]
    monkeypatch.setattr(gl, "CHUNK_EVENTS", 1)  # gpu_launchers and gpu_idle_gaps read a rank at a time
    alone = tables()
    assert alone == got
