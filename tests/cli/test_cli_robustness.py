"""The CLI's promise under abuse: one line on stderr, exit 2 for bad input, store unchanged.

Each case comes from a newcomer's attempt to break tracekit (see the closing notes).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, REPO, store_snapshot
from tracekit.cli import main


def _one_line_2(rc, err):
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("tracekit: "), (rc, err)
    return lines[0]


def test_usage_errors_without_click_installed():
    """typer >= 0.29 vendors click: a venv without the real click must still get one-line usage errors."""
    code = (
        "import sys; sys.modules['click'] = None\n"
        "from tracekit.cli import main\n"
        "sys.exit(main(['nosuchcmd']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "No such command" in _one_line_2(res.returncode, res.stderr)


def test_ctrl_c_during_a_command_exits_130(monkeypatch, capsys):
    import tracekit.ingest as ing

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ing, "ingest_paths", interrupted)
    rc = main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", "/nonexistent-store"])
    assert rc == 130
    assert capsys.readouterr().err.strip() == "tracekit: interrupted"


@pytest.fixture
def store(tmp_path):
    s = tmp_path / "store"
    assert main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(s), "--run-id", "good"]) == 0
    return s


@pytest.mark.parametrize("query, fragment", [
    ("COPY (SELECT * FROM runs) TO 'x.parquet' (FORMAT parquet)", "not COPY"),
    ("ATTACH '/tmp/evil.duckdb' AS e", "not ATTACH"),
    ("DROP VIEW runs", "not DROP"),
    ("SELECT 1; SELECT 2", "one SQL statement"),
    ("", "empty SQL"),
    ("SELEC nonsense", "SQL error"),
])
def test_sql_only_reads(store, capsys, query, fragment):
    before = store_snapshot(store)
    rc = main(["sql", query, "--store", str(store)])
    assert fragment in _one_line_2(rc, capsys.readouterr().err)
    assert store_snapshot(store) == before


def test_runs_and_sql_on_a_missing_store(tmp_path, capsys):
    for cmd in (["runs"], ["sql", "SELECT 1"]):
        rc = main(cmd + ["--store", str(tmp_path / "nope")])
        assert "no store here" in _one_line_2(rc, capsys.readouterr().err)
    assert not (tmp_path / "nope").exists()


def _doc(rank=None, world=None, events=None, ts=1_000_000.0):
    d = {"traceEvents": events if events is not None else [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": 5.0}]}
    if rank is not None or world is not None:
        d["distributedInfo"] = {k: v for k, v in (("rank", rank), ("world_size", world)) if v is not None}
    return json.dumps(d)


@pytest.mark.parametrize("files, fragment", [
    ({"a.json": _doc(rank=-1, world=2)}, "claims rank -1"),
    ({"a.json": _doc(rank=5, world=2)}, "rank 5 of a world of 2"),
    ({"a.json": _doc(rank=0, world=0)}, "world_size 0"),
    ({"a.json": _doc(rank=2**40)}, "claims rank"),
    ({"a.json": _doc(rank=0, world=2), "b.json": _doc(rank=1, world=4)}, "world_size 4"),
    ({"rank0.json": _doc(rank=0, world=2), "rank1.json": _doc(rank=1, world=2, ts=9_000_000.0)}, "not the same run"),
])
def test_impossible_rank_sets(tmp_path, store, capsys, files, fragment):
    d = tmp_path / "in"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    before = store_snapshot(store)
    rc = main(["ingest", str(d), "--store", str(store)])
    assert fragment in _one_line_2(rc, capsys.readouterr().err)
    assert store_snapshot(store) == before


def test_two_runs_mixed_in_one_folder(tmp_path, store, capsys):
    """rank0 of the TP fixture and rank1 of the EP fixture were recorded minutes apart."""
    d = tmp_path / "mix"
    d.mkdir()
    (d / "rank0.json.gz").write_bytes((FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz").read_bytes())
    (d / "rank1.json.gz").write_bytes((FIXTURES / "ep_2rank" / "rank1.pt.trace.json.gz").read_bytes())
    rc = main(["ingest", str(d), "--store", str(store)])
    assert "not the same run" in _one_line_2(rc, capsys.readouterr().err)


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/zero"])
def test_devices_are_not_trace_files(store, capsys, dev):
    if not os.path.exists(dev):
        pytest.skip(f"{dev} is absent")
    rc = main(["ingest", dev, "--store", str(store)])
    assert "not a regular file" in _one_line_2(rc, capsys.readouterr().err)


def test_deeply_nested_json(tmp_path, store, capsys):
    p = tmp_path / "deep.json"
    p.write_text('{"traceEvents": [{"ph": "X", "args": ' + "[" * 100_000 + "]" * 100_000 + "}]}")
    rc = main(["ingest", str(p), "--store", str(store)])
    assert "deep.json" in _one_line_2(rc, capsys.readouterr().err)


def test_store_under_a_file(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    rc = main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(f / "sub")])
    assert "cannot write to the store" in _one_line_2(rc, capsys.readouterr().err)


def test_abandoned_staging_is_cleaned(store, capsys):
    """A writer killed mid-ingest leaves a staging directory; the next ingest removes it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    junk = store / ".staging" / "abandoned"
    junk.mkdir(parents=True)
    (junk / ".owner-pid").write_text(f"{dead.pid}\n")
    (junk / "half.parquet").write_bytes(b"x" * 100)
    assert main(["ingest", str(FIXTURES / "defects" / "ts_zero.json"), "--store", str(store)]) == 0
    assert not junk.exists() and not (store / ".staging").exists()


def test_bad_jobs_and_chunk_search(store, capsys):
    rc = main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(store), "--jobs", "0"])
    assert "--jobs" in _one_line_2(rc, capsys.readouterr().err)
    rc = main(["predict", "overlap", "--compute", "1ms", "--comm", "1ms", "--chunks", "best",
               "--alpha-chunk", "10us", "--max-chunks", "1000000000"])
    assert "too large" in _one_line_2(rc, capsys.readouterr().err)


def test_html_report_needs_a_file_in_an_existing_folder(store, tmp_path, capsys):
    rc = main(["analyze", "--store", str(store), "--html", str(tmp_path)])
    assert "is a directory" in _one_line_2(rc, capsys.readouterr().err)
    rc = main(["analyze", "--store", str(store), "--html", str(tmp_path / "no" / "such" / "r.html")])
    assert "does not exist" in _one_line_2(rc, capsys.readouterr().err)
    assert not (tmp_path / "no").exists()


def test_ingest_prints_rank_warnings(tmp_path, capsys):
    """A file whose events are all quarantined ingests, and says so on stderr."""
    p = tmp_path / "rank0.json"
    p.write_text(_doc(events=[{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5.0, "dur": -1}]))
    assert main(["ingest", str(p), "--store", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err
    assert "tracekit: warning: rank 0: 1 event(s) quarantined" in err
