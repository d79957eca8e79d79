"""`tracekit export` (merged Chrome/Perfetto JSON) and `tracekit diff` (two runs side by side).

Thin: each parses its options and calls :func:`tracekit.report.perfetto.export_perfetto` or
:func:`tracekit.report.diff.diff_runs`; the library does the work and raises tracekit's errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

_STORE_HELP = "Store directory (default: $TRACEKIT_STORE or ./tracekit-store)."


def export(
    perfetto: Path = typer.Option(..., "--perfetto", help="Write one merged Chrome/Perfetto trace JSON here."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest run)."),
    store: Optional[Path] = typer.Option(None, "--store", help=_STORE_HELP),
    critical_path: Optional[bool] = typer.Option(
        None, "--critical-path/--no-critical-path",
        help="Add the critical paths as a process (default: only for runs of at most 1,000,000 events)."),
) -> None:
    """Export a run as one Perfetto / chrome://tracing JSON: a process per rank, collectives linked across ranks."""
    from tracekit.report.perfetto import export_perfetto
    from tracekit.store import Store

    st = export_perfetto(Store(store), perfetto, run_id=run, critical_path=critical_path)
    typer.echo(
        f"wrote {st.path}: run {st.run_id}, {st.processes} ranks, {st.tracks} tracks, {st.slices:,} slices"
        + (f" ({st.overflow_slices:,} on overflow tracks)" if st.overflow_slices else "")
        + f", {st.instances_linked:,} collective instances linked by {st.flows:,} flow arrows"
        + (f", critical paths in {st.path_slices:,} slices" if st.path_slices else "")
    )


def diff(
    run_a: str = typer.Argument(..., help="The run before (A)."),
    run_b: str = typer.Argument(..., help="The run after (B)."),
    store: Optional[Path] = typer.Option(None, "--store", help=_STORE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
) -> None:
    """Two runs side by side per op and size bucket (count, sync time, busbw, wait, overlap, exposed comm)."""
    from tracekit.report.diff import diff_runs, print_diff
    from tracekit.store import Store

    d = diff_runs(Store(store), run_a, run_b)
    if json_out:
        typer.echo(json.dumps(d, indent=2, allow_nan=False, default=str))
    else:
        print_diff(d)
