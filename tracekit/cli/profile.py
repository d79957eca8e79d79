"""`tracekit profile [OPTIONS] -- COMMAND ...`: profile a live job with no code change.

Thin: the work is in ``tracekit.collectors.profile.runner`` (run, gather, ingest) and
``tracekit.report.data``. Everything after ``--`` is the job's command line, passed
through untouched (its own options never reach tracekit's parser).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from tracekit.errors import BadInputError

_META_KEY = "tracekit.profile.command"


class _DashDashCommand(TyperCommand):
    """Splits the arguments at the first ``--``: tracekit's options before, the job's command after."""

    def parse_args(self, ctx, args):
        args = list(args)
        if "--" in args:
            i = args.index("--")
            ctx.meta[_META_KEY] = args[i + 1 :]
            args = args[:i]
        else:
            ctx.meta[_META_KEY] = None
        return super().parse_args(ctx, args)


HELP = (
    'Profile a live job with no change to its code, then ingest it and print the report.\n\n'
    "Runs COMMAND (e.g. `torchrun --nproc-per-node 2 train.py`, `python -m torch.distributed.run ...`, `python train.py`) with torch.profiler injected into every Python process it starts: a `sitecustomize` first on PYTHONPATH starts the profiler when torch.distributed is initialised, advances its schedule on every optimizer step (or on every `tracekit.step()` in loops without an optimizer), and writes each rank's trace after the active steps or at exit. The traces are then ingested as one run (workload `external`, the command recorded in its config) and the report is printed.\n\n"
    "A job that exits non-zero still has what it wrote ingested; the run is marked partial and tracekit exits with the job's code. Ctrl-C stops the whole job (a second Ctrl-C forces it) and keeps what was written (exit 130).\n\n"
    "Multi-node: run the same `tracekit profile --out DIR -- torchrun --nnodes N --node-rank R --rdzv-endpoint HOST:PORT ... train.py` on every node, or `srun tracekit profile --out DIR -- python train.py` (one per task: rank and world size from SLURM_PROCID and SLURM_NTASKS, set as RANK, WORLD_SIZE and LOCAL_RANK when the job's environment has none), with DIR on a filesystem every node sees. All nodes write into one run folder, DIR/<run id> (--run-id, else one derived from torchrun's --rdzv-id, else from the rendezvous and the command, or the SLURM job and step), each rank's trace under its own name; node 0 (--node-rank 0, SLURM_PROCID 0) waits until every node's job has ended or every expected rank (--expect-ranks, else the world size the ranks report) has finished, at most --nodes-timeout seconds, names the ranks still missing, and ingests; the other nodes only write (or ingest the folder later with `tracekit ingest DIR/<run id>`).\n\n"
    "With --nsys the job runs under `nsys profile` (Nsight Systems, which must be on PATH) instead: no torch.profiler is injected, the schedule options do not apply, and nsys' one SQLite export of the whole job (job.sqlite, every process of the job in that one file) is ingested as one rank.\n\n"
    'Overhead: the profiler slows the steps it records (the run config gets `profiler_overhead_pct`: recorded vs idle steps of the same run, when the job runs at least 2 steps of each). To keep it low: a short --active window (2-3 steps are enough for a steady loop), no --with-stack (Python stacks are costly), --no-record-shapes when collective sizes are not needed (they are on gloo/CPU), and --wait to skip the start-up steps.'
)


COMMAND_OPTIONS = dict(
    cls=_DashDashCommand,
    help=HELP,
    options_metavar="[OPTIONS] -- COMMAND [ARGS]...",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
"""How ``tracekit profile`` is declared (typer's ``app.command`` options; the list in tracekit/cli/__init__.py)."""


def profile(
    ctx: typer.Context,
    wait: int = typer.Option(1, "--wait", help="Profiler schedule (torch.profiler.schedule's wait): steps skipped first."),
    warmup: int = typer.Option(1, "--warmup", help="Profiler schedule: warm-up steps (traced, discarded)."),
    active: int = typer.Option(3, "--active", help="Profiler schedule: recorded steps per cycle (fewer = less overhead)."),
    repeat: int = typer.Option(1, "--repeat", help="Profiler cycles (0 = until the job ends); cycles after the first are kept, not ingested."),
    record_shapes: bool = typer.Option(
        True, "--record-shapes/--no-record-shapes", help="Record op input shapes (gives collective sizes on gloo)."
    ),
    with_stack: bool = typer.Option(False, "--with-stack", help="Record Python stacks (costly)."),
    store: Optional[Path] = typer.Option(None, "--store", help="Store directory (default: $TRACEKIT_STORE or ./tracekit-store)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run (default: external-<date>-<time>-<hex>)."),
    out: Path = typer.Option(Path("tracekit-runs"), "--out", help="Folder that receives the run folder with the raw traces."),
    nsys: bool = typer.Option(
        False, "--nsys", help="Run the job under `nsys profile` (needs nsys on PATH) instead of injecting torch.profiler."
    ),
    expect_ranks: Optional[int] = typer.Option(
        None, "--expect-ranks", help="Multi-node: the ranks node 0 waits for until a rank reports torch.distributed's world size, which wins."
    ),
    wait_timeout: float = typer.Option(
        300.0, "--nodes-timeout", help="Multi-node: seconds node 0 waits for the other nodes after its own job ended."
    ),
    wait_timeout_old: Optional[float] = typer.Option(
        None, "--wait-timeout", hidden=True, help="Deprecated name of --nodes-timeout (read, with a warning)."
    ),
    fr: bool = typer.Option(
        False, "--fr", help="Flight Recorder on in every rank; each rank dumps it into the run folder when the job ends, "
        "fails, is stopped or runs past --timeout, and the dumps are ingested with the traces (the report's hang section)."
    ),
    fr_only: bool = typer.Option(
        False, "--fr-only", help="Flight Recorder alone, no torch.profiler (cheap enough to leave on): per-collective "
        "counts, sizes and, where the backend records them, durations of the last --fr-buffer calls per rank, and the hang section."
    ),
    fr_buffer: int = typer.Option(2000, "--fr-buffer", help="Flight Recorder entries kept per rank (TORCH_FR_BUFFER_SIZE)."),
    timeout: Optional[float] = typer.Option(
        None, "--timeout", help="Stop the job after this many seconds (with --fr every rank dumps first); exit 124."
    ),
) -> None:
    from tracekit.collectors.profile.runner import USAGE, JobFailedError, ProfileOptions, no_trace_message, profile_command

    command = ctx.meta.get(_META_KEY)
    if command is None or not command:
        extra = f" (got {' '.join(ctx.args)!r} without --)" if ctx.args and command is None else ""
        raise BadInputError(f"{USAGE}{extra}")
    if ctx.args:
        raise BadInputError(f"unexpected argument(s) before --: {' '.join(ctx.args)} ({USAGE})")
    if not nsys:
        from tracekit.cli.conventions import require_torch

        require_torch("profile")  # the injected profiler is torch.profiler (--nsys needs no torch here)
    if nsys:
        from tracekit.collectors.nsys import find_nsys

        find_nsys()  # no nsys on PATH: one clear line, exit 2, nothing started
    if wait_timeout_old is not None:  # the old name, easily read as the profiler schedule's --wait
        print("tracekit profile: --wait-timeout is deprecated, use --nodes-timeout", file=sys.stderr, flush=True)
        wait_timeout = wait_timeout_old
    from tracekit.store import Store

    st = Store(store)
    opts = ProfileOptions(
        wait=wait, warmup=warmup, active=active, repeat=repeat, record_shapes=record_shapes,
        with_stack=with_stack, out=str(out), run_id=run_id, nsys=nsys,
        expect_ranks=expect_ranks, wait_timeout_s=wait_timeout, fr=fr, fr_only=fr_only, fr_buffer=fr_buffer, timeout_s=timeout,
    ).validated()  # a bad option is one line before anything runs or is said to run

    def progress(msg: str) -> None:
        print(f"tracekit profile: {msg}", file=sys.stderr, flush=True)

    progress(f"running {' '.join(command)} " + ("under nsys profile" if nsys else "with the profiler injected"))
    result, rid = profile_command(command, opts, store=st, on_progress=progress)
    cfg = result.config
    node = result.launcher
    if node is not None and node.index != 0:
        ranks = ", ".join(map(str, sorted(result.traces))) or "none"
        progress(f"node {node.index} ({node.source}): job exited with code {result.exit_code}; traces of rank(s) "
                 f"{ranks} in {result.run_dir}; node 0 ingests the run (or: tracekit ingest {result.run_dir})")
        if result.exit_code:
            raise JobFailedError(f"the job on node {node.index} exited with code {result.exit_code}", result.exit_code)
        return
    if rid is not None:
        from tracekit.report.data import print_run_report

        print_run_report(st, rid)
        overhead = cfg.get("profiler_overhead_pct")
        from tracekit.cli.conventions import overhead_text

        tail = f"; {overhead_text(overhead)}" if overhead is not None else ""
        if nsys:
            progress(
                f"run {rid} in {st.path}: one nsys session, {result.traces[0].name}, ingested as one rank "
                f"(raw output in {result.run_dir}; job {result.wall_s:.1f} s)"
            )
        else:
            progress(
                f"run {rid} in {st.path}: ranks {', '.join(map(str, sorted(result.traces or result.fr_dumps)))} of {result.world_size} "
                f"(traces in {result.run_dir}; job {result.wall_s:.1f} s){tail}"
            )
    for note in cfg.get("notes", []):
        warn = cfg.get("partial") or (nsys and note.startswith("nsys:"))  # one file for all ranks: a caveat
        print(f"warning: {note}" if warn else f"note: {note}", file=sys.stderr)
    if rid is None:
        raise JobFailedError(no_trace_message(result), result.exit_code or 1)
    if cfg.get("partial"):
        missing = cfg.get("missing_ranks") or []
        miss = f"; no trace from rank(s) {', '.join(map(str, missing))}" if missing else ""
        how = "was interrupted" if result.interrupted else f"exited with code {result.exit_code}"
        if node is not None and not result.interrupted and not result.exit_code:  # node 0 ran fine: say which did not
            bad = [f"node {i} exited with code {c}" for i, c in sorted(cfg.get("failed_nodes", {}).items())]
            bad += [f"node(s) {', '.join(map(str, cfg['missing_nodes']))} did not finish"] if cfg.get("missing_nodes") else []
            how = "exited with code 0 on node 0" + (", " + ", ".join(bad) if bad else "")
        msg = f"run {rid} is partial: the job {how}{miss}"
        if result.exit_code:
            raise JobFailedError(msg, result.exit_code)
        print(f"warning: {msg}", file=sys.stderr)
