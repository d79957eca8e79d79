"""`tracekit collect ep`: the expert-parallel MoE workload, then ingest and report.

Listed in ``tracekit.cli.collect.WORKLOADS``; the work is in ``tracekit.collectors.workloads.ep.run_ep``.
"""

from __future__ import annotations

import sys
from typing import Optional


from tracekit.collectors.workloads.ep import EPConfig
from tracekit.cli.collect_run import ingest_and_report, run_workload


def ep(config: EPConfig, store: Optional[str], ingest: bool) -> None:
    """Expert-parallel MoE layers (top-k router, sharded experts, all-to-all on the router's uneven splits), profiled."""
    from tracekit.collectors.workloads.ep import run_ep
    from tracekit.collectors.workloads.epdp import run_epdp

    cfg = config.resolved()  # bad options fail here, before anything starts
    title = (
        f"ep: {cfg.ranks} ranks, {cfg.layers} layers, {cfg.experts} experts top-{cfg.top_k}, hidden {cfg.hidden}, "
        f"{cfg.tokens_per_rank} tokens/rank, skew {cfg.skew:g}"
        + (", two-batch overlap" if cfg.two_batch_overlap else "")
        + f", {cfg.dtype}"
    )
    if cfg.dp > 1:
        title += f", ep {cfg.ranks // cfg.dp} x dp {cfg.dp} (experts trained, DDP buckets of {cfg.bucket_kb} KiB)"
    run_dir, config_dict = run_workload(lambda progress: (run_epdp if cfg.dp > 1 else run_ep)(cfg, on_progress=progress), f"ep on {cfg.ranks} ranks")
    if cfg.dp > 1:
        print(f"{title}: {run_dir} (gradient check passed, max relative RMS error "
              f"{config_dict['check']['max_grad_rel_rms_err']:.3g}; job {config_dict['timing']['job_wall_s']:.1f} s)",
              file=sys.stderr)
        if ingest:
            ingest_and_report(run_dir, "ep", config_dict, store)
        return
    check = config_dict["ep_check"]
    measured = config_dict["measured"]["skew_measured"]
    print(
        f"{title}: {run_dir} (EP check passed, max abs error {check['max_abs_err']:.3g}; "
        f"expert 0 measured {measured:.2f}x as hot; job {config_dict['timing']['job_wall_s']:.1f} s)"
        if measured is not None
        else f"{title}: {run_dir} (EP check passed, max abs error {check['max_abs_err']:.3g}; "
        f"job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "ep", config_dict, store)
