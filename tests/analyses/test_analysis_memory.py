"""Analyses run within a small DuckDB memory budget, and a statement that does not fit is retried
with a larger one instead of failing the report."""

from __future__ import annotations

from tracekit import analyses
import duckdb
import pytest

import tracekit.store as store_mod
from tracekit.store import AnalysisConnection

_QUERIES = [
    "SELECT * FROM overlap_windows ORDER BY ALL",
    "SELECT * FROM collective_instances ORDER BY ALL",
    "SELECT * FROM collective_overlap ORDER BY ALL",
    "SELECT * FROM collective_verdicts ORDER BY ALL",
]


def test_statements_that_run_out_of_memory_are_retried_with_a_larger_budget(session_store, monkeypatch):
    st = session_store("tp")
    want = [analyses.connect(st).execute(q).fetchall() for q in _QUERIES]
    monkeypatch.setattr(store_mod, "ANALYSIS_MEMORY_LIMIT", 64 * 1024)  # too small for anything
    con = analyses.connect(st)
    assert [con.execute(q).fetchall() for q in _QUERIES] == want
    assert con.memory_limit > 64 * 1024  # raised while the analyses were built


def test_a_statement_that_never_fits_still_fails(monkeypatch):
    monkeypatch.setattr(store_mod, "ANALYSIS_MEMORY_MAX", 1024 * 1024)
    con = AnalysisConnection(duckdb.connect(), 256 * 1024)
    with pytest.raises(duckdb.OutOfMemoryException):
        con.execute("SELECT list(range(i, i + 100)) FROM range(3000000) t(i) ORDER BY random()").fetchall()
    assert con.memory_limit == 1024 * 1024
    assert con.execute("SELECT 42").fetchone() == (42,)  # the connection still works


@pytest.mark.parametrize("events, cores, want", [
    (0, 2, 1),  # an nccl-tests log: no events
    (987_032, 2, 1),  # ×8 of the HTA DDP trace
    (4_000_000, 2, 1),  # one thread's worth exactly
    (4_000_001, 2, 2),
    (15_792_512, 2, 2),  # ×128: ceil(3.95) = 4, capped at the cores
    (15_792_512, 16, 4),
    (10**12, 16, 16),
])
def test_analysis_threads(events, cores, want):
    assert analyses.analysis_threads(events, cores) == want


def test_a_connection_runs_on_the_threads_its_events_ask_for(session_store, monkeypatch):
    """tp_2rank's few thousand events: one thread; with a thread per 10 events, as many as DuckDB has."""
    st = session_store("tp")
    con = analyses.connect(st)
    (events,) = con.execute("SELECT sum(events) FROM ranks").fetchone()
    assert 10 < events < analyses.EVENTS_PER_THREAD
    assert con.execute("SELECT current_setting('threads')").fetchone() == (1,)
    con.close()
    cores = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]
    monkeypatch.setattr(analyses, "EVENTS_PER_THREAD", 10)
    con = analyses.connect(st)
    assert con.execute("SELECT current_setting('threads')").fetchone() == (min(cores, -(-events // 10)),)
    con.close()
