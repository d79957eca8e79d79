"""What a CPU span can and cannot say: an NCCL call seen only on the CPU (it enqueues GPU work) has
comm time and counts but no bandwidth and no verdict; gloo's blocking calls keep theirs; an
unknown group size is null, not 1; a legacy trace without categories is read by today's rules."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

US = 1000


def _legacy(path) -> None:
    """An autograd-profiler-style trace: no "cat", no distributedInfo, no deviceProperties; µs."""
    ev = []

    def x(name, ts, dur, tid=1, args=None):
        ev.append({"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": "CPU functions", "tid": tid,
                   "args": args or {}})
    x("aten::mm", 1000, 40)                                          # compute, 40 µs
    x("nccl:all_reduce", 1100, 30, args={"Input Dims": [[1024]], "Input type": ["float"]})  # 4,096 B
    x("aten::empty", 1105, 5)                                        # inside the call: launch work, not compute
    x("aten::add", 1200, 60, tid=2)                                  # compute, 60 µs (a thread with no call)
    x("nccl:all_to_all", 1300, 141, args={"Input Dims": [[4096]], "Input type": ["float"]})  # 16,384 B
    x("aten::mm", 1500, 20)                                          # compute, 20 µs
    path.write_text(json.dumps({"traceEvents": ev}))


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    d = tmp_path_factory.mktemp("legacy")
    _legacy(d / "legacy.json")
    store = Store(tmp_path_factory.mktemp("store"))
    ingest_paths([d / "legacy.json"], store, run_id="legacy")
    return analyses.connect(store)


def test_legacy_trace_classes_backend_and_unknown_k(legacy):
    con = legacy
    assert con.execute("SELECT backend FROM runs").fetchone() == ("nccl",)  # from the nccl:* calls
    assert con.execute("SELECT name, class FROM events ORDER BY ts_ns").fetchall() == [
        ("aten::mm", "compute"), ("nccl:all_reduce", "comm"), ("aten::empty", "cpu"), ("aten::add", "compute"),
        ("nccl:all_to_all", "comm"), ("aten::mm", "compute")]
    # CPU compute 40 + 60 + 20 µs (was 0); comm 30 + 141 µs
    assert con.execute("SELECT comm_ns, compute_ns, overlap_ns FROM overlap_by_rank").fetchone() == (
        171 * US, 120 * US, 0)
    assert con.execute("SELECT op, group_size, k_source, size_bytes, cpu_side FROM collectives ORDER BY ts_ns"
                       ).fetchall() == [("all_reduce", None, None, 4096, True), ("all_to_all", None, None, 16384, True)]


def test_async_cpu_call_has_no_bandwidth_and_no_verdict(legacy):
    con = legacy
    assert con.execute("SELECT op, async_cpu, sync_time_ns FROM collective_instances ORDER BY seq").fetchall() == [
        ("all_reduce", True, None), ("all_to_all", True, None)]
    assert con.execute("SELECT count(*), count(algbw_gbps), count(busbw_gbps) FROM collective_bandwidth").fetchone() \
        == (2, 0, 0)
    assert con.execute("SELECT DISTINCT verdict, no_model_reason FROM collective_verdicts").fetchall() == [
        (None, "async call: no transfer time in this trace")]


def test_gloo_blocking_calls_keep_their_bandwidth(tmp_path):
    store = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "inputs" / "cpu_gloo_tp_2rank"], store, run_id="g")
    con = analyses.connect(store)
    assert con.execute("SELECT backend FROM runs").fetchone() == ("gloo",)
    n, timed, bw, async_cpu = con.execute(
        "SELECT count(*), count(i.sync_time_ns), count(b.busbw_gbps), bool_or(i.async_cpu) FROM collective_instances i "
        "JOIN collective_bandwidth b USING (run_id, pg_name, seq)").fetchone()
    assert n > 0 and timed == n and bw == n and async_cpu is False


def test_cpu_only_nccl_job_with_a_world_size(tmp_path):
    """fixtures/inputs/cpu_nccl_2rank (NOTE.md): two ranks, NCCL, CPU activity only: the calls are
    matched (waits, skew) but carry no transfer time."""
    store = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "inputs" / "cpu_nccl_2rank"], store, run_id="c")
    con = analyses.connect(store)
    assert con.execute("SELECT count(*), count(sync_time_ns), count(skew_ns), min(group_size) "
                       "FROM collective_instances").fetchone() == (3, 0, 3, 2)
    assert con.execute("SELECT count(busbw_gbps) FROM collective_bandwidth").fetchone() == (0,)
