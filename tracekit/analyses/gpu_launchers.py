"""gpu_launchers, gpu_idle_gaps: one row per GPU op with the CPU op / record_function range that
launched it, and one row per idle gap of each GPU time window — a Python analysis, built only when a
statement names one of them (tracekit.analyses: a late module; the reports read neither).

Reads: events, ranks

The definitions (GPU ops and work, windows, idle gaps and their classes, launchers) and the numpy
are tracekit/timeline/gpu.py's; the rows are read per chunk of ranks as analyses/gpu_time_breakdown.py
reads a run stored without its GPU summaries (memory: one chunk's GPU ops and CPU ranges). The
launchers summed per rank and name are gpu_time_by_launcher (kernel_summary.sql), the gaps summed
per class gpu_time_breakdown's idle_*_ns.

gpu_idle_gaps: one row per idle gap of a window (a table).

run_id      VARCHAR  run
rank        INTEGER  global rank
grp         BIGINT   -1 = whole trace, else the profiler step number
s           BIGINT   gap start (end of the GPU work before it), ns
e           BIGINT   gap end (start of the GPU work after it), ns
idle_ns     BIGINT   e − s, ns
launch_ts_ns BIGINT  earliest CPU launch (runtime call start) of the spans starting at e, ns; NULL when none is linked
idle_class  VARCHAR  host_wait / kernel_wait / other (tracekit/timeline/gpu.py)

gpu_launchers: one row per GPU op (events on GPU tracks, track_kind = 'gpu_stream', other than
gpu_user_annotation ranges: kernels, memcpy, memset, sync, whatever their duration; a table).

run_id          VARCHAR  run
rank            INTEGER  global rank
event_id        BIGINT   the GPU op (events.event_id)
launch_event_id BIGINT   its runtime launch call; NULL when not linked
cpu_op_id       BIGINT   innermost cpu_op enclosing the launch (events.event_id); NULL when none
cpu_op          VARCHAR  its name
annotation_id   BIGINT   innermost user_annotation (record_function) enclosing the launch; NULL when none
annotation      VARCHAR  its name
"""

from __future__ import annotations

import numpy as np


def _launcher_table(gpu, rg, lt, ls, le):
    """gpu_launchers' columns after run_id for the GPU ops ``gpu`` among the candidate launchers
    ``rg`` (as analyses.gpu_time_breakdown._chunks gives them), as a pyarrow table."""
    import pyarrow as pa

    from tracekit.timeline.gpu import NONE, launcher_names, launchers

    from .gpu_time_breakdown import _col, range_arrays

    r = range_arrays(rg)
    found = launchers(_col(gpu, "rank"), lt, ls, le, r["kind"], r["rank"], r["track"], r["s"], r["e"])
    cols = {"rank": gpu.column("rank"), "event_id": gpu.column("event_id"),
            "launch_event_id": gpu.column("launch_event_id")}
    rid = np.r_[_col(rg, "event_id", NONE), 0]  # index −1 (none found) picks this placeholder, masked to NULL
    for kd, name, label in ((0, "cpu_op_id", "cpu_op"), (1, "annotation_id", "annotation")):
        f = found[kd]
        null = (f < 0) | (rid[f] == NONE)
        cols[name] = pa.array(rid[f], mask=null)
        cols[label] = launcher_names(f, r["name"], null)
    return pa.table(cols)


def create(con) -> None:
    """Create the tables ``gpu_idle_gaps`` and ``gpu_launchers`` on ``con`` from its ``events``."""
    from tracekit.timeline.gpu import breakdown

    from .gpu_time_breakdown import _chunks, _insert, gpu_arrays

    con.execute("""
        CREATE OR REPLACE TABLE gpu_idle_gaps (run_id VARCHAR, rank INTEGER, grp BIGINT, s BIGINT, e BIGINT,
            idle_ns BIGINT, launch_ts_ns BIGINT, idle_class VARCHAR)""")
    con.execute("""
        CREATE OR REPLACE TABLE gpu_launchers (run_id VARCHAR, rank INTEGER, event_id BIGINT,
            launch_event_id BIGINT, cpu_op_id BIGINT, cpu_op VARCHAR, annotation_id BIGINT, annotation VARCHAR)""")
    runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM ranks ORDER BY 1").fetchall()]
    for run_id, gpu, rg, lt, ls, le in _chunks(con, runs):
        g = gpu_arrays(gpu)
        _, gaps = breakdown(g["rank"], g["s"], g["dur"], g["k"], g["step"], g["step_ok"], ls)
        del g
        _insert(con, "gpu_idle_gaps", gaps, run_id,
                "SELECT rank, grp, s, e, e - s, launch_ts_ns, idle_class::VARCHAR FROM _gpu_rank_part")
        _insert(con, "gpu_launchers", _launcher_table(gpu, rg, lt, ls, le), run_id)
