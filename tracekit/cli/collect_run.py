"""What every ``tracekit collect`` workload shares: its command's options from the config class
(:func:`workload_command`), running the job with a status line, then ingest and the report.

Thin: the work is in ``tracekit.collectors``, ``tracekit.ingest.ingest_paths`` and
``tracekit.report.data``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer


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


def workload_command(name: str, config_cls, fn):
    """``fn(config, store, ingest)`` as the typer command function of ``tracekit collect NAME``
    (tracekit/cli/collect.py lists and registers them).

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

    def command(**kw):
        from tracekit.cli.conventions import require_torch

        require_torch(f"collect {name}")
        out, store, ingest = kw.pop("out"), kw.pop("store"), kw.pop("ingest")
        return fn(config_cls(**kw, out=str(out)), store, ingest)

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__, command.__name__ = fn.__doc__, fn.__name__
    return command


def run_workload(job, title: str) -> tuple[Path, dict]:
    """Run ``job(progress)`` (see :func:`_run_with_status`); return its run
    folder and the run_config.json it wrote."""
    run_dir = _run_with_status(job, title)
    return run_dir, json.loads((run_dir / "run_config.json").read_text())


def ingest_and_report(run_dir: Path, workload: str, config_dict: dict, store: Optional[str]) -> None:
    """Ingest `run_dir` into `store` (default: the store's default path) and print the report."""
    from tracekit.ingest import ingest_paths
    from tracekit.report.data import print_run_report
    from tracekit.store import default_store_path

    store = store or str(default_store_path())
    run_id = ingest_paths([str(run_dir)], store=store, workload=workload, config=config_dict, run_id=run_dir.name)
    print_run_report(store, run_id)


def _run_with_status(job, title: str):
    """Run ``job(progress)``; on a terminal, show a rich status line fed by `progress`."""
    if not sys.stdout.isatty():
        return job(None)
    from rich.console import Console

    console = Console()
    with console.status(f"{title}: starting ranks") as status:
        return job(lambda text: status.update(f"{title}: {text}"))
