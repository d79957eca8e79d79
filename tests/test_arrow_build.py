"""tracekit._arrow builds the same arrays as pyarrow's own converters (which import pandas)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tracekit import _arrow
from tracekit.store import COLLECTIVES_SCHEMA, RANKS_SCHEMA, RUNS_SCHEMA


def test_columns_equal_pa_array():
    cases = [
        ([1, None, -(2**63) + 1, 2**63 - 1], pa.int64()),
        ([3, None, -7], pa.int32()),
        ([1.5, None, float("inf"), -0.0], pa.float64()),
        ([True, None, False, True, True, False, False, True, False], pa.bool_()),
        (["a", None, "", "é😀", "x" * 300], pa.string()),
        ([[0, 1], None, [], [2**31 - 1]], pa.list_(pa.int32())),
        ([[5], None, [-1, 2**40]], pa.list_(pa.int64())),
        ([["w1", "w2"], [], None, ["é"]], pa.list_(pa.string())),
        ([dt.datetime(2026, 11, 29, 10, 0, 1, 123456, tzinfo=dt.timezone.utc), None,
          dt.datetime(1999, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=2)))], pa.timestamp("us", tz="UTC")),
        ([], pa.string()),
    ]
    for values, t in cases:
        got = _arrow.column(values, t)
        want = pa.array(values, t)
        assert got.type == want.type
        assert got.equals(want), (t, got, want)
        assert got.null_count == want.null_count


def test_table_from_rows_equals_from_pylist():
    rows = [
        dict(run_id="r", rank=0, op="all_reduce", pg_ranks=[0, 1], in_splits=None, size_bytes=1024, seq=3),
        dict(run_id="r", rank=1, op=None, pg_ranks=None, in_splits=[1, 2], size_bytes=None),
    ]
    got = _arrow.table_from_rows(rows, COLLECTIVES_SCHEMA)
    assert got.equals(pa.Table.from_pylist(rows, schema=COLLECTIVES_SCHEMA))
    rk = [dict(run_id="r", rank=0, warnings=["a", "b"], events=5), dict(run_id="r", rank=1, warnings=[])]
    assert _arrow.table_from_rows(rk, RANKS_SCHEMA).equals(pa.Table.from_pylist(rk, schema=RANKS_SCHEMA))
    rn = [dict(run_id="r", created_at=dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc), world_size=2)]
    assert _arrow.table_from_rows(rn, RUNS_SCHEMA).equals(pa.Table.from_pylist(rn, schema=RUNS_SCHEMA))


def test_ingest_does_not_import_pandas(tmp_path):
    code = (
        "import sys; from tracekit.ingest import ingest_paths; "
        f"ingest_paths(['fixtures/tp_2rank'], {str(tmp_path / 's')!r}); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(_repo()), check=True)
    assert out.stdout.strip() == "False"


def _repo():
    from tests.conftest import REPO

    return REPO


@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.bool_()])
def test_to_numpy_reads_values_and_nulls_of_sliced_arrays(type_):
    vals = [True, None, False, True, None, True, False, False, True, None, True] if type_ == pa.bool_() else \
        [5, None, -7, 2**31 - 1, None, 0, 3, -2**31, 9, None, 1]
    arr = pa.array(vals, type_)
    for lo, hi in [(0, 11), (1, 11), (3, 10), (9, 11), (2, 2)]:
        got, valid = _arrow.to_numpy(arr.slice(lo, hi - lo))
        want = vals[lo:hi]
        assert [None if (valid is not None and not v) else x.item() for x, v in
                zip(got, valid if valid is not None else [True] * len(got))] == want
        assert [x.item() for x in got] == [0 if w is None else w for w in want]
        assert (valid is None) == all(w is not None for w in want)
    with pytest.raises(TypeError):
        _arrow.to_numpy(pa.array(["a"]))
