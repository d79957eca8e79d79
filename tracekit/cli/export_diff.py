"""`tracekit export` (merged Chrome/Perfetto JSON) and `tracekit diff` (two runs side by side).

Thin: each parses its options and calls :func:`tracekit.report.perfetto.export_perfetto` or
:func:`tracekit.report.diff.diff_runs`; the library does the work and raises tracekit's errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

_STORE_HELP = "Store directory (default: $TRACEKIT_STORE or ./tracekit-store)."


def export(
    perfetto: Path = typer.Option(..., "--perfetto", help="Write one merged Chrome/Perfetto trace JSON here."),
    run: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest run)."),
    store: Optional[Path] = typer.Option(None, "--store", help=_STORE_HELP),
    critical_path: Optional[bool] = typer.Option(
        None, "--critical-path/--no-critical-path",
        help="Add the critical paths as a process (default: on)."),
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
    run_a: str = typer.Argument(..., help="The run before (A): a run id or baseline:NAME (tracekit baseline set)."),
    run_b: str = typer.Argument(..., help="The run after (B): a run id or baseline:NAME."),
    store: Optional[Path] = typer.Option(None, "--store", help=_STORE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the diff as JSON (with the gate's verdict under 'gate')."),
    fail_on: List[str] = typer.Option(
        [], "--fail-on", metavar="RULE",
        help="CI gate: exit 1 when B breaks this rule against A, e.g. 'exposed_comm>+5%' or 'busbw<-10%' "
             "(repeatable; grammar and metrics in the README, 'CI gate')."),
) -> None:
    """Two runs side by side per op and size bucket (count, sync time, busbw, wait, overlap, exposed comm);
    with --fail-on, a CI gate: exit 1 and the offending rows when B regressed against A."""
    from tracekit.report.diff import diff_runs, evaluate_gate, parse_fail_on, print_diff, print_gate
    from tracekit.store import Store
    from tracekit.store.baselines import resolve_run

    rules = [parse_fail_on(e) for e in fail_on]  # a bad rule stops here: exit 2 before any work
    st = Store(store)
    ids = []
    for ref in (run_a, run_b):
        rid, warn = resolve_run(st, ref)
        if warn:
            typer.echo(f"tracekit: warning: {warn}", err=True)
        ids.append(rid)
    d = diff_runs(st, ids[0], ids[1])
    gate = evaluate_gate(d, rules) if rules else None
    if json_out:
        typer.echo(json.dumps(d if gate is None else {**d, "gate": gate}, indent=2, allow_nan=False, default=str))
    else:
        print_diff(d)
        if gate is not None:
            print_gate(gate)
    if gate is not None and not gate["passed"]:
        raise typer.Exit(1)

