"""`tracekit diff` warns, one line per difference, when the two runs are not alike: hardware
(device name), rank count (world size), completeness (ranks ingested out of the world size); in the
terminal and in the JSON's ``warnings``."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES, TRACES
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.report.diff import comparability_warnings, diff_runs
from tracekit.store import Store


def _meta(rid, device="NVIDIA H100 80GB HBM3", ws=8, ranks=range(8), source="kineto"):
    return dict(run_id=rid, device_name=device, world_size=ws, ranks_ingested=list(ranks), source=source)


def test_alike_runs_give_no_warning():
    assert comparability_warnings(_meta("a"), _meta("b")) == []
    # a benchmark log is one file for every rank: one rank row, never incomplete
    assert comparability_warnings(_meta("a", ranks=[0], source="nccl_tests"), _meta("b")) == []


def test_one_line_per_difference():
    w = comparability_warnings(_meta("a"), _meta("b", device="NVIDIA B200", ws=16, ranks=[0, 1, 2, 3, 5, 9]))
    assert [x.split(":")[0] for x in w] == ["hardware differs", "rank count differs", "completeness differs"]
    assert "A (a) ran on NVIDIA H100 80GB HBM3, B (b) on NVIDIA B200" in w[0]
    assert "A has 8 ranks, B 16" in w[1]
    assert "A has all its 8 ranks, B has 6 of 16 ranks (missing 4, 6–8, 10–15)" in w[2]


def test_unknown_on_one_side_and_different_gaps():
    w = comparability_warnings(_meta("a", device=None), _meta("b"))
    assert w == ["hardware differs: A (a) ran on an unrecorded device, B (b) on NVIDIA H100 80GB HBM3: "
                 "a change may be the hardware's"]
    # both incomplete, but not alike: still a difference
    w = comparability_warnings(_meta("a", ranks=[0]), _meta("b", ranks=[0, 1]))
    assert w and "A has 1 of 8 ranks (missing 1–7), B has 2 of 8 ranks (missing 2–7)" in w[0]
    assert comparability_warnings(_meta("a", ranks=[0]), _meta("b", ranks=[0])) == []


def test_fixture_run_with_one_rank_of_two(tmp_path, capsys):
    st = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="full")
    ingest_paths([FIXTURES / "tp_2rank" / "rank1.pt.trace.json.gz"], st, run_id="half",
                 config=json.loads((FIXTURES / "tp_2rank" / "run_config.json").read_text()))
    d = diff_runs(st, "full", "half")
    assert d["run_b"]["ranks_ingested"] == [1] and d["run_b"]["world_size"] == 2
    assert d["warnings"] == ["completeness differs: A has all its 2 ranks, B has 1 of 2 ranks (missing 0): totals "
                             "sum different ranks, and the waits a missing rank caused are not seen"]
    assert diff_runs(st, "full", "full")["warnings"] == []


def test_v100_dlrm_against_one_b200_rank(tmp_path, capsys, monkeypatch):
    dlrm, b200 = TRACES / "param_dlrm_8rank_v100", TRACES / "tracelens_b200_r0of8"
    if not (dlrm.exists() and b200.exists()):
        pytest.skip("../shared/traces/param_dlrm_8rank_v100 or tracelens_b200_r0of8 is absent")
    st = Store(tmp_path / "s")
    ingest_paths([dlrm], st, run_id="v100")
    ingest_paths([b200], st, run_id="b200")
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["diff", "v100", "b200", "--store", str(st.path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["warnings"]
    # both name a world size of 8: the rank count does not differ, the completeness does
    assert got == [
        "hardware differs: A (v100) ran on Tesla V100-SXM2-32GB, B (b200) on NVIDIA B200: a change may be the hardware's",
        "completeness differs: A has all its 8 ranks, B has 1 of 8 ranks (missing 1–7): totals sum different ranks, "
        "and the waits a missing rank caused are not seen"]
    assert main(["diff", "v100", "b200", "--store", str(st.path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if ln.startswith("warning: ")] == ["warning: " + w for w in got]
