"""The staged per-rank tables on a real Ray cluster (two nodes of one CPU, as in test_ray_engine):
the assemble tasks run in Ray workers and write their collectives and summaries to the staging
area; a staged collectives file damaged after its task finished fails the ingest with one line
naming it, the store stays as it was and no staging directory is left; a success leaves none
either. Skips when Ray is not installed."""

from __future__ import annotations

import importlib.util

import pytest

import tracekit.ingest.assemble as assemble
from tests.conftest import two_node_ray_cluster, FIXTURES, store_snapshot
from tracekit.errors import FileError
from tracekit.ingest import ingest_paths
from tracekit.store import Store

HAVE_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture(scope="module")
def cluster():
    yield from two_node_ray_cluster(__name__)  # _truncating, in the workers


_REAL = assemble.assemble_rank


def _truncating(task):
    """assemble_rank, then rank 3's staged collectives file cut in half (in the Ray worker)."""
    out = _REAL(task)
    if task.rank == 3:
        f = assemble.part_path(task.parts, "collectives", 3)
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    return out


def test_damaged_staged_collectives_on_ray(cluster, tmp_path, monkeypatch):
    st = Store(tmp_path / "store")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="old", engine="ray")
    assert not (st.path / ".staging").exists()  # a success leaves no staging directory
    assert not (st.run_dir("old") / "parts").exists()
    before = store_snapshot(st.path)
    monkeypatch.setattr(assemble, "assemble_rank", _truncating)
    with pytest.raises(FileError) as e:
        ingest_paths([FIXTURES / "3d_2x2x2"], st, run_id="new", engine="ray")
    bad = e.value.path  # STORE/.staging/<pid>-<id>/parts/collectives/rank=3.arrow
    assert bad.startswith(f"{st.path.resolve()}/.staging/") and bad.endswith("/parts/collectives/rank=3.arrow")
    assert str(e.value).startswith(f"{bad}: rank 3's staged collectives table cannot be read (")
    assert "\n" not in str(e.value)
    assert store_snapshot(st.path) == before
    assert not (st.path / ".staging").exists()
