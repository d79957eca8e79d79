"""`tracekit collect 3d`: the TP × PP × DP training workload, then ingest it and print the report.

Listed in ``tracekit.cli.collect.WORKLOADS``. Thin: the work is
in ``tracekit.collectors.workloads.threed``, ``tracekit.ingest.ingest_paths`` and ``tracekit.report.data``.
"""

from __future__ import annotations

import sys
from typing import Optional

from tracekit.cli.collect_run import ingest_and_report, run_workload
from tracekit.collectors.workloads.threed import ThreeDConfig


def three_d(config: ThreeDConfig, store: Optional[str], ingest: bool) -> None:
    """TP inside PP stages inside DP replicas: Megatron TP all-reduces, 1F1B send/recv, DP gradient buckets (ddp or fsdp)."""
    from tracekit.collectors.workloads.threed import run_3d

    cfg = config.resolved()  # bad options fail here, before anything starts
    title = (
        f"3d: tp {cfg.tp} x pp {cfg.pp} x dp {cfg.dp} = {cfg.ranks} ranks ({cfg.dp_mode}), {cfg.layers} layers, "
        f"hidden {cfg.hidden}, {cfg.microbatches} micro-batches of {cfg.micro_batch}, {cfg.dtype}"
    )
    run_dir, config_dict = run_workload(lambda progress: run_3d(cfg, on_progress=progress), f"3d on {cfg.ranks} ranks")
    check = config_dict["check"]
    print(
        f"{title}: {run_dir} (gradient check passed, max relative error {check['max_grad_rel_rms_err']:.3g}; "
        f"job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "3d", config_dict, store)
