"""The per-rank summaries gpu_op_durations and collective_steps, made at ingest from the rows the link
pass writes (tracekit.ingest.assemble; the store's tables, the only source kernel_summary and
measured_vs_model read), against independent computations over the events: the GPU ops grouped per
class, name and duration; the old join of the collectives with their events' steps; the kernel
summary as its old SQL computed it over the events (quantile_disc, avg), on real and synthetic jobs
and on a trace built so that DuckDB's avg (C long double) and a double division disagree in the last
bit. By hand: the hand-made trace's rows (fixtures/handmade/NOTE.md, "gpu_breakdown/"). A run stored
without either table is refused: tests/analyses/test_summary_door.py."""

from __future__ import annotations

import json

import pytest

from tests.analyses.test_overlap_summaries import _ingest
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

GPU_OPS = "track_kind = 'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation'"

# gpu_op_durations, independently: the events' GPU ops grouped
BY_DURATION = f"""
SELECT run_id, rank, class, name, dur_ns, count(*), count(step) FROM events WHERE {GPU_OPS}
GROUP BY ALL ORDER BY ALL
"""

# collective_steps as measured_vs_model computed it before: the events of the collectives rows, with a step
CALL_STEPS = """
SELECT e.run_id, e.rank, e.event_id, e.step, e.class = 'comm' AS comm
FROM (SELECT run_id, rank, event_id, step, class FROM events
      WHERE step IS NOT NULL AND event_id IN (SELECT event_id FROM collectives)) e
SEMI JOIN collectives c USING (run_id, rank, event_id) ORDER BY ALL
"""

# kernel_summary as its SQL was before the histogram: over the events' GPU ops
KERNEL_SUMMARY_OVER_EVENTS = f"""
WITH g AS (SELECT run_id, rank, class, name, dur_ns, step FROM events WHERE {GPU_OPS}),
steps AS (SELECT run_id, sum(window_ns) AS step_window_ns FROM gpu_time_breakdown WHERE grp >= 0 GROUP BY run_id),
k AS (
    SELECT run_id, class, name, count(DISTINCT rank) AS ranks, count(*) AS count, sum(dur_ns)::BIGINT AS total_ns,
           avg(dur_ns) AS mean_ns, quantile_disc(dur_ns, 0.5) AS p50_ns, quantile_disc(dur_ns, 0.95) AS p95_ns,
           max(dur_ns) AS max_ns, coalesce(sum(dur_ns) FILTER (WHERE step IS NOT NULL), 0)::BIGINT AS step_total_ns
    FROM g GROUP BY run_id, class, name
)
SELECT k.run_id, k.class, k.name,
       row_number() OVER (PARTITION BY k.run_id, k.class ORDER BY k.total_ns DESC, k.name) AS class_rank,
       k.ranks, k.count, k.total_ns, k.mean_ns, k.p50_ns::BIGINT AS p50_ns, k.p95_ns::BIGINT AS p95_ns,
       k.max_ns::BIGINT AS max_ns, k.step_total_ns,
       CASE WHEN s.step_window_ns > 0 THEN k.step_total_ns / s.step_window_ns END AS step_share
FROM k LEFT JOIN steps s USING (run_id)
"""


def _rows(con, q):
    return con.execute(q).fetchall()


def _same_rows(con, a: str, b: str) -> int:
    """The rows of the queries ``a`` and ``b`` are the same multiset with the same column types (their
    count returned); bit for bit: DuckDB compares the doubles exactly."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE _a AS {a}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _b AS {b}")
    assert [r[1] for r in _rows(con, "DESCRIBE _a")] == [r[1] for r in _rows(con, "DESCRIBE _b")]
    assert _rows(con, "SELECT count(*) FROM (SELECT * FROM _a EXCEPT ALL SELECT * FROM _b)") == [(0,)]
    assert _rows(con, "SELECT count(*) FROM (SELECT * FROM _b EXCEPT ALL SELECT * FROM _a)") == [(0,)]
    return _rows(con, "SELECT count(*) FROM _a")[0][0]


@pytest.mark.parametrize("source", ["synth:8", "fixture:nsys_job", "fixture:tp_2rank", "fixture:3d_2x2x2",
                                    "param_dlrm_8rank_v100", "hta_pyper_a100_r0of16"])
def test_stored_rows_equal_the_events(source, tmp_path):
    st = _ingest(tmp_path, source)
    con = analyses.connect(st)
    gpu = _rows(con, f"SELECT count(*) FROM events WHERE {GPU_OPS}")[0][0]
    got = _rows(con, "SELECT * FROM gpu_op_durations ORDER BY ALL")
    assert got == _rows(con, BY_DURATION)
    assert sum(r[5] for r in got) == gpu and (gpu > 0) == (source not in ("fixture:tp_2rank", "fixture:3d_2x2x2"))
    steps = _rows(con, "SELECT * FROM collective_steps ORDER BY ALL")
    assert steps == _rows(con, CALL_STEPS)
    assert len(steps) > 0 or source == "fixture:nsys_job"  # an Nsight report holds no profiler steps
    if gpu:
        assert _same_rows(con, "SELECT * FROM kernel_summary", KERNEL_SUMMARY_OVER_EVENTS) > 0
    con.close()


def test_the_hand_made_trace_by_hand(tmp_path):
    """fixtures/handmade/gpu_breakdown: one rank, every GPU op in a profiler step (kernel_summary's
    golden step totals, tests/analyses/test_kernel_summary.py), each (class, name, duration) once but
    the all-reduce's two durations."""
    from tests.analyses.test_kernel_summary import GEMM_A, NCCL
    from tests.conftest import FIXTURES

    st = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "handmade" / "gpu_breakdown"], st, run_id="gb")
    con = analyses.connect(st)
    assert _rows(con, "SELECT class, name, dur_ns, ops, step_ops FROM gpu_op_durations ORDER BY ALL") == [
        ("comm", NCCL, 15_000, 1, 1), ("comm", NCCL, 30_000, 1, 1),
        ("compute", GEMM_A, 20_000, 1, 1), ("compute", "sm90_gemm_b", 14_980, 1, 1),
        ("compute", "sm90_gemm_c", 10_000, 1, 1), ("compute", "sm90_gemm_d", 10_000, 1, 1),
        ("memory", "Memcpy HtoD (Pageable -> Device)", 5_000, 1, 1), ("memory", "Memset (Device)", 1_000, 1, 1),
        ("sync", "Stream Sync", 2_000, 1, 1)]
    # the two all-reduces are the run's collectives: the 30 µs one in step 1, the 15 µs one in step 2
    assert _rows(con, "SELECT s.step, s.comm, e.name, e.dur_ns FROM collective_steps s "
                      "JOIN events e USING (run_id, rank, event_id) ORDER BY s.event_id") == [
        (1, True, NCCL, 30_000), (2, True, NCCL, 15_000)]
    con.close()


# a kernel's 4,379 durations summing to 2,703,109,522 ns: their mean in C long double rounded to double
# (DuckDB's avg) is 617289.226307376, one bit below the double division's 617289.2263073762
MEAN_SUM, MEAN_N = 2_703_109_522, 4_379


def _trace(path, rank: int, durations_ns: list[int], name: str = "k_mean") -> None:
    """One rank's Kineto trace: back-to-back kernels of these durations on one stream, each launched
    by a cudaLaunchKernel call inside ProfilerStep#1 (times in µs with ns digits: exact)."""
    ev, t = [], 1_000_000  # ns
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
               "ts": t / 1e3, "dur": (sum(durations_ns) + 10 * len(durations_ns) + 1000) / 1e3})
    for i, d in enumerate(durations_ns):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": (t + 1) / 1e3, "dur": 0.001, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": (t + 2) / 1e3, "dur": d / 1e3,
                   "args": {"device": 0, "stream": 7, "correlation": i + 1}})
        t += d + 10
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
                                "deviceProperties": [{"id": 0, "name": "H100"}], "traceEvents": ev}))


def test_mean_and_quantiles_merge_exactly_over_ranks(tmp_path):
    """Two ranks share the kernel: the mean of all 4,379 durations is DuckDB's avg's (not the double
    division's, which differs here in the last bit), and the quantiles of an even count are the old
    quantile_disc's, though no rank holds the middle values alone."""
    from tracekit.analyses import int_mean

    q, r = divmod(MEAN_SUM, MEAN_N)
    durs = [q + 1] * r + [q] * (MEAN_N - r)
    assert float(int_mean([MEAN_SUM], [MEAN_N])[0]) != MEAN_SUM / MEAN_N  # the case this test is for
    d = tmp_path / "job"
    d.mkdir()
    _trace(d / "rank0.json", 0, durs[0::2])
    _trace(d / "rank1.json", 1, durs[1::2] + [700_000, 800_000, 900_000])  # and three longer ones, on rank 1 only
    st = Store(tmp_path / "s")
    ingest_paths([d], st, run_id="m")
    con = analyses.connect(st)
    assert _same_rows(con, "SELECT * FROM kernel_summary", KERNEL_SUMMARY_OVER_EVENTS) == 1
    (n, total, mean, p50, p95, mx, ranks), = _rows(con, "SELECT count, total_ns, mean_ns, p50_ns, p95_ns, max_ns, ranks "
                                                        "FROM kernel_summary")
    assert (n, total, ranks, mx) == (MEAN_N + 3, MEAN_SUM + 2_400_000, 2, 900_000)
    assert mean == _rows(con, "SELECT avg(dur_ns) FROM events WHERE name = 'k_mean' GROUP BY name")[0][0]
    assert mean == float(int_mean([MEAN_SUM + 2_400_000], [MEAN_N + 3])[0])
    # n = 4,382: quantile_disc takes the value at position max(1, n − ⌊n/2⌋) − 1 = 2,190 of the sorted
    # durations (q below the r values of q + 1), and at n − ⌊n·0.05⌋ − 1 = 4,162 for p95
    ordered = sorted(durs + [700_000, 800_000, 900_000])
    assert (p50, p95) == (ordered[2_190], ordered[4_162]) == (q, q + 1)
    con.close()


def test_int_mean_is_duckdbs_grouped_avg():
    """tk_int_mean / int_mean against DuckDB's own avg over BIGINT values in a GROUP BY, on sums and
    counts chosen at random (some where a double division would differ)."""
    import random

    import duckdb

    from tracekit.analyses import int_mean

    rng = random.Random(11)
    con = duckdb.connect()
    for _ in range(40):
        n = rng.randint(1, 3000)
        s = rng.randint(0, n * 10**7)
        q, r = divmod(s, n)
        got = con.execute("SELECT g, avg(v) FROM (SELECT unnest(?::BIGINT[]) AS v, 1 AS g) GROUP BY g",
                          [[q + 1] * r + [q] * (n - r)]).fetchone()[1]
        assert got == float(int_mean([s], [n])[0])


def test_call_steps_reads_an_event_that_is_no_comm_row_from_the_events_file(tmp_path):
    """A collectives row whose event is not among the link pass's comm rows (none known today) gets
    its step and class from the rank's events file; a call without a step, or no event, has no row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracekit.ingest.assemble import call_steps

    f = tmp_path / "rank=0.parquet"
    pq.write_table(pa.table({"event_id": pa.array([1, 2, 3, 4], pa.int64()),
                             "class": pa.array(["comm", "cpu", "comm", "cpu"]).dictionary_encode(),
                             "step": pa.array([5, 6, None, None], pa.int64())}), f)
    # the tap: comm rows 1 (step 5) and 3 (no step), and a compute row 9 (step 7)
    eid = (np.array([1, 3, 9]), np.ones(3, bool))
    step = (np.array([5, 0, 7]), np.array([True, False, True]))
    t = call_steps("r", 0, np.array([3, 2, 1, 1, 4, 8]), eid, step, np.array([True, True, False]), f)
    assert t.to_pylist() == [dict(run_id="r", rank=0, event_id=1, step=5, comm=True),
                             dict(run_id="r", rank=0, event_id=2, step=6, comm=False)]
