"""A store written before a column was added (same major schema version) still analyzes: the
base views read the missing column as NULL (tracekit.store.Store.connect)."""

import json
from pathlib import Path

import pyarrow.parquet as pq
from typer.testing import CliRunner

from tracekit.cli import app
from tracekit.ingest import ingest_paths
from tracekit.store import Store

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _drop(path: Path, columns: list[str]) -> None:
    t = pq.read_table(path)
    pq.write_table(t.drop(columns), path)


def test_run_without_the_newer_columns_reads_them_as_null(tmp_path):
    store = Store(tmp_path / "store")
    ingest_paths([FIXTURES / "ep_2rank"], store, run_id="old")
    seen = set()
    for f in sorted((tmp_path / "store").rglob("*.parquet")):
        real = f.resolve()
        if real in seen:
            continue
        seen.add(real)
        if f.name == "ranks.parquet":
            _drop(real, ["gpu_events", "same_stream_overlaps"])
        elif f.name == "collectives.parquet":
            _drop(real, ["cpu_side"])
    con = store.connect()
    try:
        assert con.execute("SELECT count(*), count(gpu_events) FROM ranks").fetchone() == (2, 0)
        assert con.execute("SELECT count(cpu_side) FROM collectives").fetchone() == (0,)
        n = con.execute("SELECT count(*) FROM collectives").fetchone()[0]
        assert n > 0
    finally:
        con.close()
    res = CliRunner().invoke(app, ["analyze", "--store", str(tmp_path / "store"), "--run", "old", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert [r["gpu_events"] for r in rep["ranks"]] == [None, None]
    assert rep["collectives"][0]["count"] > 0
