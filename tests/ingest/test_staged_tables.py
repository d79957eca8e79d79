"""Each rank's collectives and summaries go through the staging area, not the driver's memory.

An assemble task writes its rank's collectives and summary tables under ``STORE/.staging/…/parts``
and returns a small result; the driver reads back only the columns the clock alignment needs and
streams the staged files into the run's tables, shifted by each rank's clock offset. Checked here,
with the local engine in the driver's own process (the same functions the Ray engine runs):

* a 16-rank synthetic job on 4 hosts with injected clock offsets (benchmarks/synth_job.py, whose
  truth is independent of tracekit): the stored offsets, every instance's last arrival and every
  collective's end on the run clock are the injected ones, and collectives.parquet holds the
  rows the ranks' tasks staged, in rank order;
* what a task returns holds no table and does not grow with the rank's collectives;
* a staged collectives file that is damaged or missing when the driver reads it: a one-line
  error naming it, the store as it was, no staging directory left;
* after a success the run's directory holds no staged part and ``.staging`` is gone;
* the read task's RankFile holds no comm-metadata row, and unpickled RankFiles share their
  pg_config rank lists.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import tracekit.ingest.assemble as assemble
from tests.conftest import FIXTURES, REPO, shared_trace, store_snapshot
from tracekit.errors import FileError
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


synth = _load("synth_job")
BASE = FIXTURES / "3d_2x2x2" / "rank0.pt.trace.json.gz"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """16 ranks, TP 2 × PP 2 × DP 4, 4 ranks per host (4 clocks), straggler rank 9."""
    d = tmp_path_factory.mktemp("synth16")
    return synth.make_job(d / "job", 16, BASE, layout="tp2xpp2xdp", seed=3, straggler=9, gpus_per_node=4,
                          compute_events=30)


def _keep_results(monkeypatch) -> list:
    """Wrap assemble_rank so the test sees what each task returned (and pickled sizes)."""
    seen = []
    real = assemble.assemble_rank

    def spy(task):
        out = real(task)
        seen.append((task, out))
        return out

    monkeypatch.setattr(assemble, "assemble_rank", spy)
    return seen


def test_synth_job_offsets_and_ends_are_the_injected_ones(job, tmp_path, monkeypatch):
    seen = _keep_results(monkeypatch)
    st = Store(tmp_path / "store")
    ingest_paths([Path(job["traces_dir"])], st, run_id="r", jobs=1)
    import tracekit

    run = tracekit.open(st.path).run("r")
    got = run.sql("SELECT clock_offset_ns FROM ranks ORDER BY rank").df()["clock_offset_ns"].tolist()
    assert got == job["clock_offset_ns"]
    assert len(set(got)) == 4  # four hosts, four clocks: the alignment ran and moved three of them
    # every collective ends at its instance's true end once shifted by its rank's offset
    rows = run.sql("SELECT rank, pg_name, seq, ts_ns + dur_ns AS end_ns FROM collectives").df()
    ends = {(t["pg_name"], t["seq"]): t["end_ns"] for t in job["instances"]}
    assert len(rows) == sum(len(t["ranks"]) for t in job["instances"])
    assert all(e == ends[(p, int(s))] for p, s, e in zip(rows["pg_name"], rows["seq"], rows["end_ns"]))
    inst = run.instances().set_index(["pg_name", "seq"])
    for t in job["instances"]:
        row = inst.loc[(t["pg_name"], t["seq"])]
        assert int(row["straggler"]) == t["last_arrival_rank"] and int(row["last_arrival_ns"]) == t["last_arrival_ns"]
    # the rows are in rank order, each rank's in its task's order (what the staged files held)
    coll = pq.read_table(st.run_dir("r") / "collectives.parquet")
    assert coll.column("rank").to_pylist() == sorted(coll.column("rank").to_pylist())
    # the tasks returned no table: a few kB each, the same for every rank whatever it ran
    assert len(seen) == 16
    for _task, res in seen:
        assert not any(hasattr(res, a) for a in ("collectives", "windows", "spans"))
        assert len(pickle.dumps(res)) < 4096
    # nothing staged is left: no parts in the run, no .staging in the store
    assert not (st.run_dir("r") / "parts").exists()
    assert not (st.path / ".staging").exists()
    assert sorted(p.name for p in st.run_dir("r").iterdir()) == [
        "collective_steps.parquet", "collectives.parquet", "critical_path_nodes.parquet", "events",
        "gpu_breakdown_summary.parquet", "gpu_launcher_summary.parquet", "gpu_op_durations.parquet",
        "overlap_summary.parquet", "rank_critical_path.parquet", "rank_critical_path_summary.parquet",
        "rank_steps.parquet", "ranks.parquet", "run.parquet", "span_overlap.parquet"]


def test_a_rank_of_many_collectives_sends_the_driver_a_few_kb(tmp_path, monkeypatch):
    """A real DDP rank (2,020 all-reduces: ~300 kB as a collectives table) returns under 4 kB."""
    src = shared_trace("hta_ddp_v100_r1of2/df_index_resolver.json.gz")
    seen = _keep_results(monkeypatch)
    st = Store(tmp_path / "store")
    ingest_paths([src], st, run_id="r", jobs=1)
    n = pq.read_metadata(st.run_dir("r") / "collectives.parquet").num_rows
    assert n == 2020
    ((_task, res),) = seen
    assert len(pickle.dumps(res)) < 4096


def _damage(monkeypatch, rank: int, how: str) -> list:
    """After rank ``rank``'s task: truncate (``how`` = damaged) or delete (missing) its staged
    collectives file; returns the path (filled in when done)."""
    real = assemble.assemble_rank
    where = []

    def task(t):
        out = real(t)
        if t.rank == rank:
            f = assemble.part_path(t.parts, "collectives", rank)
            where.append(f)
            if how == "missing":
                f.unlink()
            else:
                data = f.read_bytes()
                f.write_bytes(data[: len(data) // 2])
        return out

    monkeypatch.setattr(assemble, "assemble_rank", task)
    return where


@pytest.mark.parametrize("how, problem", [("damaged", "rank 1's staged collectives table cannot be read ("),
                                          ("missing", "rank 1's staged collectives table is missing")])
def test_bad_staged_collectives_is_one_line_and_leaves_the_store(tmp_path, monkeypatch, capsys, how, problem):
    from tracekit.cli import main

    st = Store(tmp_path / "store")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="old")
    before = store_snapshot(st.path)
    where = _damage(monkeypatch, 1, how)
    capsys.readouterr()
    rc = main(["ingest", str(FIXTURES / "3d_2x2x2"), "--store", str(st.path), "--run-id", "new", "--jobs", "1"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(lines) == 1 and lines[0].startswith(f"tracekit: {where[0]}: {problem}"), lines
    assert store_snapshot(st.path) == before  # no half-written run, no staging directory left
    assert not (st.path / ".staging").exists()


def test_bad_staged_collectives_before_the_clock_alignment(job, tmp_path, monkeypatch):
    """On 4 hosts the alignment reads the staged collectives first: the damaged one is named there."""
    where = _damage(monkeypatch, 5, "damaged")
    st = Store(tmp_path / "store")
    with pytest.raises(FileError) as e:
        ingest_paths([Path(job["traces_dir"])], st, run_id="r", jobs=1)
    assert str(e.value).startswith(f"{where[0]}: rank 5's staged collectives table cannot be read (")
    assert "\n" not in str(e.value)
    assert not st.path.exists() or not any(st.path.iterdir())  # nothing committed, no staging left


def test_read_part_refuses_another_tables_file(tmp_path):
    """A staged file holding some other table (the wrong columns) is refused, naming it."""
    import pyarrow as pa

    (tmp_path / "collectives").mkdir()
    f = assemble.part_path(tmp_path, "collectives", 3)
    import pyarrow.feather as feather

    feather.write_feather(pa.table(dict(x=[1, 2])), f)
    with pytest.raises(FileError, match=r"rank 3's staged collectives table cannot be read \(its columns are not"):
        assemble.read_part(tmp_path, "collectives", 3)


def test_what_the_read_task_returns_holds_no_metadata_rows_and_shares_rank_lists(tmp_path):
    """The Kineto reader writes every comm-metadata row to the staging area (none travels in the
    RankFile), and unpickled RankFiles share their equal pg_config rank lists (one list of a
    group's ranks, not one per rank file)."""
    from tracekit.ingest import _read_one

    got = []
    for r in (0, 1):
        ((rf, _stage),) = _read_one((str(FIXTURES / "3d_2x2x2" / f"rank{r}.pt.trace.json.gz"),
                                     str(tmp_path / f"r{r}.arrow"), (), None))
        assert rf.meta_pending == 0 and not rf._meta_parts and rf.meta_path is not None
        assert rf.meta_table().num_rows > 0  # the rows are in the table on disk
        got.append(pickle.loads(pickle.dumps(rf)))
    world = [[pg["ranks"] for pg in g.meta["distributedInfo"]["pg_config"] if len(pg["ranks"]) == 8] for g in got]
    assert world[0] and world[0][0] == list(range(8))
    assert world[0][0] is world[1][0]
