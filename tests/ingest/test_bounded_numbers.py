"""Odd input, right numbers: a Group size that contradicts the world or the group's ranks is
flagged and the smallest consistent size used (busbw and wire bytes scale with it)."""

from __future__ import annotations

import json

import duckdb
import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest.attribute import consistent_group_size

TWO = FIXTURES / "handmade" / "two_rank"


@pytest.mark.parametrize("gs, ranks, world, want", [
    (2, [0, 1], 2, (2, None)),
    (None, [0, 1], 2, (None, None)),
    (16, [0, 1], 2, (2, "Group size 16 is larger than the world (2 ranks); Group size 16 disagrees with the 2 "
                        "rank(s) of Process Group Ranks: 2 used")),
    (16, None, 8, (8, "Group size 16 is larger than the world (8 ranks): 8 used")),
    (4, [0, 1, 1], 8, (2, "Group size 4 disagrees with the 2 rank(s) of Process Group Ranks: 2 used")),
    (2, [0, 1, 2, 3], 8, (2, "Group size 2 disagrees with the 4 rank(s) of Process Group Ranks: 2 used")),
])
def test_consistent_group_size(gs, ranks, world, want):
    assert consistent_group_size(gs, ranks, world) == want


def _with_group_size(tmp_path, sizes: dict[int, int]):
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        doc = json.loads((TWO / f"rank{r}.json").read_text())
        for ev in doc["traceEvents"]:
            a = ev.get("args") or {}
            if "Group size" in a and r in sizes:
                a["Group size"] = sizes[r]
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    return d


def test_group_size_larger_than_the_world_uses_the_world(tmp_path, capsys):
    s = tmp_path / "s"
    assert main(["ingest", str(_with_group_size(tmp_path, {0: 16, 1: 16})), "--store", str(s), "--run-id", "x"]) == 0
    err = capsys.readouterr().err
    assert ("process group 0: Group size 16 is larger than the world (2 ranks); Group size 16 disagrees with the "
            "2 rank(s) of Process Group Ranks: 2 used (2 call(s), marked approx)") in err
    con = duckdb.connect()
    rows = con.execute(f"SELECT rank, op, group_size, approx, size_bytes, wire_bytes FROM "
                       f"read_parquet('{s}/runs/x/collectives.parquet') ORDER BY rank, ts_ns").fetchall()
    # all_reduce of 4 MiB on k = 2: wire = 2(k-1)/k · size = size; the all-gather's 1 MiB output: (k-1)/k · size
    assert rows == [(0, "all_reduce", 2, True, 4194304, 4194304), (0, "all_gather", 2, True, 1048576, 524288),
                    (1, "all_reduce", 2, True, 4194304, 4194304), (1, "all_gather", 2, True, 1048576, 524288)]


def test_consistent_group_size_is_not_flagged(tmp_path, capsys):
    s = tmp_path / "s"
    assert main(["ingest", str(TWO), "--store", str(s), "--run-id", "x"]) == 0
    assert "Group size" not in capsys.readouterr().err
    con = duckdb.connect()
    assert con.execute(f"SELECT DISTINCT group_size, approx FROM read_parquet('{s}/runs/x/collectives.parquet')"
                       ).fetchall() == [(2, False)]


def test_full_disk_while_reading_says_write_not_read(tmp_path, capsys, monkeypatch):
    """ENOSPC from the staging writer: one line naming the store's staging folder, 'cannot write',
    exit 2, nothing stored (it said 'cannot read' and named the trace)."""
    import errno
    import os

    from tracekit.ingest import staging

    def full(out):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out))

    monkeypatch.setattr(staging, "open_stage_writer", full)
    s = tmp_path / "s"
    assert main(["ingest", str(TWO / "rank0.json"), "--store", str(s)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot write the staging files while reading" in line and "No space left on device" in line
    assert "cannot read" not in line and str(TWO / "rank0.json") in line
    assert not list((s / "runs").glob("*")) if (s / "runs").exists() else True


def test_unreadable_trace_still_says_read(tmp_path, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    p = tmp_path / "rank0.json"
    p.write_text((TWO / "rank0.json").read_text())
    p.chmod(0)
    assert main(["ingest", str(p), "--store", str(tmp_path / "s")]) == 2
    assert "cannot read it" in capsys.readouterr().err


@pytest.mark.parametrize("dtype, sizes, warned", [
    (["Float"], [4194304, 2097152], None),  # a list of one name: read (4 B × 1,048,576; 4 B × 524,288 out)
    (6, [None, None], "dtype '6' is not a dtype tracekit knows"),
    ({"a": 1}, [None, None], "dtype '{\"a\": 1}' is not a dtype tracekit knows"),
    ("Float7", [None, None], "dtype 'Float7' is not a dtype tracekit knows"),
    ("BFloat16", [2097152, 1048576], None),
])
def test_non_string_dtype_read_or_warned(tmp_path, capsys, dtype, sizes, warned):
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        doc = json.loads((TWO / f"rank{r}.json").read_text())
        for ev in doc["traceEvents"]:
            if "dtype" in (ev.get("args") or {}):
                ev["args"]["dtype"] = dtype
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    s = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(s), "--run-id", "x"]) == 0
    err = capsys.readouterr().err
    got = duckdb.connect().execute(f"SELECT size_bytes FROM read_parquet('{s}/runs/x/collectives.parquet') "
                                   "WHERE rank = 0 ORDER BY ts_ns").fetchall()
    assert [g[0] for g in got] == sizes
    if warned:
        assert f"rank 0: process group 0: {warned}" in err and "its calls have no message size" in err
    else:
        assert "dtype" not in err


def test_calls_issued_out_of_seq_order_are_one_window(tmp_path):
    """Both ranks issue seq 1 before seq 0 (two streams): the calls are matched by their Seq in
    window 0, not split into two profiler windows (a seq coming back, 0 1 0 1, still starts one:
    tests/analyses/test_duplicates.py)."""
    from tracekit import analyses
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):  # both ranks: the all-reduce (first in time) is seq 1, the all-gather seq 0
        doc = json.loads((TWO / f"rank{r}.json").read_text())
        for ev in doc["traceEvents"]:
            a = ev.get("args") or {}
            if "Seq" in a:
                a["Seq"] = 1 - a["Seq"]
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    st = Store(tmp_path / "s")
    ingest_paths([str(d)], st, run_id="x")
    con = analyses.connect(st)
    rows = con.execute("SELECT win, seq, op, ranks_seen, complete FROM collective_instances ORDER BY win, seq").fetchall()
    assert rows == [(0, 0, "all_gather", 2, True), (0, 1, "all_reduce", 2, True)]


def _as_async(doc: dict, interleave: bool) -> dict:
    """The doc with each NCCL kernel written as a nestable async span: a "b" and an "e" with one id
    (Chrome's trace format), the "e" events after every "b" when ``interleave``."""
    begins, ends, rest = [], [], []
    for i, ev in enumerate(doc["traceEvents"]):
        if ev.get("ph") == "X" and str(ev.get("name", "")).startswith("nccl"):
            b = dict(ev, ph="b", id=f"0x{i:x}")
            b.pop("dur")
            e = {"ph": "e", "cat": ev["cat"], "name": ev["name"], "pid": ev["pid"], "tid": ev["tid"],
                 "id": f"0x{i:x}", "ts": ev["ts"] + ev["dur"]}
            begins.append(b)
            ends.append(e)
        else:
            rest.append(ev)
    if interleave:
        spans = begins + ends
    else:
        spans = [x for pair in zip(begins, ends) for x in pair]
    return dict(doc, traceEvents=rest + spans)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("fast", ["1", "0"])
def test_async_b_e_collective_spans_read_as_spans(tmp_path, capsys, monkeypatch, interleave, fast):
    """The two NCCL kernels per rank as async b/e spans: the same collectives (op, size, start and
    duration to the ns) as the X events give, with the C scanner or without it."""
    monkeypatch.setenv("TRACEKIT_NO_KSCAN", "0" if fast == "1" else "1")
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        doc = json.loads((TWO / f"rank{r}.json").read_text())
        (d / f"rank{r}.json").write_text(json.dumps(_as_async(doc, interleave)))
    s, ref = tmp_path / "s", tmp_path / "ref"
    assert main(["ingest", str(d), "--store", str(s), "--run-id", "x"]) == 0
    assert "no communication" not in capsys.readouterr().err
    assert main(["ingest", str(TWO), "--store", str(ref), "--run-id", "x"]) == 0
    q = ("SELECT rank, op, size_bytes, ts_ns, dur_ns, group_size FROM read_parquet('{}/runs/x/collectives.parquet') "
         "ORDER BY rank, ts_ns")
    got = duckdb.connect().execute(q.format(s)).fetchall()
    want = duckdb.connect().execute(q.format(ref)).fetchall()
    assert got == want and len(got) == 4
    assert got[0][1:5] == ("all_reduce", 4194304, 1_000_000, 50_000)  # ts 1000 µs, dur 50 µs


def test_ranks_disagreeing_on_the_group_size_are_flagged(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        doc = json.loads((TWO / f"rank{r}.json").read_text())
        if r == 1:
            for ev in doc["traceEvents"]:
                a = ev.get("args") or {}
                if "Group size" in a:
                    a["Group size"] = 1
                    a.pop("Process Group Ranks", None)
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    assert main(["ingest", str(d), "--store", str(tmp_path / "s"), "--run-id", "x"]) == 0
    err = capsys.readouterr().err
    note = "process group 0: its ranks' calls name different group sizes (rank 0: 2; rank 1: 1)"
    assert f"rank 0: {note}" in err and f"rank 1: {note}" in err


def test_group_size_disagreements_unit():
    import pyarrow as pa

    from tracekit.ingest.attribute import group_size_disagreements

    def t(rows):
        return pa.table({"pg_name": [p for p, _ in rows], "group_size": [k for _, k in rows]})

    got = group_size_disagreements([(0, t([("a", 4), ("b", 2)])), (1, t([("a", 8), ("b", 2)])), (2, t([("a", 4)]))])
    note = "process group a: its ranks' calls name different group sizes (rank 0: 4; rank 1: 8; rank 2: 4)"
    assert {r: [n.split(";  ")[0][: len(note)] for n in ns] for r, ns in got.items()} == {0: [note], 1: [note], 2: [note]}
    assert group_size_disagreements([(0, t([("a", 4)])), (1, t([("a", 4)]))]) == {}
    # one rank recorded (hta_pyper_a100_r0of16): its own calls differ, no other rank "disagrees"
    (one,) = group_size_disagreements([(0, t([("a", 8), ("a", 16)]))])[0]
    assert one == ("process group a: its calls name different group sizes (rank 0: 8, 16); each instance takes the "
                   "largest size its ranks' calls name, check the trace's Group size")
