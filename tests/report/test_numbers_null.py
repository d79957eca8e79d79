"""Null, not zero: what one rank of a group cannot say (waits, skew, stragglers, the wait/transfer
split) is null in JSON, "—" in the terminal and absent from the HTML timeline; one "incomplete".

A hand-made trace of rank 0 of 8 (kernel metadata names the group of 8) written into tmp_path.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _rank0_of_8(path) -> None:
    ev = []
    for seq in range(3):
        ev.append(dict(ph="X", cat="kernel", name="ncclDevKernel_AllReduce_RING_LL(x)", pid=0, tid=7,
                       ts=1000 + 100 * seq, dur=40, args={
                           "device": 0, "stream": 7, "correlation": 0, "Seq": seq, "Collective name": "allreduce",
                           "In msg nelems": 262144, "Out msg nelems": 262144, "dtype": "Float", "Group size": 8,
                           "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]",
                           "In split size": "[]", "Out split size": "[]"}))
        ev.append(dict(ph="X", cat="kernel", name="sm90_xmma_gemm_bf16bf16_bf16f32", pid=0, tid=13,
                       ts=1010 + 100 * seq, dur=50, args={"device": 0, "stream": 13, "correlation": 0}))
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
                                "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9}],
                                "traceEvents": ev}))


@pytest.fixture(scope="module")
def one_of_8(tmp_path_factory):
    d = tmp_path_factory.mktemp("one")
    _rank0_of_8(d / "rank0.json")
    store = Store(tmp_path_factory.mktemp("store"))
    ingest_paths([d], store, run_id="one")
    return store


def _run(store, *args) -> str:
    return subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(store.path), *args],
                          capture_output=True, text=True, check=True).stdout


def test_one_rank_of_eight_has_no_wait_skew_or_straggler(one_of_8):
    con = analyses.connect(one_of_8)
    assert con.execute("SELECT count(*), count(skew_ns), bool_or(complete), min(ranks_seen), max(group_size) "
                       "FROM collective_instances").fetchone() == (3, 0, False, 1, 8)
    assert con.execute("SELECT count(*), count(wait_ns) FROM collective_waits").fetchone() == (3, 0)
    rep = json.loads(_run(one_of_8, "--json"))
    (ar,) = rep["collectives"]
    assert ar["total_wait_ns"] is None and ar["incomplete"] == 3
    assert set(rep["null_reasons"]) >= {"collectives.total_wait_ns", "stragglers"}
    assert rep["stragglers"] == [] and rep["straggler_ranks"] == []
    # one definition of incomplete: the by-op table, the instances and the process groups agree
    assert rep["instances"]["incomplete"] == 3
    assert [g["incomplete"] for g in rep["process_groups"]] == [3]
    assert [(b["op"], b["instances"], b["incomplete"]) for b in rep["process_groups"][0]["by_size"]] == [
        ("all_reduce", 3, 3)]
    for m in rep["measured_vs_model"]:
        assert m["wait_ns"] is None and m["gap_skew_ns"] is None and m["gap_transfer_ns"] is None


def test_one_rank_of_eight_terminal_and_html(one_of_8, tmp_path):
    text = _run(one_of_8, "--html", str(tmp_path / "r.html"))
    table = text.split("Collectives per op (")[1].split("\n\n")[0]
    row = next(line for line in table.splitlines() if line.startswith("all_reduce"))
    assert "—" in row and "0.000" not in row  # no "total wait ms 0.000"
    assert "no wait can be measured" in " ".join(table.split())
    assert "Worst stragglers" not in text
    page = (tmp_path / "r.html").read_text()
    assert "comm: transfer (after last arrival)" not in page
    assert "comm: waiting for the last rank" not in page
    assert "wait and transfer not separable" in page


def test_two_complete_ranks_keep_their_numbers(tmp_path):
    """The same call on both ranks of a group of 2: skew and waits are measured (0 is a value here)."""
    from tests.conftest import FIXTURES

    store = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "handmade" / "two_rank"], store, run_id="two")
    con = analyses.connect(store)
    assert con.execute("SELECT skew_ns FROM collective_instances ORDER BY seq").fetchall() == [(20_000,), (4_000,)]
    assert con.execute("SELECT sum(wait_ns), count(wait_ns) FROM collective_waits").fetchone() == (24_000, 4)
