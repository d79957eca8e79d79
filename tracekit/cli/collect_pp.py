"""`tracekit collect pp` and `tracekit collect disagg-kv`: run the pipeline-parallel
or the disaggregated prefill/decode workload, then ingest it and print the report.

Listed in ``tracekit.cli.collect.WORKLOADS``.
Thin: the work is in ``tracekit.collectors.workloads.pp`` / ``tracekit.collectors.workloads.disagg_kv``,
``tracekit.ingest.ingest_paths`` and ``tracekit.report.data``.
"""

from __future__ import annotations

import sys
from typing import Optional


from tracekit.collectors.workloads.disagg_kv import KVConfig
from tracekit.collectors.workloads.pp import PPConfig
from tracekit.cli.collect_run import ingest_and_report, run_workload


def pp(config: PPConfig, store: Optional[str], ingest: bool) -> None:
    """Pipeline-parallel transformer: activations (and gradients) sent stage to stage with isend/irecv."""
    from tracekit.collectors.workloads.pp import run_pp

    cfg = config.resolved()  # bad options fail here, before anything starts
    title = (
        f"pp {cfg.mode}: {cfg.stages} stages, {cfg.layers} layers, hidden {cfg.hidden}, "
        f"{cfg.microbatches} micro-batches of {cfg.micro_batch}"
        + (f", {cfg.schedule}" if cfg.mode == "train" else f", {cfg.tokens} tokens")
        + f", {cfg.dtype}"
    )
    run_dir, config_dict = run_workload(lambda progress: run_pp(cfg, on_progress=progress), f"pp on {cfg.ranks} ranks")
    check = config_dict["pp_check"]
    print(
        f"{title}: {run_dir} (check passed, max relative error {check['max_rel_rms_err']:.3g}; "
        f"job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "pp", config_dict, store)


def disagg_kv(config: KVConfig, store: Optional[str], ingest: bool) -> None:
    """Disaggregated prefill/decode: prefill ranks ship each layer's KV cache to decode ranks (bulk or layer-wise)."""
    from tracekit.collectors.workloads.disagg_kv import run_disagg_kv

    cfg = config.resolved()
    title = (
        f"disagg-kv {cfg.mode}: {len(cfg.pairs)} prefill/decode pair(s), {cfg.layers} layers, "
        f"{cfg.kv_bytes_per_layer:,} KV bytes per layer, {cfg.dtype}"
    )
    run_dir, config_dict = run_workload(
        lambda progress: run_disagg_kv(cfg, on_progress=progress), f"disagg-kv on {cfg.ranks} ranks"
    )
    print(
        f"{title}: {run_dir} (decode check passed; job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "disagg_kv", config_dict, store)
