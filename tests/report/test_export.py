"""`tracekit export --perfetto`: the merged Chrome/Perfetto JSON, checked independently of the exporter.

Checks (on the hand-made 2-rank trace, the recorded TP run, a synthetic trace with crossing CPU
ops, and the real 8-rank DLRM set when ../shared is there): valid JSON; one process per rank;
every slice on the common clock with the store's exact nanoseconds; no two slices on one track
partially overlapping; every matched collective instance linked across all its ranks by flow
events bound inside its collective slices; the collective args.
"""

from __future__ import annotations

from tracekit import analyses
import json
from collections import defaultdict
from decimal import Decimal

import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.report.perfetto import export_perfetto, nest_lanes
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _load(path):
    """The trace with timestamps as Decimal (exact text), so precision is checked, not assumed."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh, parse_float=Decimal)


def _ns(us: Decimal) -> int:
    q = us * 1000
    assert q == q.to_integral_value(), f"{us} µs is not a whole number of ns"
    return int(q)


def check_trace(doc: dict) -> dict:
    """Independent checks of a merged trace; returns facts for the caller's own assertions."""
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev
    origin = int(doc["otherData"]["time_origin_ns"])
    names = {}
    threads = set()
    for e in ev:
        if e["ph"] == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
    path_pid = {p for p, n in names.items() if n == "critical path"}
    names = {p: n for p, n in names.items() if p not in path_pid}  # the ranks'
    for e in ev:
        if e["ph"] == "M" and e["name"] == "thread_name":
            assert (e["pid"], e["tid"]) not in threads, "a thread is named twice"
            threads.add((e["pid"], e["tid"]))
    tracks, path_tracks = defaultdict(list), defaultdict(list)
    for e in ev:
        if e["ph"] != "X":
            continue
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert (e["pid"], e["tid"]) in threads, "slice on an unnamed track"
        s = _ns(e["ts"])
        d = _ns(e["dur"])
        assert d >= 0
        assert (e["pid"] in path_pid) == (e.get("cat") == "critical_path")
        (path_tracks if e["pid"] in path_pid else tracks)[(e["pid"], e["tid"])].append((s, s + d, e))
    for spans in path_tracks.values():  # a path's pieces tile it: they never overlap
        spans.sort(key=lambda x: x[0])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # no partial overlap on a track: sorted by (start, longest first), each slice either starts
    # after the enclosing one ended or ends inside it
    for key, spans in tracks.items():
        spans.sort(key=lambda x: (x[0], -(x[1] - x[0])))
        stack = []
        for s, e, ev_ in spans:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1], f"partial overlap on {key}: {ev_['name']} at {s} ns"
            stack.append(e)
    # flows: each id has one start and one end, both inside a collective slice of their instance
    by_id = defaultdict(dict)
    for e in ev:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in by_id[e["id"]], "flow id used twice"
            by_id[e["id"]][e["ph"]] = e
    linked = defaultdict(set)
    for fid, ends in by_id.items():
        assert set(ends) == {"s", "f"}, f"flow {fid} is not a start/end pair"
        for e in ends.values():
            t = _ns(e["ts"])
            inside = [x for x in tracks[(e["pid"], e["tid"])] if x[0] <= t <= x[1]
                      and x[2]["args"].get("instance") == e["name"]]
            assert inside, f"flow {fid} end not inside a slice of instance {e['name']}"
            linked[e["name"]].add(e["pid"])
        assert _ns(ends["s"]["ts"]) <= _ns(ends["f"]["ts"]), "flow goes back in time"
    return dict(origin=origin, processes=names, tracks=tracks, linked=linked, flows=by_id, path_tracks=path_tracks)


def _expected_instances(store: Store, run_id: str) -> dict[str, set[int]]:
    con = analyses.connect(store, run_ids=[run_id])
    rows = con.execute(
        "SELECT c.pg_name || ':' || c.seq, list(DISTINCT c.rank) FROM collectives c "
        "JOIN collective_instances i USING (run_id, pg_name, seq) WHERE i.ranks_seen > 1 GROUP BY ALL"
    ).fetchall()
    con.close()
    return {k: set(v) for k, v in rows}


def _store_times(store: Store, run_id: str) -> dict[tuple[int, int], tuple[int, int]]:
    con = store.connect(run_ids=[run_id])
    rows = con.execute("SELECT rank, event_id, ts_ns, dur_ns FROM events").fetchall()
    con.close()
    return {(r, e): (t, d) for r, e, t, d in rows}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("export-store"))
    ingest_paths([FIXTURES / "handmade" / "two_rank"], st, run_id="hand")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="tp")
    return st


def test_nest_lanes():
    # parent [0, 100) with a nested child, a sibling touching its end, one crossing it, one identical
    starts = [0, 10, 100, 50, 0]
    ends = [100, 20, 120, 150, 100]
    assert nest_lanes(starts, ends) == [0, 0, 0, 1, 0]
    assert nest_lanes([], []) == []
    # two crossings need two overflow lanes
    assert nest_lanes([0, 5, 8], [10, 15, 18]) == [0, 1, 2]


def test_handmade_exact(store, tmp_path):
    out = tmp_path / "hand.json"
    stats = export_perfetto(store, out, run_id="hand")
    doc = _load(out)
    facts = check_trace(doc)
    assert facts["origin"] == 1_000_000 and stats.processes == 2 and stats.overflow_slices == 0
    assert facts["processes"] == {0: "rank 0", 1: "rank 1"}
    colls = {(e["pid"], e["args"]["instance"]): e for e in doc["traceEvents"]
             if e["ph"] == "X" and "instance" in e["args"]}
    ar0, ar1 = colls[(0, "0:0")], colls[(1, "0:0")]
    # NOTE.md: rank 0 all_reduce 1000–1050 µs, rank 1 1020–1060 µs; origin 1000 µs
    assert (ar0["ts"], ar0["dur"], ar1["ts"], ar1["dur"]) == (Decimal("0.0"), Decimal("50.0"), Decimal("20.0"), Decimal("40.0"))
    assert ar0["args"]["op"] == "all_reduce" and ar0["args"]["size_bytes"] == 4194304
    assert ar0["args"]["wait_us"] == 20 and ar1["args"]["wait_us"] == 0
    assert ar0["args"]["sync_time_us"] == 35 and ar0["args"]["straggler"] == 1
    assert "verdict" in ar0["args"]
    ag = colls[(0, "0:1")]["args"]
    assert (ag["op"], ag["size_bytes"], ag["wait_us"], ag["sync_time_us"]) == ("all_gather", 1048576, 4, 9)
    assert facts["linked"] == {"0:0": {0, 1}, "0:1": {0, 1}}
    # flows start at the first arrival and end at the straggler
    for f in facts["flows"].values():
        assert (f["s"]["pid"], f["f"]["pid"]) == (0, 1)


@pytest.mark.parametrize("fixture", ["tp_2rank", "sweep_2rank"])
def test_recorded_runs_every_slice_exact_ns(fixture, tmp_path):
    """Recorded gloo runs (nested CPU ops; the sweep's send/recv spans cross the ops that issue
    them): every event exported once, at its exact ns, no crossing on a track, all instances linked."""
    if not (FIXTURES / fixture).exists():
        pytest.skip(f"fixtures/{fixture} is not in this checkout")
    st = Store(tmp_path / "store")
    rid = ingest_paths([FIXTURES / fixture], st, run_id="run")
    out = tmp_path / "run.json"
    export_perfetto(st, out, run_id=rid)
    facts = check_trace(_load(out))
    truth = _store_times(st, rid)
    slices = [x for spans in facts["tracks"].values() for x in spans]
    assert len(slices) == len(truth)
    for s, e, ev in slices:
        ts, dur = truth[(ev["pid"], ev["args"]["event_id"])]
        assert (s + facts["origin"], e - s) == (ts, dur)
    expected = _expected_instances(st, rid)
    assert expected and facts["linked"] == expected


def test_crossing_cpu_ops_go_to_an_overflow_track(tmp_path):
    """Two CPU ops on one thread that cross (not nested) cannot share a Chrome track."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::outer", "pid": 1, "tid": 1, "ts": 100.0, "dur": 50.0, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::inner", "pid": 1, "tid": 1, "ts": 110.0, "dur": 10.0, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::crossing", "pid": 1, "tid": 1, "ts": 140.0, "dur": 30.5, "args": {}},
    ]
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1}, "traceEvents": ev}
    (tmp_path / "rank0.json").write_text(json.dumps(trace), encoding="utf-8")
    st = Store(tmp_path / "store")
    rid = ingest_paths([tmp_path / "rank0.json"], st, run_id="cross")
    out = tmp_path / "cross.json"
    stats = export_perfetto(st, out, run_id=rid)
    doc = _load(out)
    facts = check_trace(doc)
    assert stats.overflow_slices == 1
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    (crossing,) = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "aten::crossing"
                   and e["cat"] != "critical_path"]
    assert names[crossing["tid"]].endswith("(overflow 1)")
    assert facts["origin"] == 100_000
    assert (crossing["ts"], crossing["dur"]) == (Decimal("40.0"), Decimal("30.5"))  # moved, never cut


def test_export_cli(store, tmp_path, capsys):
    out = tmp_path / "cli" / "merged.json"
    assert main(["export", "--perfetto", str(out), "--run", "hand", "--store", str(store.path)]) == 0
    assert "2 ranks" in capsys.readouterr().out
    check_trace(_load(out))
    assert main(["export", "--perfetto", str(out), "--run", "nope", "--store", str(store.path)]) == 2


def test_a_benchmark_log_has_nothing_to_export(tmp_path, capsys):
    st = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "nccl_tests" / "slurm-4242.out"], st, run_id="log")
    capsys.readouterr()
    out = tmp_path / "log.json"
    assert main(["export", "--perfetto", str(out), "--run", "log", "--store", str(st.path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "tracekit: run 'log' has no timeline (no events: a benchmark log?): nothing to export")
    assert not out.exists()


def test_dlrm_8_ranks_merged(session_store, tmp_path):
    """The acceptance check on the real 8-rank PARAM DLRM traces (V100, NCCL)."""
    st, rid = session_store("dlrm"), "dlrm"
    out = tmp_path / "merged.json"
    stats = export_perfetto(st, out, run_id=rid)
    doc = _load(out)
    facts = check_trace(doc)
    assert sorted(facts["processes"]) == list(range(8)) and stats.processes == 8
    assert {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "critical_path"} == set(range(8))
    expected = _expected_instances(st, rid)
    assert len(expected) == 8 and all(len(r) == 8 for r in expected.values())
    assert facts["linked"] == expected
    colls = [e for e in doc["traceEvents"] if e["ph"] == "X" and "instance" in e["args"]]
    assert len(colls) == 64
    for e in colls:
        a = e["args"]
        assert {"instance", "op", "size_bytes", "wait_us", "sync_time_us", "verdict"} <= set(a)
        assert a["op"] in ("all_reduce", "all_to_all") and a["wait_us"] >= 0
