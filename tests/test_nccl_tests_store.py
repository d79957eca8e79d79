"""nccl-tests logs as runs of the store: rows, the log's own bandwidths, and the α–β fit on them."""

from __future__ import annotations

from tracekit import analyses
import pytest

from tests.conftest import shared_trace
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.report import build_report
from tracekit.store import Store


@pytest.fixture(scope="module")
def nt(tmp_path_factory):
    d = shared_trace("superbench_nccl_tests_a100x8")
    store = Store(tmp_path_factory.mktemp("nt"))
    rid = ingest_paths([d], store, run_id="superbench")
    return store, rid


def test_rows_and_run(nt):
    store, rid = nt
    con = analyses.connect(store)
    assert con.execute("SELECT source, workload, world_size, device_name FROM runs").fetchone() == (
        "nccl_tests", "sweep", 8, "A100-SXM4-40GB"
    )
    # 34 result rows per log (counted by hand), each with an out-of-place and an in-place time
    rows = dict(con.execute("SELECT op, count(*) FROM collectives GROUP BY op").fetchall())
    assert rows == {op: 68 for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")}
    # the log's busbw agrees with busbw recomputed from S, the log's time and the nccl-tests factor,
    # within the printing: busbw to 2 decimals, time to at least whole µs (the exact per-digit check
    # is in test_nccl_tests_parse.py)
    bad = con.execute(
        """
        SELECT count(*) FROM collectives
        WHERE size_bytes > 0 AND abs(size_bytes / dur_ns * tk_busbw_factor(op, group_size) - log_busbw_gbps)
              > 0.005 + log_busbw_gbps * 0.5 / (dur_ns / 1000.0) + 1e-9
        """
    ).fetchone()[0]
    assert bad == 0
    # and the stored value is the log's own: the last all_reduce row of nccl_allreduce.log
    last = con.execute(
        "SELECT size_bytes, dur_ns, log_algbw_gbps, log_busbw_gbps FROM collectives "
        "WHERE op = 'all_reduce' AND NOT in_place ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    assert last[0] == 8589934592


def test_fit_on_allreduce_log(nt):
    """α ≈ 2.55 µs, β ≈ 226.7 GB/s, n½ ≈ 578 KB from the out-of-place and in-place rows together."""
    store, rid = nt
    f = analyses.connect(store).execute(
        "SELECT alpha_s, beta_gbps, n_half_bytes, status, source FROM alpha_beta_fit WHERE op = 'all_reduce'"
    ).fetchone()
    assert f[3:] == ("ok", "nccl_tests")
    assert f[0] == pytest.approx(2.55e-6, rel=0.05)
    assert f[1] == pytest.approx(226.7, rel=0.05)
    assert f[2] == pytest.approx(f[0] * f[1] * 1e9, rel=1e-9)


def test_report_has_no_overlap_noise(nt):
    store, rid = nt
    rep = build_report(store, rid)
    assert rep["overlap_by_rank"] == [] and rep["warnings"] == []
    assert {r["op"] for r in rep["fit"] if r["status"] == "ok"} == {
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"
    }


def test_reingest_is_noop_and_mixing_is_refused(nt, tmp_path, capsys):
    store, rid = nt
    d = shared_trace("superbench_nccl_tests_a100x8")
    assert ingest_paths([d], store) == rid
    from tests.conftest import FIXTURES

    assert main(["ingest", str(d / "nccl_allreduce.log"), str(FIXTURES / "handmade" / "two_rank"),
                 "--store", str(tmp_path / "s")]) == 2
    assert "cannot share a run" in capsys.readouterr().err
