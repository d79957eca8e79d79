"""`tracekit collect WORKLOAD`: run a built-in real workload on N ranks with the profiler on, then
ingest its traces and print the report. :data:`WORKLOADS` lists every workload once.

Thin: the work is in ``tracekit.collectors`` (``tracekit.collectors.workloads``),
``tracekit.ingest.ingest_paths`` and ``tracekit.report.data``; what the workloads share is in
tracekit/cli/collect_run.py.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from tracekit.cli import collect_3d, collect_ep, collect_pp, collect_sweep, conventions
from tracekit.cli.collect_run import ingest_and_report, run_workload, workload_command
from tracekit.collectors.workloads.disagg_kv import KVConfig
from tracekit.collectors.workloads.pp import PPConfig
from tracekit.collectors.workloads.sweep import SweepConfig
from tracekit.collectors.workloads.threed import ThreeDConfig
from tracekit.collectors.workloads.ep import EPConfig
from tracekit.collectors.workloads.tp import TPConfig  # the options' declarations only: no torch on import


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


WORKLOADS = (
    ("tp", TPConfig, tp),
    ("sweep", SweepConfig, collect_sweep.sweep),
    ("ep", EPConfig, collect_ep.ep),
    ("pp", PPConfig, collect_pp.pp),
    ("disagg-kv", KVConfig, collect_pp.disagg_kv),
    ("3d", ThreeDConfig, collect_3d.three_d),
)
"""Every workload of ``tracekit collect``: (command name, config class whose fields are its
options, ``fn(config, store, ingest)``), in ``--help`` order."""

app = typer.Typer(no_args_is_help=True)  # listed lazily under `tracekit collect` (tracekit/cli/commands.py)
for _name, _config, _fn in WORKLOADS:
    app.command(_name)(workload_command(_name, _config, _fn))

conventions.apply(app)  # the top-level app applied them before this module loaded: its own commands, here
