"""The recorded TP fixture through ingest and analyses, and one real `tracekit collect tp` end to end.

fixtures/tp_2rank (see its NOTE.md): 2 ranks, 2 layers, 2 active steps, batch 2,
seq 64, hidden 256, float32.
"""

from __future__ import annotations

from tracekit import analyses
import json

import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.store import Store

TP = FIXTURES / "tp_2rank"


@pytest.fixture(scope="module")
def tp(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("tp"))
    rid = ingest_paths([TP], store)
    con = analyses.connect(store)
    yield store, rid, con
    con.close()


def test_all_reduce_count_and_size_per_rank(tp):
    _, _, con = tp
    cfg = json.loads((TP / "run_config.json").read_text())
    expected_calls = 2 * cfg["layers"] * cfg["active"]  # 2 all-reduces per layer per active step = 8
    expected_bytes = cfg["batch"] * cfg["seq"] * cfg["hidden"] * 4  # 2·64·256·4 B = 131,072 B
    assert (expected_calls, expected_bytes) == (8, 131072)
    rows = con.execute(
        "SELECT rank, count(*), min(size_bytes), max(size_bytes), min(op), max(op), min(group_size) "
        "FROM collectives GROUP BY rank ORDER BY rank"
    ).fetchall()
    assert rows == [(r, 8, 131072, 131072, "all_reduce", "all_reduce", 2) for r in (0, 1)]


def test_instances_complete_and_agree(tp):
    _, _, con = tp
    assert con.execute(
        "SELECT count(*), bool_and(complete), bool_or(disagree), min(seq), max(seq) FROM collective_instances"
    ).fetchone() == (8, True, False, 0, 7)


def test_run_metadata_from_collector_config(tp):
    _, rid, con = tp
    assert con.execute("SELECT workload, backend, world_size FROM runs").fetchone() == ("tp", "gloo", 2)


def test_cpu_only_classes(tp):
    """gloo spans are comm; aten ops of non-gloo threads are compute; comm never on a compute thread."""
    _, _, con = tp
    rows = dict(con.execute("SELECT class, count(*) FROM events GROUP BY class").fetchall())
    assert rows["comm"] == 16  # 8 gloo:all_reduce spans per rank
    assert rows["compute"] > 0
    bad = con.execute(
        "SELECT count(*) FROM events e JOIN (SELECT DISTINCT rank, device, track FROM events WHERE class='comm') t "
        "USING (rank, device, track) WHERE e.class = 'compute'"
    ).fetchone()[0]
    assert bad == 0


def test_report_has_every_section(tp):
    store, rid, _ = tp
    rep = build_report(store, rid)
    (ar,) = rep["collectives"]
    assert ar["op"] == "all_reduce" and ar["count"] == 8 and ar["total_bytes"] == 8 * 131072
    assert [r["rank"] for r in rep["overlap_by_rank"]] == [0, 1]
    assert {r["step"] for r in rep["overlap_by_step"]} == {2, 3}
    assert rep["stragglers"] and rep["instances"]["complete"] == 8


@pytest.mark.slow
def test_collect_tp_end_to_end(tmp_path, capsys):
    """The README's main command, small: runs 2 ranks, ingests, prints the report."""
    store = tmp_path / "store"
    rc = main([
        "collect", "tp", "--layers", "2", "--hidden", "128", "--heads", "4", "--seq", "32", "--batch", "2",
        "--wait", "1", "--warmup", "1", "--active", "2", "--out", str(tmp_path / "runs"), "--store", str(store),
    ])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "all_reduce" in out and "Overlap per rank" in out
    con = analyses.connect(Store(store))
    # 2 layers × 2 all-reduces × 2 active steps per rank, each 2·32·128·4 B
    assert con.execute("SELECT rank, count(*), max(size_bytes) FROM collectives GROUP BY rank ORDER BY rank").fetchall() == [
        (0, 8, 32768), (1, 8, 32768)
    ]


def test_analyze_path_never_imports_torch(tp):
    """`tracekit analyze` on an existing store must start fast: no torch import on that path."""
    import subprocess
    import sys

    store, rid, _ = tp
    code = (
        "import sys; from tracekit.cli import main; "
        f"rc = main(['analyze', '--store', {str(store.path)!r}, '--run', {rid!r}, '--json']); "
        "sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stderr.endswith("NO-TORCH")
    assert json.loads(res.stdout)["run"]["run_id"] == rid
