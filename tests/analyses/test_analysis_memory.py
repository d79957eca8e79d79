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
