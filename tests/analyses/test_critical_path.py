"""Critical path across ranks (analyses/critical_path.py).

1. A hand-built 2-rank trace (written here) whose path and composition are worked out by hand.
2. On one rank, the path is a longest path of the DAG built independently here (networkx's
   dag_longest_path_length) with edge weight ready − pred end + (node end − its latest ready):
   every path from a root to the last node weighs end − origin minus its non-binding slack, so
   the longest weighs exactly end − origin, and only a chain of latest-ready predecessors does.
3. The report section, the HTML figure and the Perfetto track.
4. The real 8-rank DLRM step (../shared/traces, skipped when absent), read as an engineer would:
   host-bound, every path crossing to the straggler collective_instances names.
"""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from tracekit import analyses
from tracekit.analyses import critical_path as cp
from tracekit.ingest import ingest_paths
from tracekit.store import Store

SHARED_DLRM = FIXTURES.parent.parent / "shared" / "traces" / "param_dlrm_8rank_v100"
BASE = 1000.0  # µs
NCCL = "ncclDevKernel_AllReduce_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _ev(cat, name, ts, dur, tid, pid=42, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(BASE + ts, 3),
            "dur": round(dur, 3), "args": args}


def _launch(ts, corr, name="cudaLaunchKernel", dur=0.5):
    return _ev("cuda_runtime", name, ts, dur, 100, correlation=corr)


def _kernel(name, ts, dur, corr, **meta):
    return _ev("kernel", name, ts, dur, 13, pid=0, device=0, stream=13, correlation=corr, **meta)


def _allreduce(ts, dur, corr):
    return _kernel(NCCL, ts, dur, corr, **{
        "Seq": 0, "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
        "In split size": "[]", "Out split size": "[]"})


def _write(path, rank, events):
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
           "traceEvents": [_ev("user_annotation", "ProfilerStep#1", 0, 100, 100), *events],
           "traceName": f"rank{rank}"}
    path.write_text(json.dumps(doc))


def make_two_rank(d):
    """Rank 0: gemm A [2, 12), all-reduce [12, 40) on one stream, the host syncs [4, 40.5) and
    launches gemm B at 41 (B runs [45, 55)). Rank 1 (the straggler): gemm C [2, 22), all-reduce
    [22, 38). µs after BASE."""
    d.mkdir()
    _write(d / "rank0.json", 0, [
        _launch(1, 1), _kernel("sm80_gemm_A", 2, 10, 1),
        _launch(3, 2), _allreduce(12, 28, 2),
        _launch(4, 0, "cudaStreamSynchronize", 36.5),
        _launch(41, 3), _kernel("sm80_gemm_B", 45, 10, 3)])
    _write(d / "rank1.json", 1, [
        _launch(1, 1), _kernel("sm80_gemm_C", 2, 20, 1),
        _launch(2, 2), _allreduce(22, 16, 2)])


@pytest.fixture(scope="module")
def two_rank_store(tmp_path_factory):
    base = tmp_path_factory.mktemp("cp")
    make_two_rank(base / "tr")
    store = Store(base / "store")
    ingest_paths([base / "tr"], store, run_id="tr")
    return store


@pytest.fixture(scope="module")
def two_rank(two_rank_store):
    con = analyses.connect(two_rank_store)
    yield con
    con.close()


US = 1000  # ns


def test_two_rank_path_by_hand(two_rank):
    rows = two_rank.execute("SELECT rank, pos, event_rank, name, class, on_path_ns, gap_ns, edge "
                            "FROM critical_path ORDER BY rank, pos").fetchall()
    # rank 0: B waited for its launch (41.5 > the all-reduce's end 40); the launch followed the
    # sync on the thread; the sync returned when the all-reduce ended (40); the all-reduce could
    # not end before rank 1 arrived at 22, so the path jumps to rank 1: its all-reduce started
    # when gemm C ended (stream order), C after its launch M1 [1, 1.5).
    assert [r for r in rows if r[0] == 0] == [
        (0, 0, 1, "cudaLaunchKernel", "cpu", 500, 0, "launch"),
        (0, 1, 1, "sm80_gemm_C", "compute", 20 * US, 500, "stream"),
        (0, 2, 1, NCCL, "comm", 0, 0, "collective"),
        (0, 3, 0, NCCL, "comm", 18 * US, 0, "sync"),  # [22, 40): after the last arrival
        (0, 4, 0, "cudaStreamSynchronize", "sync", 500, 0, "thread"),  # [40, 40.5)
        (0, 5, 0, "cudaLaunchKernel", "cpu", 500, 500, "launch"),  # [41, 41.5) after host code [40.5, 41)
        (0, 6, 0, "sm80_gemm_B", "compute", 10 * US, 3500, "end"),  # [45, 55) after idle [41.5, 45)
    ]
    assert [r for r in rows if r[0] == 1] == [
        (1, 0, 1, "cudaLaunchKernel", "cpu", 500, 0, "launch"),
        (1, 1, 1, "sm80_gemm_C", "compute", 20 * US, 500, "stream"),
        (1, 2, 1, NCCL, "comm", 16 * US, 0, "end"),  # rank 1 arrived last: [22, 38)
    ]
    cols = ["rank", "step", "length_ns", *cp.PARTS, "path_events", "other_ranks"]
    summ = two_rank.execute(f"SELECT {', '.join(cols)} FROM critical_path_summary ORDER BY rank").fetchall()
    # rank 0: [1, 55) = 54 µs = compute 10 + exposed comm 18 + memory 0 + launch/CPU 0.5 + 0.5
    # + sync 0.5 + straggler (rank 1: 0.5 + 0.5 + 20) 21 + idle 3.5
    assert summ[0] == (0, 1, 54 * US, 10 * US, 18 * US, 0, 1000, 500, 21 * US, 3500, 7, 1)
    # rank 1: [1, 38) = 37 µs = compute 20 + comm 16 + launch 0.5 + idle (launch → kernel) 0.5
    assert summ[1] == (1, 1, 37 * US, 20 * US, 16 * US, 0, 500, 0, 0, 500, 3, 0)
    for r in two_rank.execute("SELECT * FROM critical_path_summary").df().to_dict("records"):
        assert sum(r[p] for p in cp.PARTS) == r["length_ns"] == r["end_ns"] - r["start_ns"]


# --- one rank: agreement with an independent longest path --------------------------------------

def _independent_dag(ev):
    """networkx DiGraph of one rank's window from the events rows (dicts), built from the edge
    rules as the module's docstring states them (written again here, by sorting and bisect)."""
    import networkx as nx

    nodes = [e for e in ev if e["track_kind"] == "gpu_stream" or e["category"] == "runtime"
             or e["class"] in ("compute", "comm", "sync")]
    key = {e["event_id"]: (e["end"], e["ts_ns"], e["event_id"]) for e in nodes}
    by_id = {e["event_id"]: e for e in nodes}

    def latest(group, v, t):
        """ids in group ending last at or before t and ordered before v (ties all kept)."""
        ks = [key[u] for u in group if key[u] < key[v["event_id"]] and key[u][0] <= t]
        if not ks:
            return []
        best = max(k[0] for k in ks)
        return [k[2] for k in ks if k[0] == best]

    tracks, gpu, cpu = {}, [], []
    for e in nodes:
        tracks.setdefault((e["track_kind"], e["device"], e["track"]), []).append(e["event_id"])
        (gpu if e["track_kind"] == "gpu_stream" else cpu).append(e["event_id"])
    ready = {}  # (u, v) → ready time of v through u
    launched = {}  # blocking call → the GPU ops that ended inside it
    for v in nodes:
        vid, s = v["event_id"], v["ts_ns"]
        group = tracks[(v["track_kind"], v["device"], v["track"])]
        for u in latest(group, v, s) + latest(gpu if v["track_kind"] == "gpu_stream" else cpu, v, s):
            ready[(u, vid)] = by_id[u]["end"]
        call = by_id.get(v["launch_event_id"]) if v["track_kind"] == "gpu_stream" else None
        if call is not None:
            if call["ts_ns"] < v["end"] <= call["end"]:  # a blocking call: it waited for its op
                launched.setdefault(call["event_id"], []).append(v)
            else:
                ready[(call["event_id"], vid)] = min(call["end"], s)
        if v["track_kind"] != "gpu_stream" and v["class"] == "sync":
            ends = [by_id[g]["end"] for g in gpu if by_id[g]["end"] <= v["end"]]
            if ends and max(ends) > s:
                for g in gpu:
                    if by_id[g]["end"] == max(ends):
                        ready[(g, vid)] = max(ends)
    for cid, ops in launched.items():
        last = max(ops, key=lambda o: o["end"])
        ready[(last["event_id"], cid)] = last["end"]
    g = nx.DiGraph()
    origin = min(e["ts_ns"] for e in nodes)
    binding = {}
    for (u, v), r in ready.items():
        binding[v] = max(binding.get(v, r), r)
    for (u, v), r in ready.items():
        g.add_edge(u, v, weight=r - by_id[u]["end"] + by_id[v]["end"] - binding[v])
    for e in nodes:
        if e["event_id"] not in binding:
            g.add_edge("source", e["event_id"], weight=e["end"] - origin)
    return g, by_id, origin


def _check_one_rank(con, run_id, exact):
    import networkx as nx

    steps = [s for (s,) in con.execute("SELECT DISTINCT step FROM critical_path_summary WHERE run_id = ?",
                                       [run_id]).fetchall()]
    assert steps
    for step in steps:
        ev = con.execute("SELECT *, ts_ns + dur_ns AS \"end\" FROM events WHERE run_id = ? AND step IS NOT DISTINCT FROM ? "
                         "AND ts_ns IS NOT NULL AND dur_ns >= 0", [run_id, step]).df().to_dict("records")
        for e in ev:
            e["launch_event_id"] = None if e["launch_event_id"] != e["launch_event_id"] else e["launch_event_id"]
        g, by_id, origin = _independent_dag(ev)
        assert nx.is_directed_acyclic_graph(g)
        path = [i for (i,) in con.execute("SELECT event_id FROM critical_path WHERE run_id = ? AND step IS NOT DISTINCT FROM ? "
                                          "ORDER BY pos", [run_id, step]).fetchall()]
        best = nx.dag_longest_path_length(g)
        end = max(e["end"] for e in by_id.values())
        assert best == end - origin
        assert by_id[path[-1]]["end"] == end
        weight = g["source"][path[0]]["weight"] + sum(g[u][v]["weight"] for u, v in zip(path, path[1:]))
        assert weight == best  # the module's path is a longest path
        # at ties (equal ready times: zero-length runtime calls, a stream and a launch ready at the
        # same ns) several longest paths exist; networkx takes one, the module its tie order
        lp = nx.dag_longest_path(g)[1:]
        assert lp == path if exact else (lp[-1] == path[-1] and len(set(lp) & set(path)) >= 0.9 * len(lp))


def test_one_rank_agrees_with_networkx_on_the_handmade_fixture(session_store):
    con = analyses.connect(session_store("gb"))
    _check_one_rank(con, "gb", exact=True)
    (n,) = con.execute("SELECT count(*) FROM critical_path_summary").fetchone()
    assert n == 2  # two profiler steps


@pytest.mark.skipif(not SHARED_DLRM.is_dir(), reason="../shared/traces/param_dlrm_8rank_v100 is absent")
def test_one_rank_agrees_with_networkx_on_a_real_rank(tmp_path):
    store = Store(tmp_path / "s")
    ingest_paths(sorted(SHARED_DLRM.glob("worker0_*.json")), store, run_id="d0")
    _check_one_rank(analyses.connect(store), "d0", exact=False)  # 469 of 469 in ours


# --- report, HTML, Perfetto ----------------------------------------------------------------------

RANK0_PIECES = [  # (start µs after BASE, end, part, name, event rank): the hand-computed path of rank 0
    (1, 1.5, "straggler", "cudaLaunchKernel", 1), (1.5, 2, "straggler", "idle", 1),
    (2, 22, "straggler", "sm80_gemm_C", 1), (22, 40, "exposed_comm", NCCL, 0),
    (40, 40.5, "sync_other", "cudaStreamSynchronize", 0), (40.5, 41, "launch_cpu", "host code", 0),
    (41, 41.5, "launch_cpu", "cudaLaunchKernel", 0), (41.5, 45, "idle", "idle", 0), (45, 55, "compute", "sm80_gemm_B", 0),
]


def _ns_of(us):
    return round((BASE + us) * 1000)


def test_path_segments_tile_the_path(two_rank):
    segs = {p["rank"]: p for p in cp.path_segments(two_rank, "tr")}
    assert [tuple(s) for s in segs[0]["segments"]] == [
        (_ns_of(a), _ns_of(b), part, name, r) for a, b, part, name, r in RANK0_PIECES]
    for p in segs.values():
        assert p["segments"][0][0] == p["start_ns"] and p["segments"][-1][1] == p["end_ns"]
        assert all(a[1] == b[0] for a, b in zip(p["segments"], p["segments"][1:]))


def test_report_section_and_json(two_rank, capsys):
    from tracekit.report.data import build_report, print_report, report_json

    rep = build_report(run_id="tr", con=two_rank)
    sec = json.loads(report_json(rep))["critical_path"]
    assert [(r["rank"], r["length_ns"], r["straggler_ns"]) for r in sec["summary"]] == [(0, 54_000, 21_000), (1, 37_000, 0)]
    # gemm C is on both paths (20 µs each) of 54 + 37 µs in all
    top = sec["top_events"][0]
    assert (top["name"], top["events"], top["on_path_ns"], top["share"]) == ("sm80_gemm_C", 2, 40_000, pytest.approx(40 / 91))
    assert [(r["rank"], r["name"]) for r in sec["top_by_path"]] == [
        (0, "sm80_gemm_C"), (0, NCCL), (0, "sm80_gemm_B"), (1, "sm80_gemm_C"), (1, NCCL), (1, "cudaLaunchKernel")]
    # strips: the pieces merged by part and rank (rank 0's first three are all rank 1's straggler work)
    strip0 = sec["paths"][0]["segments"]
    assert [(s[0], s[1], s[2], s[3], s[4]) for s in strip0[:2]] == [
        (_ns_of(1), _ns_of(22), "straggler", "sm80_gemm_C", 3), (_ns_of(22), _ns_of(40), "exposed_comm", NCCL, 1)]
    from rich.console import Console

    print_report(rep, Console(width=100, file=None, force_terminal=False))
    out = capsys.readouterr().out
    assert "Critical path per step and rank" in out and "38.9%" in out  # rank 0: straggler 21 / 54


def test_perfetto_track(two_rank_store, tmp_path):
    from decimal import Decimal

    from tracekit.report.perfetto import export_perfetto

    out = tmp_path / "tr.json"
    stats = export_perfetto(two_rank_store, out, run_id="tr")
    doc = json.loads(out.read_text(), parse_float=Decimal)
    ev = doc["traceEvents"]
    (pid,) = [e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == "critical path"]
    assert pid == 2
    tname = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}
    lane0 = [e for e in ev if e["ph"] == "X" and e["pid"] == pid and tname[e["tid"]] == "rank 0's path"]
    origin = doc["otherData"]["time_origin_ns"]
    got = [(int(e["ts"] * 1000) + origin, int((e["ts"] + e["dur"]) * 1000) + origin, e["args"]["part"], e["name"],
            e["args"]["event_rank"]) for e in lane0]
    assert got == [(_ns_of(a), _ns_of(b), part, name, r) for a, b, part, name, r in RANK0_PIECES]
    assert stats.path_slices == len(RANK0_PIECES) + 4  # rank 1's path: launch, idle gap, gemm C, all-reduce


def test_html_strip_renders_in_chromium(two_rank, tmp_path):
    from tests.report.test_html_report import _run_chromium
    from tracekit.report.html import critical_path_figure, write_html_report
    from tracekit.report.data import build_report

    rep = build_report(run_id="tr", con=two_rank)
    fig = critical_path_figure({"report": rep})
    assert {t.name for t in fig.data} == {
        "compute", "exposed communication", "launch/CPU", "sync/other", "other ranks (last to arrive)", "idle"}
    comm = next(t for t in fig.data if t.name == "exposed communication")
    # µs from the earliest path start (1 µs): rank 0's all-reduce [22, 40), rank 1's [22, 38)
    assert list(comm.y) == ["step 1 · rank 0", "step 1 · rank 1"]
    assert list(comm.base) == [21.0, 21.0] and list(comm.x) == [18.0, 16.0]
    page = write_html_report(None, tmp_path / "tr.html", run_id="tr", report=rep, con=two_rank)
    dom, log = _run_chromium(page, tmp_path, None)
    part = dom.split('id="tk-sec-critical-path"', 1)[1].split("</section>", 1)[0]
    assert 'id="tk-fig-critical-path"' in part and 'class="main-svg"' in part
    assert "Uncaught" not in log


@pytest.mark.skipif(not SHARED_DLRM.is_dir(), reason="../shared/traces/param_dlrm_8rank_v100 is absent")
def test_dlrm_8_ranks_read_as_a_performance_engineer(session_store):
    """The real 8-rank DLRM step: host-bound (its kernels are µs long), and rank 7 arrived last at
    the forward all-to-all (default:1): every other rank's path crosses to rank 7 exactly there,
    as collective_instances names it the straggler, and the part of its path on rank 7 is its
    straggler time."""
    con = analyses.connect(session_store("dlrm"))
    rows = con.execute("SELECT rank, length_ns, straggler_ns, launch_cpu_ns, compute_ns, other_ranks, "
                       + " + ".join(cp.PARTS) + " FROM critical_path_summary ORDER BY rank").fetchall()
    assert [r[0] for r in rows] == list(range(8))
    for rank, length, straggler, cpu, compute, others, parts in rows:
        assert parts == length and cpu > 0.5 * length and compute < 0.01 * length
        assert (others, straggler > 0.3 * length) == ((0, False) if rank == 7 else (1, True))
    jumps = con.execute("""
        SELECT p.rank, p.event_rank, i.straggler, c.pg_name || ':' || c.seq
        FROM critical_path p
        JOIN collectives c ON c.run_id = p.run_id AND c.rank = p.event_rank AND c.event_id = p.event_id
        JOIN collective_instances i ON i.run_id = c.run_id AND i.pg_name = c.pg_name AND i.seq = c.seq
        WHERE p.edge = 'collective' ORDER BY p.rank""").fetchall()
    assert jumps == [(r, 7, 7, "default:1") for r in range(7)]
    on7 = con.execute("SELECT rank, sum(on_path_ns + gap_ns) FILTER (WHERE event_rank = 7) FROM critical_path "
                      "WHERE rank < 7 GROUP BY rank ORDER BY rank").fetchall()
    assert [n for _, n in on7] == [r[2] for r in rows[:7]]


def test_the_path_is_left_out_only_when_asked(session_store, tmp_path):
    """The critical path is computed at ingest, so every report and export has it whatever the run's
    size; --no-critical-path (critical_path=False) leaves it out, with the reason."""
    from tracekit.report.perfetto import export_perfetto
    from tracekit.report.data import build_report

    st = session_store("tp")
    full = build_report(st, "tp")["critical_path"]
    assert full["summary"] and "skipped" not in full
    off = build_report(st, "tp", critical_path=False)["critical_path"]
    assert off["summary"] == [] and off["skipped"] == "left out (--no-critical-path)"
    assert build_report(st, "tp", critical_path=True)["critical_path"] == full
    assert export_perfetto(st, tmp_path / "a.json", "tp", critical_path=False).path_slices == 0
    assert export_perfetto(st, tmp_path / "b.json", "tp").path_slices > 0


def test_kernels_overlapping_on_one_stream_pdl_stay_on_the_path(tmp_path):
    """fixtures/inputs/stream_overlap_h100.json (NOTE.md): on an H100 three kernels of one stream
    overlap (programmatic dependent launch, kept whole by the ingest); GPU busy [0, 22.95) µs with no
    gap. The path is the three kernels, all compute, no idle (the stream predecessor is the op
    before by start, ready at min(its end, the next op's start))."""
    from tracekit.ingest import ingest_paths
    from tracekit.report.data import build_report
    from tracekit.store import Store

    st = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "inputs" / "stream_overlap_h100.json"], st, run_id="h")
    (row,) = build_report(st, "h")["critical_path"]["summary"]
    assert (row["length_ns"], row["compute_ns"], row["idle_ns"], row["path_events"]) == (22_950, 22_950, 0, 3)


def test_self_last_arrival_ties_and_a_rank_absent_from_a_step(tmp_path):
    """Cases a vectorized build could get wrong, worked out by hand (µs after BASE). Rank 0 arrives
    last at the all-reduce (20), so its own span has no collective edge while rank 1's (arrived at
    5) jumps to it; rank 0's cudaEventRecord [101, 101) and cudaLaunchKernel [101, 101.5) start at
    the same time (the zero-length call ends first, so it is the launch's thread predecessor, and
    not the other way); rank 1 has no events in step 2, so (1, 2) has no path."""
    d = tmp_path / "tr"
    d.mkdir()

    def write(rank, steps, events):
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
               "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
               "traceEvents": [_ev("user_annotation", f"ProfilerStep#{s}", 100 * (s - 1), 100, 100) for s in steps]
               + events, "traceName": f"rank{rank}"}
        (d / f"rank{rank}.json").write_text(json.dumps(doc))

    write(0, (1, 2), [_launch(1, 1), _kernel("sm80_gemm_A", 2, 10, 1), _launch(3, 2), _allreduce(20, 10, 2),
                      _launch(101, 0, "cudaEventRecord", 0), _launch(101, 3), _kernel("sm80_gemm_B", 102, 8, 3)])
    write(1, (1,), [_launch(1, 1), _allreduce(5, 25, 1)])
    store = Store(tmp_path / "s")
    ingest_paths([d], store, run_id="t")
    con = analyses.connect(store)
    rows = con.execute("SELECT rank, step, event_rank, name, on_path_ns, gap_ns, edge FROM critical_path "
                       "ORDER BY rank, step, pos").fetchall()
    assert rows == [
        # rank 0, step 1: L1 → gemm A (idle 0.5 after its launch) → all-reduce [20, 30) after the stream
        (0, 1, 0, "cudaLaunchKernel", 500, 0, "launch"), (0, 1, 0, "sm80_gemm_A", 10 * US, 500, "stream"),
        (0, 1, 0, NCCL, 10 * US, 8 * US, "end"),
        # rank 0, step 2: the zero-length call, then the launch [101, 101.5), then gemm B after idle
        (0, 2, 0, "cudaEventRecord", 0, 0, "thread"), (0, 2, 0, "cudaLaunchKernel", 500, 0, "launch"),
        (0, 2, 0, "sm80_gemm_B", 8 * US, 500, "end"),
        # rank 1, step 1: rank 0's chain up to its arrival (20), then rank 1's own wait [20, 30)
        (1, 1, 0, "cudaLaunchKernel", 500, 0, "launch"), (1, 1, 0, "sm80_gemm_A", 10 * US, 500, "stream"),
        (1, 1, 0, NCCL, 0, 8 * US, "collective"), (1, 1, 1, NCCL, 10 * US, 0, "end"),
    ]
    cols = ["rank", "step", "length_ns", *cp.PARTS, "path_events", "other_ranks"]
    assert con.execute(f"SELECT {', '.join(cols)} FROM critical_path_summary ORDER BY step, rank").fetchall() == [
        (0, 1, 29 * US, 10 * US, 10 * US, 0, 500, 0, 0, 8500, 3, 0),
        (1, 1, 29 * US, 0, 10 * US, 0, 0, 0, 19 * US, 0, 4, 1),
        (0, 2, 9 * US, 8 * US, 0, 0, 500, 0, 0, 500, 3, 0),
    ]


def test_small_node_chunks_give_the_same_path(tmp_path, monkeypatch):
    """CHUNK_NODES = 7 (the node statement cut every 7 nodes' steps; every fixture fits one chunk at
    the default): the same critical_path and critical_path_summary rows on the 3d job (8 ranks,
    several steps)."""
    store = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "3d_2x2x2"], store, run_id="r")

    def rows():
        con = analyses.connect(store)
        out = [con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("critical_path", "critical_path_summary")]
        con.close()
        return out

    whole = rows()
    monkeypatch.setattr(cp, "CHUNK_NODES", 7)
    assert rows() == whole and all(whole)
