"""The numpy link pass (tracekit.ingest.linkpass) against the SQL one it replaced (tests/reference_link.py).

Both read the same staging rows; the events rows, the comm spans, their launch calls and
the clipping/skew counts must be identical: on every fixture and shared trace, and on
random staging files full of ties, nulls, duplicate correlation ids and odd names.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import tracekit.ingest.assemble as assemble
from tracekit.ingest import ingest_paths
from tracekit.ingest.linkpass import link_rank
from tracekit.ingest.staging import RAW_SCHEMA, _BatchWriter, open_stage_writer

from conftest import FIXTURES, TRACES
from reference_link import reference_link


def _read_stage(path) -> pa.Table:
    with pa.OSFile(str(path)) as fh:
        return pa.ipc.open_stream(fh).read_all()


def _rows_differ(a: Path, b: Path) -> tuple[int, int]:
    con = duckdb.connect()
    qa, qb = f"SELECT * FROM read_parquet('{a}')", f"SELECT * FROM read_parquet('{b}')"
    return (con.execute(f"SELECT count(*) FROM ({qa} EXCEPT ALL {qb})").fetchone()[0],
            con.execute(f"SELECT count(*) FROM ({qb} EXCEPT ALL {qa})").fetchone()[0])


def _check_against_reference(raw, out, run_id, rank, cpu_only, steps, got, tmp_path, pdl=False):
    ref_out, spans, launches, stats = reference_link(_read_stage(raw), run_id, rank, cpu_only, steps, tmp_path, pdl)
    ref_events = tmp_path / f"ref_events_{rank}_cols.parquet"
    duckdb.connect().execute(f"COPY (SELECT * EXCLUDE (overlaps_next) FROM read_parquet('{ref_out}')) "
                             f"TO '{ref_events}' (FORMAT parquet)")
    assert _rows_differ(out, ref_events) == (0, 0)
    assert got.spans.to_dict() == spans
    assert got.launches.to_dict() == launches
    assert (got.n_clipped, got.max_clip_ns, got.n_skew, got.max_skew_ns, got.same_stream_overlaps) == stats
    n, lo, hi = duckdb.connect().execute(
        f"SELECT count(*), min(ts_ns), max(ts_ns + dur_ns) FROM read_parquet('{out}')").fetchone()
    assert (got.ts_lo, got.ts_hi) == (lo, hi)
    return n


_TARGETS = [
    "fixtures/tp_2rank",
    "fixtures/ep_2rank",
    "fixtures/pp_decode_2rank",
    "fixtures/kv_layerwise_2rank",
    "fixtures/handmade/two_rank",
    "fixtures/defects/kernel_before_launch.json",
    "fixtures/defects/overlapping_kernels.json",
    "fixtures/defects/sync_not_compute.json",
    "fixtures/defects/custom_allreduce.json",
    "fixtures/inputs/cpu_nccl_2rank",
    "fixtures/inputs/stream_overlap_h100.json",
    "fixtures/inputs/stream_overlap_v100.json",
    "traces/param_dlrm_8rank_v100",
    "traces/hta_nccl_parser_a100_r0of2",
    "traces/hta_pyper_a100_r0of16",
    "traces/tracelens_b200_r0of8",
    "traces/hta_cpu_only_gloo/v_b8cce2c",
    "traces/kineto_legacy_2021/worker0.pt.trace.json.gz",
    "traces/single_gpu_compute/mi300",
    "traces/pipit_nsys_sqlite/perlmutter-cloverleaf-cuda.sqlite",
]


@pytest.mark.parametrize("rel", _TARGETS)
def test_link_pass_equals_the_sql_reference(rel, tmp_path, monkeypatch):
    if rel.startswith("traces/"):
        src = TRACES / rel[len("traces/"):]
        if not src.exists():
            pytest.skip(f"../shared/{rel} is not available")
    else:
        src = FIXTURES.parent / rel
    seen = []

    def checked(raw, out, run_id, rank, cpu_only, steps, *args, pdl=False, **kwargs):  # kwargs: writer_cls
        got = link_rank(raw, out, run_id, rank, cpu_only, steps, *args, pdl=pdl, **kwargs)
        seen.append(_check_against_reference(raw, out, run_id, rank, cpu_only, steps, got, tmp_path, pdl))
        return got

    monkeypatch.setattr(assemble, "link_rank", checked)
    ingest_paths([src], tmp_path / "store")
    assert seen and sum(seen) > 0


_CATS = ["runtime", "driver", "kernel", "memcpy", "memset", "sync", "cpu_op", "user_annotation", "python", None]
_NAMES = ["cudaLaunchKernel", "cudaStreamSynchronize", "hipEventSynchronize", "cuda_sync_wait", "c10d::send",
          "c10d::recv_", "gloo:send", "gloo:recv", "gloo:all_reduce", "nccl:all_reduce", "record_param_comms",
          "c10d::allreduce_", "c10d::wait", "aten::mm", "ncclKernel_AllReduce", "gemm", "", None,
          "CUDASTREAMSYNCHRONIZE", "cudaStreamſynchronize", "cudaStreamSynchronİze"]  # ASCII case folding only


def _random_stage(path: Path, rng: np.random.Generator, n: int, batches: int, ts_order: str = "random",
                  cpu_comm: bool = True) -> None:
    """A staging file of n random rows in ``batches`` batches (each its own dictionaries).

    ``ts_order``: "random" starts; "sorted": non-decreasing in file order (ties kept), so every
    stream's ops are in start order;
    "late_inversion": sorted except one step back in the last batch. ``cpu_comm`` False: no CPU
    row is comm (no gloo spans: a CPU-only rank's collective CPU calls become its communication).
    """
    w = open_stage_writer(path)
    first = 0
    if ts_order == "random":
        all_ts = rng.integers(1, 400, n)
    else:
        all_ts = 1 + np.cumsum(rng.integers(0, 3, n))
        if ts_order == "late_inversion":
            all_ts[n - 2] = all_ts[n - 1] + 5  # one row starts after the next one
    for size in np.diff(np.linspace(0, n, batches + 1).astype(int)):
        size = int(size)

        def ints(lo, hi, null_p):
            v = rng.integers(lo, hi, size)
            return pa.array([None if rng.random() < null_p else int(x) for x in v], pa.int64())

        def strs(choices):
            return pa.array([choices[i] for i in rng.integers(0, len(choices), size)], pa.string()).dictionary_encode()

        gpu = rng.random(size) < 0.4
        batch = pa.record_batch(
            [
                pa.array(np.arange(first, first + size), pa.int64()),
                pa.array(["gpu_stream" if g else "cpu_thread" for g in gpu], pa.string()).dictionary_encode(),
                ints(0, 3, 0.05),
                ints(0, 30, 0.05),
                strs(_CATS),
                strs(_NAMES),
                pa.array(all_ts[first : first + size], pa.int64()),  # many ties
                pa.array(rng.integers(0, 300, size), pa.int64()),
                ints(0, size // 3 + 2, 0.3),  # duplicate and missing correlation ids
                ints(0, 50, 0.5),
                pa.array([None if rng.random() < 0.05 else bool(rng.random() < 0.05 and (g or cpu_comm))
                          for g in gpu.tolist()], pa.bool_()),
            ],
            schema=RAW_SCHEMA,
        )
        w.write_batch(batch)
        first += size
    w.close()


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("cpu_only", [False, True])
@pytest.mark.parametrize("ts_order", ["random", "sorted", "late_inversion"])
def test_link_pass_on_random_staging_rows(seed, cpu_only, ts_order, tmp_path):
    rng = np.random.default_rng(seed)
    raw = tmp_path / "raw.arrows"
    batches = int(rng.integers(1, 5)) if ts_order == "random" else int(rng.integers(3, 9))
    pdl, cpu_comm = seed % 2 == 1, seed % 4 < 2  # odd seeds: a PDL device; seeds 2, 3, 6, 7: no gloo spans
    _random_stage(raw, rng, n=int(rng.integers(50, 3000)), batches=batches, ts_order=ts_order, cpu_comm=cpu_comm)
    starts = sorted(rng.integers(0, 500, int(rng.integers(0, 8))).tolist())  # duplicates and gaps
    steps = [(int(s % 5), i, int(st), int(st + rng.integers(1, 120))) for i, (s, st) in enumerate(zip(range(100), starts))]
    out = tmp_path / "events.parquet"
    got = link_rank(raw, out, "r", 3, cpu_only, steps, _BatchWriter, pdl=pdl)
    assert _check_against_reference(raw, out, "r", 3, cpu_only, steps, got, tmp_path, pdl) > 0
    if cpu_only and not cpu_comm:
        assert len(got.cpu_calls) > 0  # the collective-call rule ran


def _one_batch_stage(path: Path, rows: list[dict]) -> None:
    cols = {f.name: [r.get(f.name) for r in rows] for f in RAW_SCHEMA}
    arrays = []
    for f in RAW_SCHEMA:
        if pa.types.is_dictionary(f.type):
            arrays.append(pa.array(cols[f.name], pa.string()).dictionary_encode())
        else:
            arrays.append(pa.array(cols[f.name], f.type))
    w = open_stage_writer(path)
    w.write_batch(pa.record_batch(arrays, schema=RAW_SCHEMA))
    w.close()


def test_step_windows_and_their_boundaries(tmp_path):
    """The window that starts last at or before the time, if the time is before its end."""
    times = [99, 100, 199, 200, 249, 250, 299, 300, 399, 400]
    rows = [dict(event_id=i, track_kind="cpu_thread", device=1, track=1, category="cpu_op", name="x", ts_ns=t,
                 dur_ns=1, is_comm=False) for i, t in enumerate(times)]
    _one_batch_stage(tmp_path / "raw.arrows", rows)
    steps = [(5, 0, 100, 200), (6, 1, 200, 250), (7, 2, 300, 400)]  # a gap 250..300
    link_rank(tmp_path / "raw.arrows", tmp_path / "ev.parquet", "r", 0, False, steps, _BatchWriter)
    got = duckdb.connect().execute(f"SELECT ts_ns, step FROM read_parquet('{tmp_path}/ev.parquet') ORDER BY ts_ns").fetchall()
    assert got == [(99, None), (100, 5), (199, 5), (200, 6), (249, 6), (250, None), (299, None),
                   (300, 7), (399, 7), (400, None)]


def test_launch_choice_clipping_and_gpu_step_by_launch(tmp_path):
    """A runtime call beats a driver call of the same correlation id (then the lowest event_id);
    a kernel running 150 ns into the next one on its stream is cut by 150 ns, one 100 ns into it is not;
    a GPU row takes the step of its launch call."""
    cpu = dict(track_kind="cpu_thread", device=7, track=70, is_comm=False)
    gpu = dict(track_kind="gpu_stream", device=0, track=7, is_comm=False, category="kernel")
    rows = [
        dict(cpu, event_id=0, category="driver", name="cuLaunchKernel", ts_ns=1_000, dur_ns=10, correlation=5),
        dict(cpu, event_id=1, category="runtime", name="cudaLaunchKernel", ts_ns=1_100, dur_ns=10, correlation=5),
        dict(cpu, event_id=2, category="runtime", name="cudaLaunchKernel", ts_ns=1_200, dur_ns=10, correlation=5),
        dict(cpu, event_id=3, category="runtime", name="cudaLaunchKernel", ts_ns=2_500, dur_ns=10, correlation=6),
        dict(gpu, event_id=4, name="k1", ts_ns=3_000, dur_ns=1_150, correlation=5),  # next starts at 4_000
        dict(gpu, event_id=5, name="k2", ts_ns=4_000, dur_ns=1_100, correlation=6),  # next starts at 5_000
        dict(gpu, event_id=6, name="k3", ts_ns=5_000, dur_ns=500, correlation=None),
    ]
    _one_batch_stage(tmp_path / "raw.arrows", rows)
    steps = [(1, 9, 1_000, 2_000), (2, 10, 2_000, 9_000)]
    res = link_rank(tmp_path / "raw.arrows", tmp_path / "ev.parquet", "r", 0, False, steps, _BatchWriter)
    got = duckdb.connect().execute(
        f"SELECT event_id, launch_event_id, dur_ns, clipped, clipped_ns, step, class "
        f"FROM read_parquet('{tmp_path}/ev.parquet') WHERE track_kind = 'gpu_stream' ORDER BY event_id").fetchall()
    assert got == [
        (4, 1, 1_000, True, 150, 1, "compute"),
        (5, 3, 1_100, False, 0, 2, "compute"),
        (6, None, 500, False, 0, 2, "compute"),
    ]
    assert (res.n_clipped, res.max_clip_ns, res.n_skew, res.max_skew_ns) == (1, 150, 0, None)


def test_sync_calls_by_name_fold_ascii_case_only(tmp_path):
    names = ["cudaStreamSynchronize", "CUDAEVENTSYNCHRONIZE", "hipDeviceSynchronize", "cuda_sync_x",
             "cudaStreamſynchronize", "cudaStreamSynchronİze", "cudaLaunchKernel"]
    rows = [dict(event_id=i, track_kind="cpu_thread", device=1, track=1, category="cuda_runtime", name=nm,
                 ts_ns=100 + i, dur_ns=1, is_comm=False) for i, nm in enumerate(names)]
    _one_batch_stage(tmp_path / "raw.arrows", rows)
    link_rank(tmp_path / "raw.arrows", tmp_path / "ev.parquet", "r", 0, False, [], _BatchWriter)
    got = duckdb.connect().execute(f"SELECT class FROM read_parquet('{tmp_path}/ev.parquet') ORDER BY event_id").fetchall()
    assert [c for (c,) in got] == ["sync", "sync", "sync", "sync", "cpu", "cpu", "cpu"]


def _store_rows(path: Path) -> dict:
    con = duckdb.connect()
    out = {}
    for name, excl in (("collectives.parquet", "run_id"), ("ranks.parquet", "run_id, source_path"),
                       ("events/*.parquet", "run_id")):
        files = sorted(str(p) for p in path.glob(f"runs/*/{name}"))
        out[name] = con.execute(f"SELECT * EXCLUDE ({excl}) FROM read_parquet({files}) ORDER BY ALL").fetchall()
    return out


@pytest.mark.parametrize("rel, chunk, row_group", [
    ("fixtures/tp_2rank", 3, 5), ("traces/param_dlrm_8rank_v100", 3, 5),
    ("traces/hta_ddp_v100_r1of2", 37, 41),  # 2,020 collectives: 55 chunks, 50 row groups (3 would make 674)
])
def test_collectives_built_in_small_chunks_give_the_same_store(rel, chunk, row_group, tmp_path, monkeypatch):
    # Each rank's collectives become Arrow tables COLLECTIVES_CHUNK rows at a time, numbered
    # (seq) as one table, and go out in row groups of COLLECTIVES_ROW_GROUP: small chunks (seq
    # numbered across chunk boundaries) must give the store the default ones give.
    src = (FIXTURES.parent / rel) if rel.startswith("fixtures/") else TRACES / rel[len("traces/"):]
    if not src.exists():
        pytest.skip(f"../shared/{rel} is not available")
    ingest_paths([src], tmp_path / "a")
    monkeypatch.setattr(assemble, "COLLECTIVES_CHUNK", chunk)
    monkeypatch.setattr(assemble, "COLLECTIVES_ROW_GROUP", row_group)
    ingest_paths([src], tmp_path / "b")
    a, b = _store_rows(tmp_path / "a"), _store_rows(tmp_path / "b")
    assert len(a["collectives.parquet"]) > 10
    assert a == b
    assert not [p for p in (tmp_path / "b").rglob("*") if p.is_file() and p.suffix != ".parquet"]
