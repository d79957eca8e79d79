"""``tracekit whatif``: a run's steps replayed with edits (tracekit.report.whatif)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tracekit.cli.commands import StoreOpt, _store


def whatif(
    run: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest run)."),
    store: Optional[Path] = StoreOpt,
    link: Optional[str] = typer.Option(None, "--link", help="Collectives' transfer times from the α–β model on this link preset (nvlink5, ib_ndr, ...)."),
    algo: Optional[str] = typer.Option(None, "--algo", help="... with this algorithm (ring, tree, nvls, ...; default: each op's own); needs --link."),
    machine: Optional[str] = typer.Option(None, "--machine", help="Collectives' transfer times from NCCL's own model on this machine (preset, e.g. dgx-h100, or TOML file); not with --link."),
    ops: Optional[str] = typer.Option(None, "--ops", help="... only for collectives whose op or kernel name matches (substring or glob)."),
    scale: Optional[str] = typer.Option(None, "--scale", help="Scale work by class or name: 'gemm=0.5,compute=0.9'."),
    stragglers: bool = typer.Option(True, "--stragglers/--no-stragglers", help="--no-stragglers aligns arrivals: cuts each rank's delays above the other ranks' median."),
    chunk: Optional[str] = typer.Option(None, "--chunk", help="Pipeline matching collectives with the compute before them in N pieces: 'all_reduce=4' (needs --link for α)."),
    move_off: Optional[str] = typer.Option(None, "--move-off", help="Move matching collectives off the compute stream: 'all_reduce'."),
    delay: Optional[str] = typer.Option(None, "--delay", help="Make a straggler: 'RANK:MS@PATTERN' delays the rank's first op matching PATTERN in each step."),
    step: Optional[list[int]] = typer.Option(None, "--step", help="Only this profiler step (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write the answer as a self-contained HTML page with plots to this file."),
) -> None:
    """Predict the step time of a change: each step's graph across ranks replayed, as is and edited.

    The graph is the critical path's (stream, thread, launch, sync, collective last arrival); per
    rank: measured vs replayed vs edited step time, the critical path's composition before and
    after, which collectives changed and how much of it was hidden.
    """
    import json

    from tracekit import analyses
    from tracekit.report.whatif import whatif_answer, whatif_html, whatif_text

    st = _store(store, must_exist=True)
    rid = st.resolve_run(run)
    con = analyses.connect(st, run_ids=[rid])
    try:
        ans = whatif_answer(con, rid, link=link, algo=algo, scale=scale, no_stragglers=not stragglers, chunk=chunk,
                            move_off=move_off, ops=ops, delay=delay, machine=machine, steps=step or None)
    finally:
        con.close()
    if html_out is not None:
        try:
            html_out.write_text(whatif_html(ans), encoding="utf-8")
        except OSError as exc:
            from tracekit.errors import FileError

            raise FileError(html_out, f"cannot write the HTML page ({exc.strerror or exc})") from None
        typer.echo(f"wrote {html_out}", err=True)
    typer.echo(json.dumps(ans, indent=2) if json_out else whatif_text(ans))
