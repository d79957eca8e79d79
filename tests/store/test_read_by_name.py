"""How a store view reads a table's Parquet files (tracekit.store._read_by_name): one run's folder of
rank files in one read, folders (runs written by different versions) matched by column name."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.store import _read_by_name


def _write(path, cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return str(path)


def test_folders_joined_by_column_name(tmp_path):
    # run a (older: no column c), run b (columns in another order, c added)
    a = [_write(tmp_path / "a" / "events" / f"rank={r}.parquet", {"rank": [r], "ts": [10 * r]}) for r in (0, 1)]
    b = [_write(tmp_path / "b" / "events" / f"rank={r}.parquet", {"ts": [100 + r], "c": ["x"], "rank": [r]})
         for r in (0, 1, 2)]
    sql = _read_by_name(a + b)
    assert "union_by_name" not in sql and sql.count("read_parquet") == 2
    rows = duckdb.connect().execute(f"SELECT rank, ts, c FROM ({sql}) ORDER BY ts").fetchall()
    assert rows == [(0, 0, None), (1, 10, None), (0, 100, "x"), (1, 101, "x"), (2, 102, "x")]


def test_one_file_a_folder_reads_by_name_in_one_call(tmp_path):
    f = [_write(tmp_path / "a" / "run.parquet", {"x": [1]}), _write(tmp_path / "b" / "run.parquet", {"y": [2], "x": [3]})]
    sql = _read_by_name(f)
    assert sql.count("read_parquet") == 1 and "union_by_name = true" in sql
    assert duckdb.connect().execute(f"SELECT x, y FROM ({sql}) ORDER BY x").fetchall() == [(1, None), (3, 2)]
