"""gpu_time_breakdown: where each rank's GPU time goes, per whole trace and per profiler step, as
parts that sum exactly to the window — a Python analysis.

Reads: gpu_breakdown_summary, gpu_launcher_summary, gpu_op_durations

The definitions (GPU work, windows, the seven labels of the sweep and their rules, the three idle
classes after HTA's idle-time breakdown, the launchers of a GPU op) and the numpy that computes them
are in tracekit/timeline/gpu.py. The rows are computed once per rank, at ingest only
(tracekit.ingest.assemble, from the rows the link pass writes), and stored as the run's
``gpu_breakdown_summary`` (per rank and window) and ``gpu_launcher_summary`` (per rank, launcher kind
and name) tables; this module reads them and never the events. Every ingest path writes both files:
empty for a run without GPU work (CPU-only gloo traces, nccl-tests logs), and empty on purpose for a
run one of whose ranks' GPU work could not be swept (a stray timestamp), with the reason in that
rank's warnings (tracekit.store.GPU_NOT_SUMMARISED; the report lists it): such a run has no rows
here, and the rest of its report stands. A run stored without either file, or holding one damaged,
is refused with one line, "ingest it again with --replace"
(:meth:`tracekit.store.AnalysisConnection.require_stored`). The per-op tables gpu_launchers and
gpu_idle_gaps are analyses/gpu_launchers.py (from the events, built only when a statement names them).

_gpu_breakdown_summary, _gpu_launcher_summary, _gpu_op_durations (views): the stored rows of those
tables, defined once every run of the connection is checked to hold the three files; the columns of
tracekit.store.GPU_BREAKDOWN_SUMMARY_SCHEMA / GPU_LAUNCHER_SUMMARY_SCHEMA / GPU_OP_DURATIONS_SCHEMA
(kernel_summary.sql sums the second and third over ranks: gpu_time_by_launcher and kernel_summary).
gpu_op_durations (the rank's GPU ops counted per class, name and duration) is no part of the sweep:
it holds the rows of a run whose GPU time could not be broken down too.

gpu_time_breakdown: one row per rank and window; the seven parts before idle_host_wait_ns sum to
window_ns, and the three idle classes sum to idle_ns.

run_id              VARCHAR  run
rank                INTEGER  global rank
grp                 BIGINT   -1 = whole trace, else the profiler step number
window_start_ns     BIGINT   start of the window's first GPU work, ns
window_end_ns       BIGINT   end of its last GPU work, ns
window_ns           BIGINT   window_end_ns − window_start_ns, ns
compute_only_ns     BIGINT   compute and no communication, ns
comm_exposed_ns     BIGINT   communication with no compute under it, ns
comm_hidden_ns      BIGINT   communication overlapped by compute, ns
memory_ns           BIGINT   memcpy/memset and no compute or communication, ns
sync_ns             BIGINT   sync events only, ns
other_ns            BIGINT   other GPU events only, ns
idle_ns             BIGINT   no GPU activity, ns
idle_host_wait_ns   BIGINT   idle gaps classed host_wait (gpu_idle_gaps), ns
idle_kernel_wait_ns BIGINT   idle gaps classed kernel_wait, ns
idle_other_ns       BIGINT   idle gaps classed other, ns
idle_fraction       DOUBLE   idle_ns / window_ns; NULL when window_ns = 0
"""

from __future__ import annotations


def create(con) -> None:
    """Create the table ``gpu_time_breakdown`` and the views ``_gpu_breakdown_summary``,
    ``_gpu_launcher_summary``, ``_gpu_op_durations`` on ``con`` (an
    :class:`tracekit.store.AnalysisConnection`) from the store's GPU summaries. Raises StoreError (one
    line) for a run stored without them or with one damaged (module docstring)."""
    stored_tables = ("gpu_breakdown_summary", "gpu_launcher_summary", "gpu_op_durations")
    con.require_stored(stored_tables)
    for stored in stored_tables:
        con.execute(f"CREATE OR REPLACE VIEW _{stored} AS SELECT * FROM {stored}")
    con.execute("""
        CREATE OR REPLACE TABLE gpu_time_breakdown AS
        SELECT run_id, rank, grp, window_start_ns, window_end_ns,
               (window_end_ns - window_start_ns)::BIGINT AS window_ns,
               compute_only_ns, comm_exposed_ns, comm_hidden_ns, memory_ns, sync_ns, other_ns, idle_ns,
               idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns,
               CASE WHEN window_end_ns > window_start_ns
                    THEN idle_ns / (window_end_ns - window_start_ns) END AS idle_fraction
        FROM _gpu_breakdown_summary ORDER BY run_id, rank, grp""")
