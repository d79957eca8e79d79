"""Fuzz that counts hangs: each reader's mutations run with a per-case time limit (a case that
does not answer in time is a hang and fails the test), as do crashes, negative or NaN values and
stores changed by a refused ingest. The harness is benchmarks/fuzz.py (its longer run's figures
are in benchmarks/README.md); here a few cases per reader, to stay fast."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tracekit_bench_fuzz", REPO / "benchmarks" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fuzz
_spec.loader.exec_module(fuzz)

LIMIT_S = 20.0
CASES = {"kineto": 40, "nccl_tests": 25, "nsys": 15}


@pytest.mark.parametrize("reader", sorted(CASES))
def test_mutations_never_hang_crash_or_change_the_store(tmp_path, reader):
    r = fuzz.run_cases(reader, fuzz.make_cases(reader, CASES[reader], seed=7), LIMIT_S, tmp_path)
    c = r["counts"]
    assert sum(c.values()) == CASES[reader]
    assert (c["hang"], c["crash"], c["bad values"], c["store changed"]) == (0, 0, 0, 0), r["failures"]
    assert c["refused"] > 0  # the mutations do damage: some inputs are refused


def test_a_hang_is_counted_not_waited_for(tmp_path, monkeypatch):
    """The harness itself: a case that sleeps past the limit is a hang, and the next case runs."""
    import time

    from tracekit.ingest import ingest_paths as real

    h = fuzz.Harness(fuzz.template_store(tmp_path))
    try:
        import tracekit.ingest

        monkeypatch.setattr(tracekit.ingest, "ingest_paths", lambda *a, **k: time.sleep(60))
        # the worker is forked from this process: its ingest_paths is the sleeping one
        h._restart()
        t0 = time.perf_counter()
        d = tmp_path / "c"
        d.mkdir()
        (d / "rank0.json").write_text("{}")
        kind, _, took = h.run(d / "rank0.json", d / "store", 1.0)
        assert kind == "hang" and took < 10 and time.perf_counter() - t0 < 15
        monkeypatch.setattr(tracekit.ingest, "ingest_paths", real)
        h._restart()
        kind, detail, _ = h.run(d / "rank0.json", d / "store2", LIMIT_S)
        assert kind == "refused" and "no traceEvents array" in detail
    finally:
        h.close()


@pytest.mark.parametrize("case", [51, 449])
def test_sqlite_schema_with_invalid_utf8_is_refused(tmp_path, capsys, case):
    """Fuzz cases (seed 1) whose damaged page leaves invalid UTF-8 in the SQLite schema: SQLite's
    error message quoting it made the reader raise UnicodeDecodeError (exit 1, 'internal error')."""
    from tracekit.cli import main

    name, data = fuzz.make_cases("nsys", case + 1, seed=1)[case]
    p = tmp_path / name
    p.write_bytes(data)
    assert main(["ingest", str(p), "--store", str(tmp_path / "s")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"tracekit: {p}: corrupt or unreadable SQLite database (its schema holds invalid UTF-8: invalid start byte)"
