"""benchmarks/gpu_check.py: skips cleanly without CUDA; its checks hold on good recorded runs and
fail, naming the problem, where they must; its plan's command lines parse.

Recorded runs: fixtures/tp_2rank (CPU, gloo), fixtures/3d_2x2x2 (CPU, gloo, 8 ranks) and
fixtures/handmade/two_rank (hand-written NCCL kernels on GPU streams).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, REPO
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc
_spec.loader.exec_module(gc)


def test_without_cuda_it_says_skipped_and_exits_0():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run")
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "no CUDA device: skipped"


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("gpu_check") / "store")
    for name, folder in (("tp", FIXTURES / "tp_2rank"), ("3d", FIXTURES / "3d_2x2x2"),
                         ("hand", FIXTURES / "handmade" / "two_rank")):
        cfg_file = folder / "run_config.json"
        conf = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        ingest_paths([str(folder)], store, run_id=name, config=conf, workload=conf.get("workload"))
    c = analyses.connect(store)
    yield c
    c.close()


def _conf(name):
    return json.loads((FIXTURES / name / "run_config.json").read_text())


def test_expected_calls_from_run_configs():
    assert gc.expected_calls(_conf("tp_2rank")) == {"all_reduce": {131_072}}
    assert gc.expected_calls(_conf("3d_2x2x2")) == {
        "all_reduce": {8192, 73_728, 33_280, 73_984}, "send": {8192}, "recv": {8192}}
    assert set(gc.expected_calls(_conf("sweep_2rank"))) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                              "send", "recv"}
    assert gc.expected_calls({"workload": "external"}) == {}


def test_good_cpu_runs_pass_the_cpu_checks(con):
    assert gc.check_calls(con, "tp", gc.expected_calls(_conf("tp_2rank"))) == []
    assert gc.check_calls(con, "3d", gc.expected_calls(_conf("3d_2x2x2"))) == []
    assert gc.check_complete(con, "tp") == []
    assert gc.check_overlap(con, "tp", gpu=False) == []
    assert gc.check_overlap(con, "3d", gpu=False) == []
    assert gc.check_no_clock_warnings(con, "tp") == []
    assert gc.check_run(con, "tp", _conf("tp_2rank"), gpu=False) == []


def test_wrong_expectations_are_named(con):
    assert gc.check_calls(con, "tp", {"all_reduce": {4096}}) == ["all_reduce sizes [131072] not all in [4096]"]
    assert gc.check_calls(con, "tp", {"all_to_all": None}) == ["no all_to_all recorded"]


def test_a_cpu_run_fails_the_gpu_checks(con):
    problems = gc.check_gpu_comm(con, "tp")
    assert problems[0] == "no communication kernels on GPU streams"
    assert problems[1].startswith("collectives not identified from metadata: 16 by ")  # 2 ranks × 8 all-reduces
    assert gc.check_overlap(con, "tp", gpu=True) == ["no GPU stream events"]


def test_nccl_kernels_on_their_own_stream_pass_the_gpu_checks(con):
    # two_rank: NCCL kernels with their args on stream 7 on both ranks, a GEMM on stream 13 on rank 0
    # only: rank 1 has nothing to overlap its communication with
    assert gc.check_gpu_comm(con, "hand") == []
    assert gc.check_overlap(con, "hand", gpu=True) == ["rank 1: comm streams [7], compute streams None"]
    assert gc.check_complete(con, "hand") == []


def test_clock_warnings_are_reported():
    import duckdb

    c = duckdb.connect()
    c.execute("CREATE TABLE ranks AS SELECT * FROM (VALUES ('r', 0, ['clock offset uncertain: 3 ms']), "
              "('r', 1, ['something else'])) t(run_id, rank, warnings)")
    assert gc.check_no_clock_warnings(c, "r") == ["rank 0: clock offset uncertain: 3 ms"]


def test_plan_by_gpu_count():
    assert gc.plan(0, True) == []
    one = gc.plan(1, False)
    assert [j.ranks for j in one if j.kind == "collect"] == [1, 1, 1]
    assert any(j.kind == "skip" for j in one) and any(j.kind == "profile" for j in one)
    two = gc.plan(2, True)
    assert {j.argv[0] for j in two if j.kind == "collect"} == {"tp", "ep", "pp", "disagg-kv", "3d", "sweep"}
    assert any("nsys" in j.argv for j in two if j.kind == "collect")
    eight = gc.plan(8, False)
    assert sorted(j.ranks for j in eight if j.argv[:1] == ["3d"]) == [8, 8]
    for jobs in (one, two, eight):
        for j in jobs:
            if j.kind == "collect":
                assert j.argv[-2:] == ["--backend", "nccl"]


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_every_planned_command_line_parses(n):
    """The options exist and have valid values (typer parses them; nothing runs)."""
    import typer

    from tracekit.cli.collect import app

    group = typer.main.get_command(app)
    for job in gc.plan(n, True):
        if job.kind != "collect":
            continue
        ctx = group.make_context("collect", list(job.argv), resilient_parsing=True)
        sub = group.get_command(ctx, job.argv[0])
        assert sub is not None, job.argv
        sub.make_context(job.argv[0], [*job.argv[1:], "--out", "/tmp/x", "--no-ingest"])
