"""`tracekit collect WORKLOAD`: run a built-in real workload on N ranks with the
profiler on, then ingest its traces and print the report.

Thin: the work is in ``tracekit.collectors`` (``tracekit.collectors.workloads.tp.run_tp``),
``tracekit.ingest.ingest_paths`` and ``tracekit.report.data``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tracekit.collectors.workloads.tp import TPConfig  # the options' declarations only: no torch on import

from tracekit.cli.commands import COLLECT_HELP  # noqa: E402

app = typer.Typer(help=COLLECT_HELP, no_args_is_help=True)  # listed lazily under `tracekit collect` (cli/commands.py)


OUT_HELP = "Folder that receives the run folder."
STORE_HELP = "Store to ingest into (default: $TRACEKIT_STORE or ./tracekit-store)."
INGEST_HELP = "Ingest the traces and print the report."

OUT_OPT = typer.Option(Path("tracekit-runs"), "--out", help=OUT_HELP)
STORE_OPT = typer.Option(None, "--store", help=STORE_HELP)
INGEST_OPT = typer.Option(True, "--ingest/--no-ingest", help=INGEST_HELP)


def _optional(t):
    """``int | None`` → ``Optional[int]`` (the spelling every typer version reads)."""
    import types
    import typing

    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return Optional[args[0]]
    return t


def workload_command(name: str, config_cls):
    """Register the decorated ``fn(config, store, ingest)`` as ``tracekit collect NAME``.

    The options are the fields of ``config_cls`` declared with ``tracekit.collectors.launch.option``, each
    one's flag (``--field-name``; ``--x/--no-x`` for a bool), type, default and help taken from the
    field — the workload's own fields first, then the shared ones — plus ``--out``, ``--store`` and
    ``--ingest``. ``config`` is ``config_cls(**options, out=str(out))``, not yet resolved.
    """
    import dataclasses
    import inspect
    import typing

    hints = typing.get_type_hints(config_cls)
    own = set(config_cls.__dict__.get("__annotations__", {}))
    fields = sorted((f for f in dataclasses.fields(config_cls) if "help" in f.metadata), key=lambda f: f.name not in own)
    kw_only = inspect.Parameter.KEYWORD_ONLY
    params = []
    for f in fields:
        typ = _optional(f.metadata.get("cli_type", hints[f.name]))
        flag = "--" + f.name.replace("_", "-")
        decl = f"{flag}/--no-{flag[2:]}" if typ is bool else flag
        opt = typer.Option(f.metadata.get("cli_default", f.default), decl, help=f.metadata["help"])
        params.append(inspect.Parameter(f.name, kw_only, default=opt, annotation=typ))
    for pname, opt, typ in (("out", OUT_OPT, Path), ("store", STORE_OPT, Optional[str]), ("ingest", INGEST_OPT, bool)):
        params.append(inspect.Parameter(pname, kw_only, default=opt, annotation=typ))

    def deco(fn):
        def command(**kw):
            from tracekit.cli.conventions import require_torch

            require_torch(f"collect {name}")
            out, store, ingest = kw.pop("out"), kw.pop("store"), kw.pop("ingest")
            return fn(config_cls(**kw, out=str(out)), store, ingest)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__doc__, command.__name__ = fn.__doc__, fn.__name__
        app.command(name)(command)
        return fn

    return deco


@workload_command("tp", TPConfig)
def tp(config: TPConfig, store: Optional[str], ingest: bool) -> None:
    """Megatron-style tensor-parallel transformer (two all-reduces per layer), profiled on every rank."""
    from tracekit.collectors.workloads.tp import run_tp

    cfg = config.resolved()  # bad options fail here, before anything starts
    if cfg.profiler == "nsys":
        from tracekit.collectors.nsys import find_nsys

        find_nsys()  # no nsys on PATH: one clear line, exit 2, nothing created
    title = (
        f"tp: {cfg.ranks} ranks, {cfg.layers} layers, hidden {cfg.hidden}, heads {cfg.heads}, "
        f"seq {cfg.seq}, batch {cfg.batch}, {cfg.dtype}"
        + (f", {cfg.overlap_chunks} overlap chunks" if cfg.overlap_chunks > 1 else "")
        + (", training (forward + backward + SGD)" if cfg.mode == "train" else "")
        + (", under nsys" if cfg.profiler == "nsys" else "")
    )
    run_dir, config_dict = run_workload(lambda progress: run_tp(cfg, on_progress=progress), f"tp on {cfg.ranks} ranks")
    check = config_dict["tp_check"]
    what = (
        f"gradient check passed, max relative error {check['max_grad_rel_rms_err']:.3g}"
        if cfg.mode == "train"
        else f"TP check passed, max abs error {check['max_abs_err']:.3g}"
    )
    print(f"{title}: {run_dir} ({what}; job {config_dict['timing']['job_wall_s']:.1f} s)", file=sys.stderr)
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
    from tracekit.report.data import build_report, print_report
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
from tracekit.cli import collect_3d as _collect_3d  # noqa: E402,F401

from tracekit.cli import conventions as _conventions  # noqa: E402

_conventions.apply(app)  # imported after the top-level app applied them: its own commands, here
