"""`tracekit collect sweep`: the calibration sweep (collectors/workloads/sweep.py),
then ingest and the report with this machine's fitted α, β and n½ per op.

Registered on ``tracekit.cli.collect.app`` by an import at the end of that module.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from tracekit.cli.collect import INGEST_OPT, OUT_OPT, STORE_OPT, app, ingest_and_report, run_workload


@app.command("sweep")
def sweep(
    ranks: int = typer.Option(2, "--ranks", help="Ranks (processes), 2-8."),
    backend: str = typer.Option("auto", "--backend", help="auto (nccl with CUDA, else gloo), gloo or nccl."),
    ops: str = typer.Option(
        "all_reduce,all_gather,reduce_scatter,all_to_all,send_recv",
        "--ops",
        help="Comma-separated ops: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv.",
    ),
    min_bytes: str = typer.Option("1K", "--min-bytes", help="Smallest size S (bytes; K/M/G or KiB/MiB/GiB binary, KB/MB/GB decimal)."),
    max_bytes: str = typer.Option("64M", "--max-bytes", help="Largest size S (bytes; K/M/G or KiB/MiB/GiB binary, KB/MB/GB decimal)."),
    factor: int = typer.Option(4, "--factor", help="Each size is the previous one times this (integer >= 2)."),
    iters: int = typer.Option(5, "--iters", help="Measured calls per (op, size)."),
    warmup_iters: int = typer.Option(2, "--warmup-iters", help="Warm-up calls per (op, size), not in the trace."),
    out: Path = OUT_OPT,
    store: Optional[str] = STORE_OPT,
    ingest: bool = INGEST_OPT,
) -> None:
    """Calibration sweep: every op over sizes min..max (×factor), for the α–β fit.

    S is nccl-tests' size: the all-reduce buffer, the all-gather output, the
    reduce-scatter input, the all-to-all send buffer, the send/recv message.
    The defaults (1 KiB to 64 MiB, ×4, 5 calls after 2 warm-up calls) take
    about 20 s on 2 CPU ranks over gloo; --max-bytes 16M roughly halves it.
    """
    from collectors.workloads.sweep import SweepConfig, run_sweep

    cfg = SweepConfig(
        ranks=ranks, backend=backend, ops=ops, min_bytes=min_bytes, max_bytes=max_bytes, factor=factor,
        iters=iters, warmup_iters=warmup_iters, out=str(out),
    ).resolved()  # bad options fail here, before anything starts
    run_dir, config_dict = run_workload(lambda progress: run_sweep(cfg, on_progress=progress), f"sweep on {cfg.ranks} ranks")
    print(
        f"sweep: {cfg.ranks} ranks, {', '.join(cfg.ops)}; {len(cfg.sizes)} sizes {cfg.sizes[0]:,}..{cfg.sizes[-1]:,} B, "
        f"{cfg.iters} calls each after {cfg.warmup_iters} warm-up: {run_dir} "
        f"(job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "sweep", config_dict, store)
