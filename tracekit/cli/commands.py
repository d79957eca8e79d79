"""The top-level commands ingest, analyze, runs and sql, and the lazily loaded ``collect`` group
(listed on the app in tracekit/cli/__init__.py).

Each command parses arguments and calls a library function; heavy imports
(DuckDB, pyarrow) happen inside the command bodies.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from typer.core import TyperGroup

COLLECT_HELP = "Run a built-in real workload (tp, ...) on N ranks with the profiler on, then ingest it."


class LazyCollect(TyperGroup):
    """The ``tracekit collect`` group, whose subcommands (tracekit/cli/collect.py and the workload
    configs of tracekit.collectors they read their options from) are imported when a command line,
    ``--help`` or a caller first lists or looks them up (``commands``), not when the CLI starts:
    ``tracekit ingest``/``analyze`` never load the collectors."""

    _loaded: dict | None = None  # name → click command, built once per process

    @property
    def commands(self):
        if LazyCollect._loaded is None:
            import typer.main

            from tracekit.cli import collect

            LazyCollect._loaded = typer.main.get_command(collect.app).commands
        return LazyCollect._loaded

    @commands.setter
    def commands(self, value) -> None:  # click's Group.__init__ sets the (empty) dict of the stub
        pass



def collect_group() -> typer.Typer:
    """The ``tracekit collect`` group: its commands (tracekit/cli/collect.py) loaded on first lookup."""
    return typer.Typer(cls=LazyCollect, help=COLLECT_HELP, no_args_is_help=True)


StoreOpt = typer.Option(None, "--store", help="Store directory (default: $TRACEKIT_STORE or ./tracekit-store).")


def _store(path: Optional[Path], must_exist: bool = False):
    from tracekit.errors import StoreError
    from tracekit.store import Store

    st = Store(path)
    if must_exist and not st.path.is_dir():
        raise StoreError(f"{st.path}: no store here (run `tracekit ingest` or `tracekit collect` first, or pass --store)")
    return st


def _print_rank_warnings(st, rid: str) -> None:
    """The run's per-rank warnings on stderr (quarantined events, clipped kernels, no events...)."""
    import pyarrow.parquet as pq

    from tracekit.report.textfmt import literal

    f = st.run_dir(rid) / "ranks.parquet"
    if not f.exists():
        return
    for row in pq.ParquetFile(f).read(columns=["rank", "warnings"]).to_pylist():  # read_table imports pandas
        for w in row["warnings"] or []:
            typer.echo(literal(f"tracekit: warning: rank {row['rank']}: {w}"), err=True)  # one line, as it is


def _print_ingest_summary(st, rid: str, store_opt: Optional[Path]) -> None:
    """The lines of tracekit.ingest.summary (ranks found / missing, groups, collectives per op,
    quarantined events, warnings, the command to analyze) under ``run X in STORE``."""
    import shlex

    from tracekit.ingest.summary import ingest_summary, summary_lines

    cmd = f"tracekit analyze --run {shlex.quote(rid)}" + ("" if store_opt is None else f" --store {shlex.quote(str(store_opt))}")
    for line in summary_lines(ingest_summary(st, rid), cmd):
        typer.echo(line)


def ingest(
    paths: List[Path] = typer.Argument(
        ..., help="Trace files or folders of rank files: Kineto .json/.json.gz, Nsight Systems .sqlite, nccl-tests logs, Flight Recorder dumps (pickle or JSON, one per rank)."
    ),
    store: Optional[Path] = StoreOpt,
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run (default: from the files)."),
    replace: bool = typer.Option(False, "--replace", help="Replace a run with the same id or the same files."),
    workload: Optional[str] = typer.Option(None, "--workload", help="Workload label (tp, ep, pp, disagg_kv, sweep, external)."),
    comm_pattern: List[str] = typer.Option([], "--comm-pattern", help="Extra communication kernels: REGEX (op unknown) or REGEX=OP, e.g. 'my_ar_kernel=all_reduce' (repeatable)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Rank files read in parallel (default: cores, at most 4); --engine ray without --address: the local Ray instance's CPUs."),
    engine: str = typer.Option("local", "--engine", metavar="ENGINE", help="Where the per-file work runs: local (a process pool) | ray (a Ray task per file; pip install 'tracekit\\[ray]')."),
    address: Optional[str] = typer.Option(None, "--address", metavar="ADDR", help="--engine ray: auto or HOST:PORT joins a running Ray cluster, whose workers must see the files and the store at the same paths (default: start a local Ray)."),
    align: Optional[str] = typer.Option(
        None, "--align", help="Clock alignment: none | host | collectives (default: collectives when hosts differ)."
    ),
    analyze: bool = typer.Option(False, "--analyze", help="Print the report after ingesting."),
    op: Optional[str] = typer.Option(
        None, "--op", help="nccl-tests logs: the collective, when neither the log nor its file name says it."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="nccl-tests logs: refuse the whole input when one log cannot be read (default: "
        "ingest the others, name the failures and exit 3)."),
) -> None:
    """Ingest traces (one run; one file per rank) into the Parquet store."""
    from tracekit.ingest import ingest_paths
    from tracekit.progress import terminal_progress

    from tracekit.errors import BadInputError

    if jobs is not None and jobs < 1:
        raise BadInputError(f"--jobs must be at least 1, got {jobs}")
    st = _store(store)
    before = set(st.run_ids()) if st.runs_dir.is_dir() else set()
    skipped: list[str] = []  # logs left out of a partial nccl-tests ingest (exit 3)
    with terminal_progress() as progress:
        rid = ingest_paths(
            [str(p) for p in paths], st, run_id=run_id, replace=replace, workload=workload,
            comm_patterns=comm_pattern, jobs=jobs, align=align, progress=progress, op=op,
            engine=engine, address=address, strict=strict, on_skip=skipped.append,
        )
    if rid in before and not replace:  # ingest_paths found the same files (sha256) in the store
        typer.echo(f"tracekit: these files are already ingested as {rid} (use --replace to ingest them again)", err=True)
    typer.echo(f"run {rid} in {st.path}")
    _print_ingest_summary(st, rid, store)
    _print_rank_warnings(st, rid)
    if analyze:
        from tracekit.report.data import print_run_report

        print_run_report(st, rid)
    if skipped:
        if rid in before and not replace:  # the stored run's warnings may predate these failures
            for line in skipped:
                typer.echo(f"tracekit: warning: skipped {line}", err=True)
        typer.echo(f"tracekit: partial ingest: {len(skipped)} log(s) could not be read and were left out "
                   "(exit 3; --strict refuses the whole input instead)", err=True)
        raise typer.Exit(3)


def analyze(
    run: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest run)."),
    store: Optional[Path] = StoreOpt,
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    link: Optional[str] = typer.Option(None, "--link", help="Also compare every collective with this link preset (nvlink4, ib_ndr, ...)."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report with plots to this file."),
    alpha: Optional[str] = typer.Option(None, "--alpha", help="Judge every collective with this α per step (e.g. 5us); needs --beta."),
    beta: Optional[str] = typer.Option(None, "--beta", help="... and this effective β per direction (e.g. 40GB/s)."),
    nics_per_node: Optional[int] = typer.Option(None, "--nics-per-node", help="NICs per node shared by its GPUs, for groups across hosts (default one per GPU)."),
    critical_path: Optional[bool] = typer.Option(
        None, "--critical-path/--no-critical-path",
        help="The cross-rank critical path per step and rank (default: on; computed at ingest)."),
    detail: bool = typer.Option(False, "--detail", help="Also print the long tables: per size, the fits, the references."),
    section: Optional[list[str]] = typer.Option(
        None, "--section", metavar="NAME",
        help="Print only this section of the report (repeatable; --section help lists the names)."),
) -> None:
    """The report for a run: at a glance, then collectives, overlap, stragglers, verdicts."""
    from tracekit.model import parse_bandwidth, parse_time
    from tracekit.report.data import SECTIONS, build_report, check_sections, print_report, report_connection, report_json

    if section and "help" in section:
        for name, what in SECTIONS.items():
            typer.echo(f"{name:14} {what}")
        return
    check_sections(section or [])  # an unknown name fails before any work
    st = _store(store)
    rid, con = report_connection(st, run, link)  # one connection: every analysis built once
    try:
        rep = build_report(st, rid, link, con=con,
                           alpha_s=None if alpha is None else parse_time(alpha),
                           beta_Bps=None if beta is None else parse_bandwidth(beta), nics_per_node=nics_per_node,
                           critical_path=critical_path,
                           strips=json_out or html_out is not None)  # the terminal draws no strips
        if html_out is not None:
            from tracekit.report.html import write_html_report

            typer.echo(f"wrote {write_html_report(st, html_out, link=link, report=rep, con=con)}", err=True)
    finally:
        con.close()
    if json_out:
        typer.echo(report_json(rep))
    else:
        print_report(rep, detail=detail, sections=section)


def runs(
    store: Optional[Path] = StoreOpt,
    json_out: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """List the runs in the store (full run ids, oldest first; created_at in UTC)."""
    import json

    st = _store(store, must_exist=True)
    con = st.connect()
    from tracekit.report.textfmt import literal

    for why in con.damaged_runs.values():  # a damaged run is left out, the others listed
        typer.echo(literal(f"tracekit: warning: {why}"), err=True)
    cur = con.execute(
        "SELECT r.run_id, r.created_at, r.workload, r.source, r.backend, r.world_size, "
        "count(k.rank) AS ranks, sum(k.events) AS events "
        "FROM runs r LEFT JOIN ranks k USING (run_id) GROUP BY ALL ORDER BY r.created_at"
    )
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    if json_out:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    from rich.table import Table

    from rich import box

    from tracekit.report.textfmt import literal_console

    t = Table(title=f"runs in {st.path}", box=box.SIMPLE_HEAD)
    cells = [["" if r[c] is None else (str(r[c])[:19] if c == "created_at" else str(r[c])) for c in cols] for r in rows]
    for i, c in enumerate(cols):  # a run id is typed back by the user: no cell is ever cut or folded
        t.add_column(c, no_wrap=True, min_width=max([len(c)] + [len(row[i]) for row in cells]))
    for row in cells:
        t.add_row(*row)
    need = sum(max([len(c)] + [len(row[i]) for row in cells]) + 3 for i, c in enumerate(cols)) + 1
    console = literal_console()  # labels are data: '[/wl]' is printed, not read as markup
    console.width = max(console.width, need)  # wider than the terminal: its lines wrap, nothing is cut
    console.print(t)


def sql(
    query: str = typer.Argument(..., help="SQL over the views: runs, ranks, events, collectives, collective_instances, ..."),
    store: Optional[Path] = StoreOpt,
    fmt: str = typer.Option("table", "--format", metavar="table|csv|json|parquet",
                            help="Output format (parquet needs --output)."),
    output: Optional[Path] = typer.Option(None, "--output", help="Write the result to this file instead of printing it."),
    json_out: bool = typer.Option(False, "--json", help="Same as --format json."),
    run: List[str] = typer.Option([], "--run", metavar="RUN_ID",
                                  help="Only this run: every table and view holds its rows alone (repeatable)."),
    timeout: float = typer.Option(300.0, "--timeout", metavar="SECONDS",
                                  help="Stop the query after this many seconds (0: no limit)."),
    max_rows: int = typer.Option(1_000_000, "--max-rows", metavar="N",
                                 help="Refuse a result of more than N rows (0: no limit); csv and parquet with "
                                      "--output stream to the file and are not capped."),
) -> None:
    """Run one read-only SQL statement (SELECT or EXPLAIN of one) against the store's tables and analysis
    views; nothing else is readable (tracekit/sqlshell.py)."""
    from tracekit.cli import sqlout
    from tracekit.errors import BadInputError
    from tracekit.sqlshell import run_query

    if json_out:
        fmt = "json"
    sqlout.check(fmt, output)
    st = _store(store, must_exist=True)
    for rid in run:
        if not st.has_run(rid):
            raise st.missing_run(rid)
    if timeout < 0 or max_rows < 0:
        raise BadInputError("--timeout and --max-rows take a number >= 0 (0: no limit)")
    if output is not None and fmt in sqlout.STREAMED:  # batch by batch to the file, none held in memory
        with sqlout.streamed(fmt, output) as (sink, counted):
            run_query(st, query, arrow=True, run_ids=sorted(set(run)) or None, timeout_s=timeout, sink=sink)
        typer.echo(f"wrote {counted():,} rows to {output}", err=True)
        return
    table = run_query(st, query, arrow=True, run_ids=sorted(set(run)) or None,  # confined: reads the store only
                      timeout_s=timeout, max_rows=max_rows)
    if table is None:
        return
    # formatting after the query: only --output writes, from Python (tracekit/cli/sqlout.py)
    if output is not None:
        typer.echo(f"wrote {table.num_rows} rows to {sqlout.write(table, fmt, output)}", err=True)
        return
    from tracekit.report.textfmt import piped_width_of

    width = max(120, os.get_terminal_size().columns) if sys.stdout.isatty() else piped_width_of(200)
    typer.echo(sqlout.render(table, fmt, width=width), nl=False)

