"""`tracekit collect ep`: the expert-parallel MoE workload, then ingest and report.

Registered on the ``collect`` sub-app (imported at the end of
``tracekit.cli.collect``); the work is in ``collectors.workloads.ep.run_ep``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from tracekit.cli.collect import (
    ACTIVE_OPT, BACKEND_OPT, DTYPE_OPT, INGEST_OPT, OUT_OPT, SEED_OPT, STEPS_OPT, STORE_OPT, WAIT_OPT, WARMUP_OPT,
    app, ingest_and_report, run_workload,
)


@app.command("ep")
def ep(
    ranks: int = typer.Option(2, "--ranks", help="Expert-parallel ranks (processes), 1-8."),
    layers: int = typer.Option(4, "--layers", help="MoE transformer layers."),
    hidden: int = typer.Option(512, "--hidden", help="Hidden size."),
    heads: int = typer.Option(8, "--heads", help="Attention heads (replicated attention; hidden divisible by heads)."),
    ffn: Optional[int] = typer.Option(None, "--ffn", help="Each expert's MLP inner size (default: 2 x hidden)."),
    experts: int = typer.Option(8, "--experts", help="Experts per layer (>= ranks, divisible by ranks)."),
    top_k: int = typer.Option(2, "--top-k", help="Experts per token (<= experts)."),
    seq: int = typer.Option(128, "--seq", help="Sequence length (tokens per rank = batch x seq)."),
    batch: int = typer.Option(4, "--batch", help="Sequences per rank."),
    skew: float = typer.Option(1.0, "--skew", help="Make expert 0 about F times as hot as each other expert (>= 1)."),
    two_batch_overlap: bool = typer.Option(
        False, "--two-batch-overlap/--no-two-batch-overlap",
        help="Split each batch in two halves; one half's all-to-all runs (async) while the other computes.",
    ),
    attention: bool = typer.Option(True, "--attention/--no-attention", help="Include the replicated attention block."),
    steps: Optional[int] = STEPS_OPT,
    dtype: str = DTYPE_OPT,
    backend: str = BACKEND_OPT,
    wait: int = WAIT_OPT,
    warmup: int = WARMUP_OPT,
    active: int = ACTIVE_OPT,
    seed: int = SEED_OPT,
    out: Path = OUT_OPT,
    store: Optional[str] = STORE_OPT,
    ingest: bool = INGEST_OPT,
) -> None:
    """Expert-parallel MoE layers (top-k router, sharded experts, all-to-all on the router's uneven splits), profiled."""
    from collectors.workloads.ep import EPConfig, run_ep

    config = EPConfig(
        ranks=ranks,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn=ffn,
        experts=experts,
        top_k=top_k,
        seq=seq,
        batch=batch,
        skew=skew,
        two_batch_overlap=two_batch_overlap,
        attention=attention,
        steps=steps,
        dtype=dtype,
        backend=backend,
        seed=seed,
        wait=wait,
        warmup=warmup,
        active=active,
        out=str(out),
    )
    cfg = config.resolved()  # bad options fail here, before anything starts
    title = (
        f"ep: {cfg.ranks} ranks, {cfg.layers} layers, {cfg.experts} experts top-{cfg.top_k}, hidden {cfg.hidden}, "
        f"{cfg.tokens_per_rank} tokens/rank, skew {cfg.skew:g}"
        + (", two-batch overlap" if cfg.two_batch_overlap else "")
        + f", {cfg.dtype}"
    )
    run_dir, config_dict = run_workload(lambda progress: run_ep(cfg, on_progress=progress), f"ep on {cfg.ranks} ranks")
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
