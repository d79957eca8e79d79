"""`tracekit collect sweep`: the calibration sweep (collectors/workloads/sweep.py),
then ingest and the report with this machine's fitted α, β and n½ per op.

Listed in ``tracekit.cli.collect.WORKLOADS``.
"""

from __future__ import annotations

import sys
from typing import Optional


from tracekit.collectors.workloads.sweep import SweepConfig
from tracekit.cli.collect_run import ingest_and_report, run_workload


def sweep(config: SweepConfig, store: Optional[str], ingest: bool) -> None:
    """Calibration sweep: every op over sizes min..max (×factor), for the α–β fit.

    S is nccl-tests' size: the all-reduce buffer, the all-gather output, the
    reduce-scatter input, the all-to-all send buffer, the send/recv message.
    The defaults (1 KiB to 64 MiB, ×4, 5 calls after 2 warm-up calls) take
    about 20 s on 2 CPU ranks over gloo; --max-bytes 16M roughly halves it.
    """
    from tracekit.collectors.workloads.sweep import run_sweep

    cfg = config.resolved()  # bad options fail here, before anything starts
    run_dir, config_dict = run_workload(lambda progress: run_sweep(cfg, on_progress=progress), f"sweep on {cfg.ranks} ranks")
    print(
        f"sweep: {cfg.ranks} ranks, {', '.join(cfg.ops)}; {len(cfg.sizes)} sizes {cfg.sizes[0]:,}..{cfg.sizes[-1]:,} B, "
        f"{cfg.iters} calls each after {cfg.warmup_iters} warm-up: {run_dir} "
        f"(job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "sweep", config_dict, store)
