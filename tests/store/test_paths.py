"""Paths are never patterns (issue 17, item 2): a store or trace path holding DuckDB's glob
characters (`*`, `?`, `[`) or other odd characters reads exactly that path.

Each store below sits next to a decoy store whose name the path would match as a pattern
(`exp[1]` matches `exp1`, `glob*store` matches `globXstore`...); the decoy holds another run, so
reading it would show up as an extra run id and extra rank rows.
"""

from __future__ import annotations

from tracekit import analyses

import json
import shutil

import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest import ingest_paths
from tracekit.store import Store, glob_escape, sql_file_list

TWO_HOSTS = FIXTURES / "defects" / "two_hosts"  # 2 ranks, 5 events each; rank 1 shifted -5 ms (a COPY)
TWO_RANK = FIXTURES / "handmade" / "two_rank"  # 2 ranks, 3 + 2 events

# (store name, a decoy name the store name matches as a DuckDB glob, or None)
NAMES = [
    ("exp[1]", "exp1"),
    ("glob*store", "globXstore"),
    ("q?x", "qzx"),
    ("x[!a]", "xb"),
    ("br{a,b}", "bra"),
    ("it's", None),
    ("sp ace", None),
    ("ñé-数据", None),
    ("x]y", None),
]


@pytest.mark.parametrize("name,decoy", NAMES, ids=[n for n, _ in NAMES])
def test_store_path_is_literal(tmp_path, name, decoy, capsys):
    if decoy:
        ingest_paths([str(TWO_RANK)], Store(tmp_path / decoy), run_id="mine")  # same id: same file names
    st = Store(tmp_path / name)
    rid = ingest_paths([str(TWO_HOSTS)], st, run_id="mine")
    con = analyses.connect(st)
    assert [r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()] == ["mine"]
    assert con.execute("SELECT rank, events, clock_offset_ns FROM ranks ORDER BY rank").fetchall() == [
        (0, 5, 0), (1, 5, -5_000_000)]
    assert con.execute("SELECT count(*), count(DISTINCT run_id) FROM events").fetchone() == (10, 1)
    assert con.execute("SELECT count(DISTINCT run_id) FROM collective_instances").fetchone() == (1,)
    con.close()
    # the command line says the same
    capsys.readouterr()
    assert main(["runs", "--store", str(tmp_path / name), "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [rid]
    assert main(["sql", "--store", str(tmp_path / name), "--json", "SELECT count(*) AS n FROM ranks"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]


@pytest.mark.parametrize("name", ["t[1]", "t*", "t?", "t{1}", "t'1", "t 1", "tä"])
def test_trace_path_is_literal(tmp_path, name):
    """A trace folder with odd characters next to one its name would match as a pattern."""
    src = tmp_path / name
    shutil.copytree(TWO_HOSTS, src)
    shutil.copytree(TWO_RANK, tmp_path / "t1")  # what t[1], t*, t? would also match
    st = Store(tmp_path / "store")
    ingest_paths([str(src)], st, run_id="r")
    con = st.connect()
    assert con.execute("SELECT rank, events, source_path FROM ranks ORDER BY rank").fetchall() == [
        (0, 5, str(src / "rank0.json")), (1, 5, str(src / "rank1.json"))]
    con.close()


def test_glob_escape_by_hand():
    assert glob_escape("/a/exp[1]/f*?.parquet") == "/a/exp[[]1]/f[*][?].parquet"
    assert glob_escape("/plain/{x}/it's ü]") == "/plain/{x}/it's ü]"
    assert sql_file_list(["/a/it's[", "/b"]) == "['/a/it''s[[]', '/b']"
