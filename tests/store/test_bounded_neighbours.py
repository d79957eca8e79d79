"""Bad neighbours are bad input: a run_config.json beside the traces is checked against its schema
(exit 2 naming the key, nothing stored); a damaged run.parquet affects its own run alone; run ids
are matched whole."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import FIXTURES, store_snapshot
from tracekit.cli import main
from tracekit.errors import StoreError

TWO = FIXTURES / "handmade" / "two_rank"


def _traces_with_config(tmp_path, text: str):
    d = tmp_path / "traces"
    shutil.copytree(TWO, d)
    (d / "run_config.json").write_text(text)
    return d


def _deep(n: int) -> str:
    return '{"a": ' + "[" * n + "1" + "]" * n + "}"


CONFIGS = {
    "workload a list": ('{"workload": ["tp"]}', "key 'workload' must be a string, not a list"),
    "workload an object": ('{"workload": {"a": 1}}', "key 'workload' must be a string, not an object"),
    "chunks a string": ('{"overlap_chunks": "3"}', "key 'overlap_chunks' must be an integer >= 1, not a string"),
    "layers zero": ('{"layers": 0}', "key 'layers' must be an integer >= 1, not an integer"),
    "stages a bool": ('{"stages": true}', "key 'stages' must be an integer >= 1, not a boolean"),
    "integer beyond 64 bits": ('{"layers": 1%s}' % ("0" * 30), "key 'layers': the integer 1000"),
    "nested integer beyond 64 bits": ('{"timing": {"x": [-1%s]}}' % ("0" * 25), "key 'timing.x[0]'"),
    "NaN": ('{"microbatches": NaN}', "not valid JSON (NaN is not a JSON number"),
    "Infinity deep": ('{"expected": {"messages": [{"bytes": -Infinity}]}}', "-Infinity is not a JSON number"),
    "nested 40 deep": (_deep(40), "key 'a[0]"),
    "nested 100000 deep": (_deep(100000), "nests deeper than 32 levels"),
    "lone surrogate": ('{"workload": "a\\ud800b"}', "key 'workload': a string with a lone UTF-16 surrogate"),
    "a list": ("[1, 2]", "a run config must be a JSON object, not a list"),
    "not JSON": ("{workload: tp}", "not valid JSON"),
    "overlap model kind": ('{"overlap_model": {"kind": 3}}', "key 'overlap_model' must be"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_bad_run_config_exit_2_naming_the_key(tmp_path, capsys, case):
    text, fragment = CONFIGS[case]
    d = _traces_with_config(tmp_path, text)
    s = tmp_path / "store"
    assert main(["ingest", str(TWO), "--store", str(s), "--run-id", "good"]) == 0
    before = store_snapshot(s)
    capsys.readouterr()
    assert main(["ingest", str(d), "--store", str(s)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "run_config.json" in err[0] and fragment in err[0], err[0]
    assert store_snapshot(s) == before


def test_good_run_config_is_read(tmp_path, capsys):
    cfg = {"workload": "tp", "overlap_chunks": 4, "layers": None, "extra": {"anything": [1, 2.5, "x"]}}
    d = _traces_with_config(tmp_path, json.dumps(cfg))
    s = tmp_path / "store"
    assert main(["ingest", str(d), "--store", str(s), "--run-id", "r"]) == 0
    capsys.readouterr()
    assert main(["sql", "SELECT workload, config FROM runs", "--store", str(s), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["workload"] == "tp"
    stored = json.loads(row["config"])
    assert stored["overlap_chunks"] == 4 and stored["extra"] == {"anything": [1, 2.5, "x"]}


@pytest.fixture
def damaged(tmp_path):
    """Runs 'a' then 'b' (the newest); b's run.parquet overwritten with garbage."""
    s = tmp_path / "store"
    assert main(["ingest", str(TWO), "--store", str(s), "--run-id", "a"]) == 0
    assert main(["ingest", str(FIXTURES / "tp_2rank"), "--store", str(s), "--run-id", "b"]) == 0
    (s / "runs" / "b" / "run.parquet").resolve().write_bytes(b"PAR1 this is not parquet PAR1")
    return s


def test_damaged_run_affects_that_run_alone(damaged, tmp_path, capsys):
    s = str(damaged)
    capsys.readouterr()
    assert main(["runs", "--store", s, "--json"]) == 0
    cap = capsys.readouterr()
    assert [r["run_id"] for r in json.loads(cap.out)] == ["a"]
    assert "the run 'b' is damaged" in cap.err
    # the newest readable run is the default; the other run's report, export and SQL work
    assert main(["analyze", "--store", s, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["run_id"] == "a"
    assert main(["analyze", "--store", s, "--run", "a"]) == 0
    assert main(["export", "--store", s, "--run", "a", "--perfetto", str(tmp_path / "a.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["traceEvents"]
    capsys.readouterr()
    assert main(["sql", "SELECT DISTINCT run_id FROM collectives", "--store", s, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"run_id": "a"}]
    # the damaged run itself: one line, exit 2
    capsys.readouterr()
    assert main(["analyze", "--store", s, "--run", "b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the run 'b' is damaged" in err[0]


def test_api_raises_store_error_for_the_damaged_run(damaged):
    import tracekit.api

    sess = tracekit.api.open(damaged)
    with pytest.raises(StoreError, match="the run 'b' is damaged"):
        sess.run("b").report()
    assert sess.run("a").report()["run"]["run_id"] == "a"
    assert sess.run().run_id == "a"


@pytest.mark.parametrize("bad", ["abc\n", "abc\r", "a\nb", "abc ", ""])
def test_run_ids_matched_whole(tmp_path, capsys, bad):
    from tracekit.store import check_run_id

    with pytest.raises(StoreError, match="invalid run id"):
        check_run_id(bad)
    assert main(["ingest", str(TWO), "--store", str(tmp_path / "s"), "--run-id", bad]) == 2
    assert not (tmp_path / "s").exists()
