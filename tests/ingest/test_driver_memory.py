"""What keeps the ingest driver's memory flat with the ranks (tracekit.ingest.engine,
tracekit.ingest.assemble.finish_run, tracekit.ingest.staging.RankFile):

* the Ray engine keeps at most ``in_flight`` tasks submitted and not yet taken (a stand-in ``ray``
  module counts them; no cluster needed), results in task order whatever order they finish in, and
  after a failing task submits no more;
* a run's tables are written in row groups bounded in bytes (ROW_GROUP_BYTES) as well as rows, with
  the same rows in the same order as one row group;
* finish_run runs on the system allocator and gives the caller's Arrow pool back;
* unpickled RankFiles share equal GPUs, INFO and process groups (one object, not one per rank).
"""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tracekit.ingest.assemble as assemble
import tracekit.ingest.engine as engine
from tests.conftest import FIXTURES
from tracekit.errors import TracekitError
from tracekit.ingest import ingest_paths
from tracekit.ingest.staging import RankFile
from tracekit.store import Store


class _Ref:
    def __init__(self, fn, task):
        self.fn, self.task = fn, task


def _fake_ray(cpus: int, finish_last: bool = True):
    """A stand-in ``ray`` module: ``wait`` finishes one pending task (the newest when
    ``finish_last``: out of submission order), ``get`` runs it; ``state`` counts what the driver
    holds (submitted and not yet taken) and its most."""
    state = dict(held=0, most=0, submitted=0, cancelled=0)

    class RayError(Exception):
        pass

    class RayTaskError(RayError):
        pass

    def wait(pending, num_returns=1, timeout=None):
        assert num_returns == 1 or timeout is not None
        if timeout is not None:  # _cancel's wait for the cancelled tasks
            return list(pending), []
        i = len(pending) - 1 if finish_last else 0
        return [pending[i]], pending[:i] + pending[i + 1:]

    def get(ref):
        state["held"] -= 1
        return ref.fn(ref.task)

    def cancel(ref, force=False):
        state["cancelled"] += 1

    mod = types.SimpleNamespace(wait=wait, get=get, cancel=cancel, cluster_resources=lambda: {"CPU": cpus},
                                exceptions=types.SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError))

    class Remote:
        def remote(self, fn, task):
            state["submitted"] += 1
            state["held"] += 1
            state["most"] = max(state["most"], state["held"])
            return _Ref(fn, task)

    return mod, Remote(), state


def _engine(monkeypatch, cpus: int, finish_last: bool = True):
    mod, remote, state = _fake_ray(cpus, finish_last)
    monkeypatch.setitem(sys.modules, "ray", mod)
    eng = engine.RayEngine(address=None)
    eng._remote = remote
    return eng, state


def _square(x):
    return x * x


@pytest.mark.parametrize("cpus, window", [(2, engine.RAY_IN_FLIGHT_MIN), (10, 10 * engine.RAY_IN_FLIGHT_PER_CPU)])
def test_ray_map_keeps_a_window_of_tasks_in_flight(monkeypatch, cpus, window):
    eng, state = _engine(monkeypatch, cpus)
    assert eng.in_flight(sys.modules["ray"]) == window == max(16, 4 * cpus)
    tasks = list(range(300))
    done = []
    out = eng.map(_square, tasks, [f"f{i}" for i in tasks], progress=lambda advance: done.append(advance))
    assert out == [i * i for i in tasks]  # task order, though the newest task finishes first
    assert state["submitted"] == 300 and state["held"] == 0
    assert state["most"] == window  # never more in flight than the window, and the window used
    assert done == [1] * 300


def test_ray_map_in_order_finishing(monkeypatch):
    eng, state = _engine(monkeypatch, 2, finish_last=False)
    assert eng.map(_square, [3, 1, 2], ["a", "b", "c"]) == [9, 1, 4]
    assert state["most"] == 3  # fewer tasks than the window: all at once


def _fails_at_40(x):
    if x == 40:
        raise TracekitError(f"file{x}: bad")
    return x


def test_ray_map_stops_submitting_after_a_failure(monkeypatch):
    eng, state = _engine(monkeypatch, 2, finish_last=False)  # in order: task 40 fails 41st
    with pytest.raises(TracekitError, match="^file40: bad$"):
        eng.map(_fails_at_40, list(range(1000)), [f"file{i}" for i in range(1000)])
    # 40 taken, the failing one, and the window's 15 others submitted: cancelled, nothing more
    assert state["submitted"] == 41 + engine.RAY_IN_FLIGHT_MIN - 1
    assert state["cancelled"] == engine.RAY_IN_FLIGHT_MIN - 1


def test_in_flight_floor_when_the_cluster_cannot_say(monkeypatch):
    eng, _ = _engine(monkeypatch, 0)

    def broken():
        raise RuntimeError("no GCS")

    sys.modules["ray"].cluster_resources = broken
    assert eng.in_flight(sys.modules["ray"]) == engine.RAY_IN_FLIGHT_MIN


def _rows(path: Path) -> list:
    return pq.read_table(path).to_pylist()


def test_row_groups_bounded_in_bytes_same_rows(tmp_path, monkeypatch):
    """fixtures/3d_2x2x2 (8 ranks, every one with collectives): by default one row group of the
    run's collectives; with ROW_GROUP_BYTES = 1 each rank's table flushes its own, 8 row groups, and
    every table holds the same rows in the same order."""
    one, many = Store(tmp_path / "one"), Store(tmp_path / "many")
    ingest_paths([FIXTURES / "3d_2x2x2"], one, run_id="r")
    monkeypatch.setattr(assemble, "ROW_GROUP_BYTES", 1)
    ingest_paths([FIXTURES / "3d_2x2x2"], many, run_id="r")
    a, b = one.run_dir("r") / "collectives.parquet", many.run_dir("r") / "collectives.parquet"
    ranks = pq.read_table(a, columns=["rank"]).column("rank").to_pylist()
    assert len(set(ranks)) == 8 and ranks == sorted(ranks)
    assert pq.ParquetFile(a).num_row_groups == 1
    assert pq.ParquetFile(b).num_row_groups == 8
    assert [pq.ParquetFile(b).metadata.row_group(i).num_rows for i in range(8)] == \
        [ranks.count(r) for r in sorted(set(ranks))]
    for name in ("collectives", "overlap_summary", "span_overlap", "gpu_breakdown_summary", "gpu_launcher_summary"):
        assert _rows(one.run_dir("r") / f"{name}.parquet") == _rows(many.run_dir("r") / f"{name}.parquet"), name


def test_finish_run_on_the_system_pool_then_the_callers(tmp_path, monkeypatch):
    other = next((getattr(pa, f)() for f in ("mimalloc_memory_pool", "jemalloc_memory_pool")
                  if _pool_available(f)), None)
    if other is None:
        pytest.skip("pyarrow built without mimalloc and jemalloc: no other pool to restore")
    seen = []
    real = assemble._run_row

    def run_row(*a, **k):
        seen.append(pa.default_memory_pool().backend_name)
        return real(*a, **k)

    monkeypatch.setattr(assemble, "_run_row", run_row)
    before = pa.default_memory_pool()
    pa.set_memory_pool(other)
    try:
        ingest_paths([FIXTURES / "tp_2rank"], Store(tmp_path / "s"), run_id="r")
        assert seen == ["system"]
        assert pa.default_memory_pool().backend_name == other.backend_name
    finally:
        pa.set_memory_pool(before)


def _pool_available(factory: str) -> bool:
    try:
        getattr(pa, factory)()
        return True
    except (NotImplementedError, AttributeError, pa.ArrowException):
        return False


def _rank_file(rank: int, groups: list) -> RankFile:
    meta = dict(deviceProperties=[dict(id=0, name="NVIDIA A100-SXM4-80GB", totalGlobalMem=85_000_000_000)],
                INFO=["Enabling GPU tracing"], host_name=f"node{rank // 4}",
                distributedInfo=dict(rank=rank, world_size=8, pg_config=groups))
    return RankFile(path=Path(f"rank{rank}.json"), sha256=str(rank), meta=meta)


def test_unpickled_rank_files_share_equal_metadata():
    world = dict(pg_name="0", pg_desc="default_pg", pg_size=8, ranks=list(range(8)))
    tp = [dict(pg_name=str(1 + r // 2), pg_desc="tp", pg_size=2, ranks=[r - r % 2, r - r % 2 + 1]) for r in range(8)]
    got = [pickle.loads(pickle.dumps(_rank_file(r, [dict(world), dict(tp[r])]))) for r in range(8)]
    assert all(g.meta["deviceProperties"] is got[0].meta["deviceProperties"] for g in got)
    assert all(g.meta["INFO"] is got[0].meta["INFO"] for g in got)
    pgs = [g.meta["distributedInfo"]["pg_config"] for g in got]
    assert all(p[0] is pgs[0][0] for p in pgs)  # the world group: one dict for the 8 ranks
    assert pgs[0][1] is pgs[1][1] and pgs[2][1] is pgs[3][1]  # a TP pair's group: one for both
    assert pgs[1][1] is not pgs[2][1] and pgs[1][1] != pgs[2][1]
    assert pgs[5][1] == dict(pg_name="3", pg_desc="tp", pg_size=2, ranks=[4, 5])
    assert [g.meta["distributedInfo"]["rank"] for g in got] == list(range(8))  # per-rank values kept
    assert [g.meta["host_name"] for g in got] == [f"node{r // 4}" for r in range(8)]
