"""The per-rank GPU summaries made at ingest (tracekit.timeline.gpu on the rows the link pass writes;
the store's gpu_breakdown_summary and gpu_launcher_summary tables, the only source the analyses read)
against independent computations: the seven parts by another sweep of the events
(tests/analyses/test_gpu_time_breakdown.py's elementary segments), the per-GPU-op tables
(gpu_launchers grouped in SQL, gpu_idle_gaps summed per class) and the events' own first start /
last end of each window on the run's clock. A run stored without them, or with one damaged, is
refused: tests/analyses/test_summary_door.py."""

from __future__ import annotations

import pytest

from tests.analyses.test_gpu_time_breakdown import PARTS, _independent
from tests.analyses.test_overlap_summaries import _ingest
from tracekit import analyses
from tracekit.store import Store

GPU_FILES = ("gpu_breakdown_summary.parquet", "gpu_launcher_summary.parquet")

# gpu_time_by_launcher as it was before the summaries: the per-op launchers joined with the GPU ops
BY_OP = """
SELECT g.run_id, k.kind, CASE k.kind WHEN 'cpu_op' THEN l.cpu_op ELSE l.annotation END AS launcher,
       count(DISTINCT g.rank), count(*), sum(g.dur_ns)::BIGINT,
       coalesce(sum(g.dur_ns) FILTER (WHERE g.class = 'compute'), 0)::BIGINT,
       coalesce(sum(g.dur_ns) FILTER (WHERE g.class = 'comm'), 0)::BIGINT
FROM events g JOIN gpu_launchers l USING (run_id, rank, event_id)
CROSS JOIN (VALUES ('cpu_op'), ('annotation')) k(kind)
WHERE g.track_kind = 'gpu_stream' AND g.category IS DISTINCT FROM 'gpu_user_annotation'
GROUP BY ALL ORDER BY ALL
"""


WINDOW_ENDS = """
WITH w AS (SELECT rank, step, ts_ns, ts_ns + dur_ns AS e FROM events
           WHERE track_kind = 'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation' AND dur_ns > 0)
SELECT rank, -1, min(ts_ns), max(e) FROM w GROUP BY rank
UNION ALL SELECT rank, step, min(ts_ns), max(e) FROM w WHERE step IS NOT NULL GROUP BY rank, step
ORDER BY ALL
"""


def _rows(con, q):
    return con.execute(q).fetchall()


@pytest.mark.parametrize("source", ["synth:8", "fixture:nsys_job", "param_dlrm_8rank_v100"])
def test_stored_rows_equal_independent_computations(source, tmp_path):
    st = _ingest(tmp_path, source)
    con = analyses.connect(st)
    n_stored = _rows(con, "SELECT count(*), count(*) FILTER (WHERE grp >= 0), count(DISTINCT rank) "
                          "FROM gpu_breakdown_summary")[0]
    assert n_stored[0] > 0 and n_stored[2] > 1  # several ranks
    if source == "synth:8":  # step windows, ranks on clocks of their own: the stored window ends were shifted
        assert n_stored[1] > 0 and _rows(con, "SELECT count(DISTINCT clock_offset_ns) FROM ranks")[0][0] > 1
    # independent: each window's ends are its GPU work's first start and last end (the events, shifted)
    assert _rows(con, "SELECT rank, grp, window_start_ns, window_end_ns FROM gpu_time_breakdown ORDER BY ALL") == \
        _rows(con, WINDOW_ENDS)
    # independent: the launcher sums are the per-op launchers grouped; idle by class is the gaps summed
    assert _rows(con, "SELECT * EXCLUDE (share) FROM gpu_time_by_launcher ORDER BY ALL") == _rows(con, BY_OP)
    assert _rows(con, "SELECT rank, grp, idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns FROM gpu_time_breakdown "
                      "WHERE idle_ns > 0 ORDER BY ALL") == _rows(
        con, "SELECT rank, grp, coalesce(sum(idle_ns) FILTER (WHERE idle_class = 'host_wait'), 0), "
             "coalesce(sum(idle_ns) FILTER (WHERE idle_class = 'kernel_wait'), 0), "
             "coalesce(sum(idle_ns) FILTER (WHERE idle_class = 'other'), 0) FROM gpu_idle_gaps GROUP BY ALL ORDER BY ALL")
    # independent: the seven parts and the window by elementary segments of the GPU work
    ev = con.execute(
        "WITH g AS (SELECT rank, step, class, ts_ns AS s, ts_ns + dur_ns AS e FROM events WHERE track_kind = "
        "'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation' AND dur_ns > 0) "
        "SELECT rank, -1::BIGINT AS grp, class, s, e FROM g "
        "UNION ALL SELECT rank, step, class, s, e FROM g WHERE step IS NOT NULL").df()
    want = _independent(ev)
    got = {(r, g): tuple(rest) for r, g, *rest in _rows(
        con, f"SELECT rank, grp, {', '.join(PARTS)}, window_ns FROM gpu_time_breakdown")}
    assert got == want and len(got) == n_stored[0]
    assert _rows(con, "SELECT count(*) FROM kernel_summary")[0][0] > 0
    con.close()


def test_a_cpu_only_run_has_empty_gpu_summaries(tmp_path):
    st = _ingest(tmp_path, "fixture:tp_2rank")  # gloo, no GPU tracks
    con = analyses.connect(st)
    assert _rows(con, "SELECT (SELECT count(*) FROM gpu_breakdown_summary), (SELECT count(*) FROM "
                      "gpu_launcher_summary), (SELECT count(*) FROM gpu_time_breakdown)") == [(0, 0, 0)]
    assert all((st.run_dir("r").resolve() / f).exists() for f in GPU_FILES)


def _sums(t):
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=str)


def test_launcher_sums_by_hand():
    """Five GPU ops of two ranks (class codes: 0 compute, 1 comm, 4 other), their cpu_op names with
    two missing, no annotation: one row per rank, kind and name, the sums worked out by hand."""
    import numpy as np
    import pyarrow as pa

    from tracekit.timeline.gpu import launcher_sums

    got = launcher_sums(np.array([0, 0, 1, 1, 1]), np.array([10, 20, 30, 40, 50]), np.array([0, 1, 0, 4, 1]),
                        {0: pa.array(["a", None, "a", "a", None]), 1: pa.array([None] * 5, pa.string())})
    assert _sums(got) == sorted([
        (0, "cpu_op", "a", 1, 10, 10, 0), (0, "cpu_op", None, 1, 20, 0, 20),
        (1, "cpu_op", "a", 2, 70, 30, 0), (1, "cpu_op", None, 1, 50, 0, 50),
        (0, "annotation", None, 2, 30, 10, 20), (1, "annotation", None, 3, 120, 30, 50)], key=str)


def test_launcher_sums_of_many_ranks_and_names():
    """3,000 ranks, each one op under a name of its own (more rank × name pairs than counters are
    kept for: the sorted path): each rank's one row, its own duration."""
    import numpy as np
    import pyarrow as pa

    from tracekit.timeline.gpu import launcher_sums

    n = 3000
    r = np.arange(n)[::-1].copy()
    got = launcher_sums(r, r * 7 + 1, np.zeros(n, dtype=np.int8),
                        {0: pa.array([f"op{x}" for x in r]), 1: pa.array([None] * n, pa.string())})
    rows = {(x[0], x[1]): x[2:] for x in _sums(got)}
    assert len(rows) == 2 * n
    assert all(rows[(x, "cpu_op")] == (f"op{x}", 1, 7 * x + 1, 7 * x + 1, 0) for x in range(n))
    assert rows[(5, "annotation")] == (None, 1, 36, 36, 0)


def test_a_stray_gpu_timestamp_stores_empty_gpu_summaries_and_analyze_says_why(tmp_path, capsys):
    """Five kernels at an epoch time (µs) and one at ts = 12 µs: the rank's GPU work spans ~54 years
    (≥ 2^53 ns, too long for the sweep). The ingest keeps the run, with a warning and both GPU files
    empty (on purpose, not missing: the analyses do not refuse it); analyze exits 0, shows the GPU
    time breakdown as none with the reason, and the rest of the report stands: the six 5 µs kernels
    are 30 µs of compute, no communication."""
    import json

    from tracekit.cli import main
    from tracekit.store import GPU_NOT_SUMMARISED

    ev = [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts, "dur": 5,
           "args": {"device": 0, "stream": 7}} for ts in (1.7e15, 1.7e15 + 10, 1.7e15 + 20, 1.7e15 + 30, 1.7e15 + 40, 12)]
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.7e15 - 5, "dur": 5, "args": {}})
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "H100"}], "traceEvents": ev}))
    store = tmp_path / "st"
    assert main(["ingest", str(trace), "--store", str(store), "--run-id", "stray"]) == 0
    why = (f"{GPU_NOT_SUMMARISED} (GPU work spans 1700000000000033001 ns, too long to sweep): the run's GPU time "
           "breakdown is none")
    assert f"rank 0: {why}" in capsys.readouterr().err
    run_dir = store / "runs" / "stray"
    con = analyses.connect(Store(store))
    assert _rows(con, "SELECT (SELECT count(*) FROM gpu_breakdown_summary), (SELECT count(*) FROM gpu_launcher_summary), "
                      "(SELECT count(*) FROM gpu_time_breakdown), (SELECT gpu_events FROM ranks)") == [(0, 0, 0, 6)]
    con.close()
    assert all((run_dir / f).is_file() for f in GPU_FILES)
    assert main(["analyze", "--store", str(store), "--json"]) == 0
    out, err = capsys.readouterr()
    rep = json.loads(out)
    assert rep["gpu_time_breakdown"] == {"by_rank": [], "by_step": []} and f"rank 0: {why}" in rep["warnings"]
    assert [(r["rank"], r["comm_ns"], r["compute_ns"]) for r in rep["overlap_by_rank"]] == [(0, 0, 30_000)]
    assert [(k["name"], k["count"], k["total_ns"]) for k in rep["kernel_summary"]] == [("gemm", 6, 30_000)]
    assert main(["analyze", "--store", str(store)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"GPU time per rank: — (rank 0: {why})" in text
