"""`tracekit ingest` prints what it stored: ranks found / expected and which are missing, hosts,
process groups, collectives per op, quarantined events, warnings, and the command to analyze.

Hand-made: rank 0 of the 2-rank fixture (fixtures/handmade/two_rank) with its world size set to 8
is a 1-of-8 trace, ranks 1..7 missing; it holds one all-reduce and one all-gather. The shared
B200 trace (../shared/traces/tracelens_b200_r0of8, rank 0 of 8) must name the same 7 ranks.
"""

from __future__ import annotations

import json


from tests.conftest import FIXTURES, shared_trace
from tracekit.cli import main
from tracekit.ingest.summary import _ranges, ingest_summary

TWO_RANK = FIXTURES / "handmade" / "two_rank"


def _one_of(tmp_path, world_size: int):
    d = json.loads((TWO_RANK / "rank0.json").read_text())
    d["distributedInfo"]["world_size"] = world_size
    for e in d["traceEvents"]:
        if "Group size" in e.get("args", {}):
            e["args"]["Group size"] = world_size
            e["args"]["Process Group Ranks"] = str(list(range(world_size)))
    out = tmp_path / "trace"
    out.mkdir()
    (out / "rank0.json").write_text(json.dumps(d))
    return out


def _ingest(args, capsys):
    rc = main(["ingest", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_one_of_eight_names_the_missing_ranks(tmp_path, capsys):
    st = tmp_path / "store"
    rc, out, _ = _ingest([_one_of(tmp_path, 8), "--store", st, "--run-id", "r0of8"], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"run r0of8 in {st}"
    assert lines[1] == "ranks: 1 of 8 found (0); missing 7: 1, 2, 3, 4, 5, 6, 7"
    assert "collectives (calls per op over the recorded ranks): all_gather 1, all_reduce 1" in lines
    assert "quarantined events: 0; warnings: 0" in lines
    assert lines[-1] == f"next: tracekit analyze --run r0of8 --store {st}"


def test_complete_run(tmp_path, capsys):
    rc, out, _ = _ingest([TWO_RANK, "--store", tmp_path / "s", "--run-id", "two"], capsys)
    assert rc == 0
    assert "ranks: 2 of 2 found (0, 1)\n" in out  # nothing missing: no "missing" clause
    assert "hosts: not recorded; process groups: 1; events: 5" in out
    assert "collectives (calls per op over the recorded ranks): all_gather 2, all_reduce 2" in out


def test_quarantined_and_warnings_counted(tmp_path, capsys):
    rc, out, err = _ingest([FIXTURES / "defects" / "ts_zero.json", "--store", tmp_path / "s"], capsys)
    assert rc == 0
    # ts_zero.json: two events at ts 0 quarantined (tests/ingest/test_kineto_defects.py)
    assert "quarantined events: 2; warnings: " in out


def test_benchmark_log_is_not_missing_ranks(tmp_path, capsys):
    rc, out, err = _ingest([FIXTURES / "nccl_tests" / "two_runs.md", "--store", tmp_path / "s"], capsys)
    assert rc == 0
    # two benchmark runs (8 and 2 GPUs; fixtures/nccl_tests/NOTE.md), never "missing" ranks
    assert "ranks: a benchmark log of 2 benchmark run(s), the largest on 8 ranks" in out and "missing" not in out
    # 3 sizes each, out-of-place and in-place: 2 × 3 × 2 = 12 measurements; one #wrong warning on stderr
    assert "collectives (sizes measured per op): all_reduce 12" in out
    assert "warnings: 1 (on stderr)" in out and "#wrong" in err


def test_ranges():
    assert _ranges([3, 1, 2]) == "1, 2, 3"
    assert _ranges(list(range(1, 40)) + [50]) == "1–39, 50"
    assert _ranges(list(range(0, 40, 2))) == ", ".join(map(str, range(0, 40, 2)))


def test_shared_b200_rank0_of_8(tmp_path, capsys):
    trace = shared_trace("tracelens_b200_r0of8")
    rc, out, _ = _ingest([trace, "--store", tmp_path / "s", "--run-id", "b200"], capsys)
    assert rc == 0
    assert "ranks: 1 of 8 found (0); missing 7: 1, 2, 3, 4, 5, 6, 7" in out
    from tracekit.store import Store

    s = ingest_summary(Store(tmp_path / "s"), "b200")
    assert s["ranks_missing"] == [1, 2, 3, 4, 5, 6, 7] and s["world_size"] == 8


def test_fleet_log_names_its_hosts(tmp_path, capsys):
    """A benchmark log names every rank's host in its "Using devices" lines: the summary counts them
    (the 10-node H100 logs: cnode3-002 … cnode3-011), not "hosts: not recorded"."""
    logs = shared_trace("nccltests_h100_fleet/multi_node")
    rc, out, _ = _ingest([logs, "--store", tmp_path / "s", "--run-id", "mn"], capsys)
    assert rc == 0
    assert "hosts: 10; process groups: 20; events: 0" in out
