"""Bad input exits 2 with one line naming the file and the problem, and leaves the store unchanged."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import FIXTURES, store_snapshot
from tracekit.cli import main


@pytest.fixture
def store(tmp_path):
    """A store that already holds one good run, so 'unchanged' means something."""
    s = tmp_path / "store"
    assert main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(s), "--run-id", "good"]) == 0
    return s


def _good_trace_bytes() -> bytes:
    return (FIXTURES / "handmade" / "two_rank" / "rank0.json").read_bytes()


def _cases(tmp_path):
    good = _good_trace_bytes()
    gz = gzip.compress(good * 1)
    cases = {}
    p = tmp_path / "truncated.json.gz"
    p.write_bytes(gz[: len(gz) // 2])
    cases["truncated gzip"] = (p, "truncated gzip")
    p = tmp_path / "notatrace.json"
    p.write_text(json.dumps({"hello": [1, 2, 3]}))
    cases["json not a trace"] = (p, "no traceEvents")
    p = tmp_path / "list.json"
    p.write_text(json.dumps([1, 2, 3]))
    cases["array of numbers"] = (p, "not")
    p = tmp_path / "empty"
    p.mkdir()
    cases["empty directory"] = (p, "no trace files")
    cases["missing path"] = (tmp_path / "nope.json", "no such file")
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    cases["empty file"] = (p, "empty file")
    p = tmp_path / "garbage.json"
    p.write_bytes(bytes(range(256)) * 4)
    cases["binary garbage"] = (p, "not a JSON trace")
    p = tmp_path / "cut.json"
    p.write_bytes(good[: len(good) * 2 // 3])
    cases["truncated json"] = (p, "truncated JSON")
    p = tmp_path / "string.json"
    p.write_text('"just a string"')
    cases["top-level string"] = (p, "not a JSON trace")
    p = tmp_path / "number.json"
    p.write_text("42")
    cases["top-level number"] = (p, "not a JSON trace")
    p = tmp_path / "events_obj.json"
    p.write_text('{"traceEvents": {"ph": "X"}}')
    cases["traceEvents not an array"] = (p, "traceEvents is not an array")
    p = tmp_path / "garbage.json.gz"
    p.write_bytes(gzip.compress(bytes(range(256)) * 8))
    cases["gzip of garbage"] = (p, "not a JSON trace")
    p = tmp_path / "empty.json.gz"
    p.write_bytes(gzip.compress(b""))
    cases["gzip of nothing"] = (p, "empty file")
    p = tmp_path / "badmagic.json.gz"
    p.write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    cases["corrupt gzip header"] = (p, "gzip")
    p = tmp_path / "unclosed.json"
    p.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}')
    cases["array never closed"] = (p, "truncated JSON")
    p = tmp_path / "bad_middle.json"
    p.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}, {"ph": "X", "ts": 2}}, {"ph": "X"}]}')
    cases["malformed event"] = (p, "malformed")  # an event closed twice: not a run of events
    p = tmp_path / "trailing.json"
    p.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}]}\n{"more": 1}')
    cases["trailing data"] = (p, "trailing data after the JSON document at byte 50")
    p = tmp_path / "two_arrays.json"
    p.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1}], "traceEvents": [{"ph": "X", "ts": 2, "dur": 1}]}')
    cases["second traceEvents"] = (p, 'a second "traceEvents" key')
    p = tmp_path / "bad_byte.json"
    p.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 1},\n{"ph": "X", "ts": 2, "dur": 1}}, {"ph": "X"}]}')
    cases["malformed, offset"] = (p, "at byte 79")  # the second "}" of "}}", 0-based
    p = tmp_path / "numbers.json"
    p.write_text('{"traceEvents": [1, 2, 3]}')
    cases["events are numbers"] = (p, "no event objects")
    p = tmp_path / "mixed"
    p.mkdir()
    (p / "rank0.json").write_bytes(good)
    (p / "rank1.json").write_bytes(b"\x00garbage\xff" * 10)
    cases["directory of mixed garbage"] = (p / "rank1.json", "not a JSON trace")
    cases["directory of mixed garbage"] = (p, "rank1.json")
    p = tmp_path / "norank"
    p.mkdir()
    bare = b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 5, "dur": 1}]}'
    (p / "a.json").write_bytes(bare)
    (p / "b.json").write_bytes(bare.replace(b'"a"', b'"b"'))
    cases["ranks not identifiable"] = (p, "cannot tell which rank")
    p = tmp_path / "notsqlite.sqlite"
    p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    cases["sqlite that is not nsys"] = (p, "notsqlite.sqlite")
    p = tmp_path / "notnccl.log"
    p.write_text("hello\nthis is not an nccl-tests log\n")
    cases["log that is not nccl-tests"] = (p, "not an nccl-tests log")
    p = tmp_path / "notrace.json"
    p.write_text('{"traceEvents": []')
    cases["no closing brace"] = (p, "truncated JSON")
    p = tmp_path / "empty_list.json"
    p.write_text("[]")
    cases["empty JSON list"] = (p, "not a trace: a JSON list holds no event objects")
    cases["list of non-events"] = (FIXTURES / "inputs" / "not_a_trace_list.json",
                                   'no item is a trace event (an object with a "ph")')
    p = tmp_path / "null.json"
    p.write_text("null")
    cases["top-level null"] = (p, "not a JSON trace")
    p = tmp_path / "dict_no_events.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": []}))
    cases["dict without traceEvents"] = (p, "no traceEvents array: a JSON dict")
    return cases


CASE_NAMES = [
    "truncated gzip", "json not a trace", "array of numbers", "empty directory", "missing path",
    "empty file", "binary garbage", "truncated json", "top-level string", "top-level number",
    "traceEvents not an array", "gzip of garbage", "gzip of nothing", "corrupt gzip header",
    "array never closed", "malformed event", "trailing data", "second traceEvents", "malformed, offset",
    "events are numbers", "directory of mixed garbage",
    "ranks not identifiable", "sqlite that is not nsys", "log that is not nccl-tests", "no closing brace",
    "empty JSON list", "list of non-events", "top-level null", "dict without traceEvents",
]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_exit_2_one_line_store_unchanged(tmp_path, store, capsys, case):
    path, fragment = _cases(tmp_path)[case]
    before = store_snapshot(store)
    capsys.readouterr()
    rc = main(["ingest", str(path), "--store", str(store)])
    out = capsys.readouterr()
    assert rc == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("tracekit: ")
    assert path.name in lines[0]
    assert fragment in lines[0]
    assert store_snapshot(store) == before


def test_bad_input_into_new_store_creates_nothing(tmp_path, capsys):
    s = tmp_path / "fresh"
    p = tmp_path / "x.json"
    p.write_text("{}")
    assert main(["ingest", str(p), "--store", str(s)]) == 2
    assert not s.exists()


def test_second_rank_file_bad_leaves_store_unchanged(tmp_path, store, capsys):
    """One good rank file and one truncated one: nothing of the run is written."""
    d = tmp_path / "ranks"
    d.mkdir()
    (d / "rank0.json").write_bytes(_good_trace_bytes())
    (d / "rank1.json").write_bytes(_good_trace_bytes()[:300])
    before = store_snapshot(store)
    assert main(["ingest", str(d), "--store", str(store)]) == 2
    assert "rank1.json" in capsys.readouterr().err
    assert store_snapshot(store) == before


def test_reingest_same_files_is_noop(tmp_path, store, capsys):
    before = store_snapshot(store)
    assert main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(store)]) == 0
    assert "run good" in capsys.readouterr().out
    assert store_snapshot(store) == before


def test_duplicate_rank_is_an_error(tmp_path, capsys):
    d = tmp_path / "dup"
    d.mkdir()
    (d / "a.json").write_bytes(_good_trace_bytes())
    (d / "b.json").write_bytes(_good_trace_bytes().replace(b'"traceName": "rank0"', b'"traceName": "copy"'))
    assert main(["ingest", str(d), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "claims rank 0" in err and "a.json" in err and "b.json" in err


def test_analyze_unknown_run_and_empty_store(tmp_path, store, capsys):
    assert main(["analyze", "--store", str(store), "--run", "nope"]) == 2
    assert "not in" in capsys.readouterr().err
    assert main(["analyze", "--store", str(tmp_path / "none")]) == 2
    assert "no runs" in capsys.readouterr().err


def test_nsys_export_without_string_ids_is_refused(tmp_path, store, capsys):
    import sqlite3

    p = tmp_path / "no_strings.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT, "
                "correlationId INT, shortName INT, demangledName INT, globalPid INT)")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1000, 2000, 0, 7, 1, 5, 5, 1)")
    con.commit()
    con.close()
    before = store_snapshot(store)
    capsys.readouterr()
    assert main(["ingest", str(p), "--store", str(store)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no_strings.sqlite: Nsight Systems export without its StringIds table" in lines[0]
    assert store_snapshot(store) == before


def test_a_folder_of_run_folders_names_them(tmp_path, capsys):
    # hta_cpu_only_gloo-style: the traces sit one level down, one folder per run
    top = tmp_path / "runs"
    for name in ("v_head", "v_b8cce2c"):
        (top / name).mkdir(parents=True)
        (top / name / "rank0.json").write_text("{}")
    assert main(["ingest", str(top), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.endswith("it has subfolders (v_b8cce2c/, v_head/): ingest each as its own run")
    assert not (tmp_path / "s").exists()


def test_an_unknown_run_says_how_many_runs_are_not_named(tmp_path, store, capsys):
    # 10 runs: the error names the first 8 and says 2 more (it read as the whole list before)
    for i in range(9):
        assert main(["ingest", str(FIXTURES / "handmade" / "two_rank"), "--store", str(store), "--run-id", f"r{i}"]) == 0
    capsys.readouterr()
    assert main(["analyze", "--store", str(store), "--run", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tracekit: run 'nope' is not in {store} (runs: good, r0, r1, r2, r3, r4, r5, r6, and 2 more: "
                   f"tracekit runs --store {store} lists them)")
