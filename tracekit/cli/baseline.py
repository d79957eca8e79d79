"""`tracekit baseline set NAME RUN` / `tracekit baseline list`: named baselines for `tracekit diff
baseline:NAME NEW` (tracekit/store/baselines.py does the work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

baseline_app = typer.Typer(help="Named baselines: a name that points at a run, for `tracekit diff baseline:NAME RUN`.",
                           no_args_is_help=True)

_STORE = typer.Option(None, "--store", help="Store directory (default: $TRACEKIT_STORE or ./tracekit-store).")


@baseline_app.command("set")
def set_(
    name: str = typer.Argument(..., help="Baseline name (letters, digits, '.', '_', '-')."),
    run: str = typer.Argument(..., help="The run it points at (a run id of the store)."),
    store: Optional[Path] = _STORE,
) -> None:
    """Point baseline NAME at RUN (replacing its previous run)."""
    from tracekit.store import Store
    from tracekit.store.baselines import set_baseline

    rec = set_baseline(Store(store), name, run)
    typer.echo(f"baseline {rec['name']} → run {rec['run_id']} (compare with: tracekit diff baseline:{rec['name']} NEW_RUN)")


@baseline_app.command("list")
def list_(
    store: Optional[Path] = _STORE,
    json_out: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """List the baselines: name, run, when set (UTC), and whether the run is still there."""
    from tracekit.store import Store
    from tracekit.store.baselines import list_baselines

    recs = list_baselines(Store(store))
    if json_out:
        typer.echo(json.dumps(recs, indent=2))
        return
    if not recs:
        typer.echo("no baselines (set one with: tracekit baseline set NAME RUN)")
        return
    for r in recs:
        state = "" if r["present"] else "  (run no longer in the store)"
        if r["replaced"]:
            state = "  (run re-ingested since)"
        typer.echo(f"{r['name']}\t{r['run_id']}\t{r['set_at']}{state}")
