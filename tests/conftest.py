"""Shared test helpers: where the repo's fixtures and the shared real traces live."""

from __future__ import annotations

from pathlib import Path

import pytest

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
