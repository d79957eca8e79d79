"""Shared test helpers: where the repo's fixtures and the shared real traces live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The reports size their tables to $COLUMNS when piped (tracekit.report.textfmt.output_console), and
# pytest-xdist's workers set COLUMNS=80: the tests assert the output of an unset $COLUMNS (a test
# about the width sets its own with monkeypatch).
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"


def shared_trace(rel: str) -> Path:
    """Path of a file or folder under ../shared/traces, or skip the test with the reason."""
    p = TRACES / rel
    if not p.exists():
        pytest.skip(f"../shared/traces/{rel} is not available (a fresh clone has no ../shared)")
    return p


def store_snapshot(path: Path) -> dict[str, bytes]:
    """Every file under a store directory with its bytes, to prove a failed ingest changed nothing."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


SERIAL_FILES = frozenset({"tests/ingest/test_ray_engine.py", "tests/ingest/test_ray_staged_tables.py",
                          "tests/ingest/test_bounded_procs.py"})
"""Test files that start Ray clusters or count a command's processes: run one at a time, like the
``slow`` tests (real multi-process jobs whose assertions read their timing)."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group the tests for pytest-xdist (``--dist loadgroup``, pyproject's addopts): the ``slow``
    tests and :data:`SERIAL_FILES` form one group, run first and one at a time on one worker, so
    that two multi-process jobs never share the cores; every other test is grouped by its file, so a
    module-scoped store is built once."""
    serial, rest = [], []
    for item in items:
        path = item.nodeid.split("::")[0]
        if item.get_closest_marker("slow") or path in SERIAL_FILES:
            item.add_marker(pytest.mark.xdist_group("serial"))
            serial.append(item)
        else:
            item.add_marker(pytest.mark.xdist_group(path))
            rest.append(item)
    items[:] = serial + rest
