"""`tracekit collect WORKLOAD`: run a built-in real workload on N ranks with the
profiler on, then ingest its traces and print the report.

Thin: the work is in ``collectors`` (``collectors.workloads.tp.run_tp``),
``tracekit.ingest.ingest_paths`` and ``tracekit.report``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    help="Run a built-in real workload (tp, ...) on N ranks with the profiler on, then ingest it.",
    no_args_is_help=True,
)


OUT_HELP = "Folder that receives the run folder."
STORE_HELP = "Store to ingest into (default: $TRACEKIT_STORE or ./tracekit-store)."
INGEST_HELP = "Ingest the traces and print the report."

# Options the model workloads (tp, ep, pp, disagg-kv) share: collectors.launch.RunOptions
STEPS_OPT = typer.Option(None, "--steps", help="Forward steps (default: wait + warmup + active).")
DTYPE_OPT = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16.")
BACKEND_OPT = typer.Option("auto", "--backend", help="auto (nccl with CUDA, else gloo), gloo or nccl.")
WAIT_OPT = typer.Option(1, "--wait", help="Profiler schedule: steps skipped.")
WARMUP_OPT = typer.Option(1, "--warmup", help="Profiler schedule: warm-up steps (traced, discarded).")
ACTIVE_OPT = typer.Option(3, "--active", help="Profiler schedule: recorded steps.")
SEED_OPT = typer.Option(0, "--seed", help="Seed of the weights and inputs.")
OUT_OPT = typer.Option(Path("tracekit-runs"), "--out", help=OUT_HELP)
STORE_OPT = typer.Option(None, "--store", help=STORE_HELP)
INGEST_OPT = typer.Option(True, "--ingest/--no-ingest", help=INGEST_HELP)


@app.command("tp")
def tp(
    ranks: int = typer.Option(2, "--ranks", help="Tensor-parallel ranks (processes), 1-8."),
    layers: int = typer.Option(4, "--layers", help="Transformer layers."),
    hidden: int = typer.Option(512, "--hidden", help="Hidden size."),
    heads: int = typer.Option(8, "--heads", help="Attention heads (divisible by --ranks)."),
    ffn: Optional[int] = typer.Option(None, "--ffn", help="MLP inner size (default: 8/3 x hidden, rounded up to 64)."),
    seq: int = typer.Option(128, "--seq", help="Sequence length."),
    batch: int = typer.Option(4, "--batch", help="Batch size."),
    steps: Optional[int] = STEPS_OPT,
    dtype: str = DTYPE_OPT,
    backend: str = BACKEND_OPT,
    wait: int = WAIT_OPT,
    warmup: int = WARMUP_OPT,
    active: int = ACTIVE_OPT,
    seed: int = SEED_OPT,
    overlap_chunks: int = typer.Option(
        1, "--overlap-chunks", help="Split the tokens into N chunks; chunk i's all-reduce runs (async) while chunk i+1 computes."
    ),
    profiler: str = typer.Option(
        "torch",
        "--profiler",
        help="torch (torch.profiler, Kineto JSON per rank) or nsys (each rank under `nsys profile`, "
        "rank{r}.sqlite; needs nsys on PATH).",
    ),
    out: Path = OUT_OPT,
    store: Optional[str] = STORE_OPT,
    ingest: bool = INGEST_OPT,
) -> None:
    """Megatron-style tensor-parallel transformer (two all-reduces per layer), profiled on every rank."""
    from collectors.workloads.tp import TPConfig, run_tp

    config = TPConfig(
        ranks=ranks,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn=ffn,
        seq=seq,
        batch=batch,
        steps=steps,
        dtype=dtype,
        backend=backend,
        seed=seed,
        wait=wait,
        warmup=warmup,
        active=active,
        overlap_chunks=overlap_chunks,
        profiler=profiler,
        out=str(out),
    )
    cfg = config.resolved()  # bad options fail here, before anything starts
    if cfg.profiler == "nsys":
        from collectors.nsys import find_nsys

        find_nsys()  # no nsys on PATH: one clear line, exit 2, nothing created
    title = (
        f"tp: {cfg.ranks} ranks, {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}, "
        f"seq {cfg.seq}, batch {cfg.batch}, {cfg.dtype}"
        + (f", {cfg.overlap_chunks} overlap chunks" if cfg.overlap_chunks > 1 else "")
        + (", under nsys" if cfg.profiler == "nsys" else "")
    )
    run_dir, config_dict = run_workload(lambda progress: run_tp(cfg, on_progress=progress), f"tp on {cfg.ranks} ranks")
    check = config_dict["tp_check"]
    print(
        f"{title}: {run_dir} (TP check passed, max abs error {check['max_abs_err']:.3g}; "
        f"job {config_dict['timing']['job_wall_s']:.1f} s)",
        file=sys.stderr,
    )
    if ingest:
        ingest_and_report(run_dir, "tp", config_dict, store)


def run_workload(job, title: str) -> tuple[Path, dict]:
    """Run ``job(progress)`` (see :func:`_run_with_status`); return its run
    folder and the run_config.json it wrote."""
    run_dir = _run_with_status(job, title)
    return run_dir, json.loads((run_dir / "run_config.json").read_text())


def ingest_and_report(run_dir: Path, workload: str, config_dict: dict, store: Optional[str]) -> None:
    """Ingest `run_dir` into `store` (default: the store's default path) and print the report."""
    from tracekit.ingest import ingest_paths
    from tracekit.report import build_report, print_report
    from tracekit.store import default_store_path

    store = store or str(default_store_path())
    run_id = ingest_paths([str(run_dir)], store=store, workload=workload, config=config_dict, run_id=run_dir.name)
    print_report(build_report(store, run_id))


def _run_with_status(job, title: str):
    """Run ``job(progress)``; on a terminal, show a rich status line fed by `progress`."""
    if not sys.stdout.isatty():
        return job(None)
    from rich.console import Console

    console = Console()
    with console.status(f"{title}: starting ranks") as status:
        return job(lambda text: status.update(f"{title}: {text}"))

from tracekit.cli import collect_sweep as _collect_sweep  # noqa: E402,F401
from tracekit.cli import collect_ep as _collect_ep  # noqa: E402,F401
from tracekit.cli import collect_pp as _collect_pp  # noqa: E402,F401
