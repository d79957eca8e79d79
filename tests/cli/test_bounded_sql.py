"""Bounded queries: `tracekit sql` and Run.sql() stop a statement at the time limit, refuse a
result past the row or byte cap with one line, and stream csv/parquet output batch by batch."""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest

from tests.conftest import FIXTURES
from tracekit import sqlshell
from tracekit.cli import main
from tracekit.errors import BadInputError

ENDLESS = "SELECT count(*) FROM range(100000000000000)"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = tmp_path_factory.mktemp("bsql") / "store"
    assert main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(s), "--run-id", "r"]) == 0
    return s


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_endless_query_stops_at_the_timeout_exit_2(store, capsys):
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = main(["sql", ENDLESS, "--store", str(store), "--timeout", "1"])
    took = time.perf_counter() - t0
    assert rc == 2
    assert "ran longer than 1 s and was stopped (--timeout" in _one_line(capsys.readouterr().err)
    assert 1 <= took < 8, took


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_default_timeout_is_documented_and_used(store, monkeypatch):
    assert sqlshell.DEFAULT_TIMEOUT_S > 0
    monkeypatch.setattr(sqlshell, "DEFAULT_TIMEOUT_S", 0.5)
    t0 = time.perf_counter()
    with pytest.raises(BadInputError, match="ran longer than 0.5 s"):
        sqlshell.run_query(_store(store), ENDLESS, timeout_s=sqlshell.DEFAULT_TIMEOUT_S)
    assert time.perf_counter() - t0 < 6


def _store(path):
    from tracekit.store import Store

    return Store(path)


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_50m_rows_refused_past_max_rows_fast(store, capsys):
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = main(["sql", "SELECT * FROM range(50000000)", "--store", str(store), "--max-rows", "1000"])
    assert rc == 2
    assert "more than 1,000 rows (--max-rows)" in _one_line(capsys.readouterr().err)
    assert time.perf_counter() - t0 < 10  # refused at the first batch past the cap, not after 50 M rows


def test_byte_cap(store):
    with pytest.raises(BadInputError, match="more than 1 MiB"):
        sqlshell.run_query(_store(store), "SELECT * FROM range(1000000)", arrow=True, max_bytes=1 << 20)
    # under both caps: the rows, exactly
    t = sqlshell.run_query(_store(store), "SELECT * FROM range(70000)", arrow=True, max_rows=70000)
    assert t.num_rows == 70000 and t.column(0).to_pylist()[-1] == 69999


def test_rows_exactly_at_the_cap_pass(store, capsys):
    capsys.readouterr()
    assert main(["sql", "SELECT * FROM range(5)", "--store", str(store), "--max-rows", "5", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ['"range"', "0", "1", "2", "3", "4"]
    assert main(["sql", "SELECT * FROM range(6)", "--store", str(store), "--max-rows", "5"]) == 2


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_streamed_output_batch_by_batch_not_capped(store, tmp_path, capsys, monkeypatch, fmt):
    """2,000,000 rows with --max-rows 10: streamed to the file in batches of BATCH_ROWS (no batch
    larger, none held), every row there."""
    from tracekit.cli import sqlout

    sizes = []
    orig = sqlout._BatchSink.write_batch

    def spy(self, batch):
        sizes.append(batch.num_rows)
        orig(self, batch)

    monkeypatch.setattr(sqlout._BatchSink, "write_batch", spy)
    n = 2_000_000 if fmt == "parquet" else 300_000
    out = tmp_path / f"o.{fmt}"
    capsys.readouterr()
    assert main(["sql", f"SELECT range AS i, range % 7 AS m FROM range({n})", "--store", str(store),
                 "--format", fmt, "--output", str(out), "--max-rows", "10"]) == 0
    assert f"wrote {n:,} rows" in capsys.readouterr().err
    assert sum(sizes) == n and max(sizes) <= sqlshell.BATCH_ROWS and len(sizes) >= n // sqlshell.BATCH_ROWS
    if fmt == "parquet":
        t = pq.read_table(out)
        assert t.num_rows == n and sum(t.column("m").to_pylist()[:14]) == 2 * sum(range(7))
    else:
        lines = out.read_text().splitlines()
        assert len(lines) == n + 1 and lines[0] == '"i","m"' and lines[-1] == f"{n - 1},{(n - 1) % 7}"


def test_stopped_stream_leaves_no_file(store, tmp_path, capsys):
    out = tmp_path / "never.parquet"
    assert main(["sql", ENDLESS, "--store", str(store), "--format", "parquet", "--output", str(out),
                 "--timeout", "0.5"]) == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_api_sql_is_bounded(store):
    import tracekit.api

    run = tracekit.api.open(store).run("r")
    with pytest.raises(BadInputError, match="ran longer than 0.5 s"):
        run.sql(ENDLESS, timeout_s=0.5)
    with pytest.raises(BadInputError, match="more than 100 rows"):
        run.sql("SELECT * FROM range(1000)", max_rows=100)
    # the connection still answers after an interrupted statement, with the right value
    assert run.sql("SELECT count(*) FROM collectives WHERE run_id = ?", ["r"]).fetchall() == [(4,)]


@pytest.mark.parametrize("pattern", ["{store}/..", "{store}/../*", "{store}/runs/r/../../../*", "/tmp/*", "*",
                                     "{store}/runs/r/events/*.parquet/../../../../*"])
def test_glob_reveals_nothing_outside_the_store(store, capsys, pattern):
    capsys.readouterr()
    rc = main(["sql", f"SELECT * FROM glob('{pattern.format(store=store)}')", "--store", str(store), "--json"])
    cap = capsys.readouterr()
    if rc == 0:
        import json

        assert json.loads(cap.out) == []
    else:
        assert rc == 2 and str(store.parent) not in cap.err.replace(str(store), "")
