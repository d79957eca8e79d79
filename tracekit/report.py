"""The report for one run: plain data first (:func:`build_report`), then rendering.

``build_report`` returns a JSON-ready dict (times in ns unless a key says
otherwise, bandwidths in GB/s with GB = 1e9); ``print_report`` renders it with
rich tables; ``tracekit analyze --json`` prints the dict itself. No torch import
on this path.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tracekit.store import Store
from tracekit.textfmt import fmt_bytes, fmt_ms, fmt_num, fmt_pct, fmt_us

TOP_STRAGGLERS = 10


def _rows(con, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    out = []
    for rec in cur.fetchall():
        row = {}
        for c, v in zip(cols, rec):
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            row[c] = v
        out.append(row)
    return out


def report_connection(store: Store | str | None = None, run_id: str | None = None, link: str | None = None):
    """(run id, connection) for one run's report: ``run_id`` (default: the newest run) and the newest
    sweep run (whose α/β feed measured_vs_model), with the analyses (``tracekit.analyses.connect``).

    One connection serves the terminal report, ``--json`` and ``--html``: each analysis table is
    built once. The caller closes it. Raises StoreError when the store is empty or the run is
    unknown, BadInputError for an unknown ``link``.
    """
    from tracekit import analyses
    from tracekit.errors import StoreError

    st = store if isinstance(store, Store) else Store(store)
    if run_id is None:
        run_id = st.latest_run_id()
    elif not st.has_run(run_id):
        known = ", ".join(st.run_ids()[:8]) or "none"
        raise StoreError(f"run {run_id!r} is not in {st.path} (runs: {known})")
    sweep = st.latest_run_id("sweep", required=False)
    return run_id, analyses.connect(st, run_ids=[run_id] + ([sweep] if sweep and sweep != run_id else []), link=link)


def build_report(
    store: Store | str | None = None, run_id: str | None = None, link: str | None = None, con=None
) -> dict[str, Any]:
    """Everything ``tracekit analyze`` shows for ``run_id`` (default: the newest run).

    Keys: ``run`` (metadata), ``ranks`` (per-rank facts and warnings),
    ``collectives`` (per op: count, bytes, median sync time, busbw, total wait),
    ``unattributed`` (comm spans with no collective), ``instances`` (matching
    health), ``overlap_by_rank``, ``overlap_by_step``, ``stragglers`` (worst
    instances by skew) and ``straggler_ranks``, ``fit`` (α, β, n½ per op from
    alpha_beta_fit), ``verdicts`` (counts per op and verdict), ``furthest_from_model``
    (lowest efficiency), ``link`` (the preset compared with, or None),
    ``measured_vs_model`` (per rank: measured vs predicted exposed communication per
    step; α/β from --link, else the newest sweep run, else this run's fit), ``warnings``.
    ``con``: a connection from :func:`report_connection` for this ``run_id`` and ``link`` (kept
    open for the caller); without it the report opens and closes its own.
    Raises StoreError when the store is empty or the run is unknown.
    """
    if con is None:
        run_id, con = report_connection(store, run_id, link)
        try:
            return build_report(store, run_id, link, con=con)
        finally:
            con.close()
    p = [run_id]
    run = _rows(con, "SELECT * FROM runs WHERE run_id = ?", p)[0]
    try:
        run["config"] = json.loads(run.get("config") or "{}")
    except ValueError:
        pass
    run["created_at"] = str(run.get("created_at"))
    ranks = _rows(
        con,
        "SELECT rank, host, source_path, events, events_quarantined, clock_offset_ns, clock_offset_err_ns, warnings "
        "FROM ranks WHERE run_id = ? ORDER BY rank",
        p,
    )
    # per op over the run's instances: bandwidth, completeness and waits as three aggregates by
    # op, no join (at ×128 the joined statement outgrew the analysis budget)
    by_op = _rows(
        con,
        """
        SELECT op, count(*) AS count, sum(size_bytes) AS total_bytes,
               median(size_bytes) AS median_size_bytes, median(sync_time_ns) AS median_sync_time_ns,
               median(busbw_gbps) AS median_busbw_gbps, median(algbw_gbps) AS median_algbw_gbps
        FROM collective_bandwidth
        WHERE run_id = ?
        GROUP BY op ORDER BY count(*) DESC, op
        """,
        p,
    )
    waits = dict(con.execute("SELECT op, sum(wait_ns) FROM collective_waits WHERE run_id = ? GROUP BY op", p).fetchall())
    flags = {op: (inc, dis) for op, inc, dis in con.execute(
        "SELECT op, count(*) FILTER (WHERE NOT complete), count(*) FILTER (WHERE disagree) "
        "FROM collective_instances WHERE run_id = ? GROUP BY op", p).fetchall()}
    for r in by_op:
        r["total_wait_ns"] = waits.get(r["op"])
        r["incomplete"], r["disagreeing"] = flags[r["op"]]

    per_rank_calls = _rows(
        con,
        """
        SELECT rank, op, count(*) AS calls, sum(size_bytes) AS bytes, sum(wire_bytes) AS wire_bytes
        FROM collectives WHERE run_id = ? GROUP BY ALL ORDER BY rank, op
        """,
        p,
    )
    unattributed = _rows(
        con,
        "SELECT rank, count(*) AS spans, sum(dur_ns) AS dur_ns FROM collectives WHERE run_id = ? AND op IS NULL GROUP BY rank ORDER BY rank",
        p,
    )
    inst = _rows(
        con,
        """
        SELECT count(*) AS instances, count(*) FILTER (WHERE complete) AS complete,
               count(*) FILTER (WHERE NOT complete) AS incomplete, count(*) FILTER (WHERE disagree) AS disagreeing
        FROM collective_instances WHERE run_id = ?
        """,
        p,
    )[0]
    overlap_rank = _rows(con, "SELECT * EXCLUDE (run_id) FROM overlap_by_rank WHERE run_id = ? ORDER BY rank", p)
    overlap_step = _rows(con, "SELECT * EXCLUDE (run_id) FROM overlap_by_step WHERE run_id = ? ORDER BY step, rank", p)
    stragglers = _rows(
        con,
        f"""
        SELECT pg_name, seq, op, size_bytes, group_size, straggler, skew_ns, sync_time_ns
        FROM collective_instances WHERE run_id = ? AND ranks_seen > 1
        ORDER BY skew_ns DESC, pg_name, seq LIMIT {TOP_STRAGGLERS}
        """,
        p,
    )
    straggler_ranks = _rows(
        con,
        """
        SELECT straggler AS rank, count(*) AS times_last, sum(skew_ns) AS wait_caused_ns
        FROM collective_instances WHERE run_id = ? AND ranks_seen > 1
        GROUP BY straggler ORDER BY wait_caused_ns DESC
        """,
        p,
    )
    fit = _rows(
        con,
        "SELECT op, group_size, algo, source, n_samples, n_used, n_dropped, n_warmup, alpha_s, beta_gbps, "
        "n_half_bytes, residual_spread, residual_max_abs, min_size_bytes, max_size_bytes, status "
        "FROM alpha_beta_fit WHERE run_id = ? ORDER BY op, group_size",
        p,
    )
    # collective_verdicts calls the model (Python UDFs) for every instance: evaluate it once for both queries
    con.execute(
        "CREATE OR REPLACE TEMP TABLE __report_verdicts AS "
        "SELECT op, verdict, verdict_basis, efficiency, efficiency_link, pg_name, seq, size_bytes, group_size, "
        "sync_time_ns, skew_ns, fit_predicted_ns, link_predicted_ns, best_algo, best_predicted_ns "
        "FROM collective_verdicts WHERE run_id = ?",
        p,
    )
    verdicts = _rows(
        con,
        "SELECT op, verdict, verdict_basis, count(*) AS count, median(efficiency) AS median_efficiency, "
        "median(efficiency_link) AS median_efficiency_link "
        "FROM __report_verdicts GROUP BY ALL ORDER BY op, verdict",
    )
    furthest = _rows(
        con,
        f"""
        SELECT pg_name, seq, op, size_bytes, group_size, sync_time_ns, skew_ns, verdict, verdict_basis,
               coalesce(fit_predicted_ns, link_predicted_ns) AS predicted_ns,
               coalesce(efficiency, efficiency_link) AS efficiency, best_algo, best_predicted_ns
        FROM __report_verdicts
        WHERE coalesce(efficiency, efficiency_link) IS NOT NULL
        ORDER BY coalesce(efficiency, efficiency_link) ASC, pg_name, seq LIMIT {TOP_STRAGGLERS}
        """,
    )
    mvm = _rows(con, "SELECT * EXCLUDE (run_id) FROM measured_vs_model WHERE run_id = ? ORDER BY rank", p)
    warnings = []
    is_log = run.get("source") == "nccl_tests"
    if is_log:
        # one row per message size from rank 0's log: nothing to match, no timeline to overlap
        overlap_rank, overlap_step, stragglers, straggler_ranks = [], [], [], []
        inst = dict(inst, incomplete=0, complete=inst["instances"])
        for r in by_op:
            r["incomplete"] = 0
    for r in ranks:
        for w in r.get("warnings") or []:
            warnings.append(f"rank {r['rank']}: {w}")
    for o in overlap_rank:
        if o["overlap_ratio"] is None:
            warnings.append(f"rank {o['rank']}: no communication, overlap_ratio is null")
    if inst["incomplete"]:
        warnings.append(
            f"{inst['incomplete']} collective instance(s) incomplete: recorded by fewer ranks than their group size"
            + (" (only some ranks' traces were ingested)" if len(ranks) < (run.get("world_size") or 0) else "")
        )
    if inst["disagreeing"]:
        warnings.append(f"{inst['disagreeing']} collective instance(s) where ranks disagree on op or size")
    return dict(
        run=run,
        ranks=ranks,
        collectives=by_op,
        calls_by_rank=per_rank_calls,
        unattributed=unattributed,
        instances=inst,
        overlap_by_rank=overlap_rank,
        overlap_by_step=overlap_step,
        stragglers=stragglers,
        straggler_ranks=straggler_ranks,
        link=link,
        fit=fit,
        verdicts=verdicts,
        furthest_from_model=furthest,
        measured_vs_model=mvm,
        warnings=warnings,
    )


def report_json(report: dict) -> str:
    """The report as JSON text (NaN/inf never appear: they are null in the dict)."""
    return json.dumps(report, indent=2, default=str, allow_nan=False)


# -- rendering --------------------------------------------------------------------


def _table(title: str):
    """A report table: compact rules, no side borders; its title printed above it by :func:`_show`."""
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    t.tk_title = title
    return t


def _show(con, t) -> None:
    """Print a :func:`_table`: title and caption as text wrapping at spaces at any width, and the
    table with no cell cut (each column at least as wide as its longest word, so cells wrap only
    between words); at 100 columns every table of the report fits (tests/test_report_width.py)."""
    from rich.text import Text

    if getattr(t, "tk_title", None):
        con.print()
        con.print(Text(t.tk_title, style="bold"))
    widths = []
    for col in t.columns:
        cells = [str(col.header)] + [str(c) for c in col._cells]
        widths.append(max([len(w) for c in cells for w in c.split()] + [1]))
    if sum(widths) + 2 * len(widths) <= con.width:  # else rich folds the longest words rather than crop the table
        for col, w in zip(t.columns, widths):
            col.min_width = w
            cells = [str(c) for c in col._cells]
            if cells and not any(" " in c.strip() for c in cells) and max(map(len, cells)) >= len(str(col.header)):
                col.no_wrap = True  # single words at least as wide as the header: never squeezed
    caption, t.caption = t.caption, None
    con.print(t)
    if caption:
        con.print(Text(caption, style="dim"))


def print_report(report: dict, console=None) -> None:
    """Render a :func:`build_report` dict as rich tables (to stdout by default)."""
    from rich.console import Console

    import sys

    con = console or Console(width=None if sys.stdout.isatty() else 120)
    run = report["run"]
    con.print(
        f"[bold]run[/bold] {run['run_id']}  workload={run.get('workload')}  backend={run.get('backend')}  "
        f"world_size={run.get('world_size')}  device={run.get('device_name') or '—'}  ranks ingested={len(report['ranks'])}"
    )
    offs = [r for r in report["ranks"] if r.get("clock_offset_ns")]
    if offs:
        con.print("clock offsets applied: " + ", ".join(
            f"rank {r['rank']} {r['clock_offset_ns'] / 1e3:+,.1f} µs (± {r['clock_offset_err_ns'] / 1e3:,.1f})" for r in offs))
    t = _table("Collectives per op (matched instances; sync = after the last rank arrived)")
    for col in ("op", "count", "total bytes", "median size", "median sync µs", "median busbw GB/s", "total wait ms", "incomplete"):
        t.add_column(col, justify="right" if col != "op" else "left", no_wrap=(col == "op"))
    for r in report["collectives"]:
        t.add_row(
            r["op"], str(r["count"]), fmt_bytes(r["total_bytes"]), fmt_bytes(r["median_size_bytes"]),
            fmt_us(r["median_sync_time_ns"]), fmt_num(r["median_busbw_gbps"]), fmt_ms(r["total_wait_ns"]), str(r["incomplete"]),
        )
    if report["unattributed"]:
        n = sum(u["spans"] for u in report["unattributed"])
        t.caption = f"{n} unattributed comm span(s) (no collective metadata) are counted in overlap but not here"
    _show(con, t)
    if run.get("source") == "nccl_tests":
        con.print("[dim]nccl-tests log: one row per message size (the log's average time); no timeline to overlap[/dim]")
    t = _table("Overlap per rank (whole trace)")
    for col in ("rank", "comm ms", "compute ms", "overlap ms", "exposed comm ms", "overlap ratio"):
        t.add_column(col, justify="right")
    for r in report["overlap_by_rank"]:  # empty for nccl-tests runs
        t.add_row(str(r["rank"]), fmt_ms(r["comm_ns"]), fmt_ms(r["compute_ns"]), fmt_ms(r["overlap_ns"]),
                  fmt_ms(r["exposed_comm_ns"]), fmt_pct(r["overlap_ratio"]))
    if report["overlap_by_rank"]:
        _show(con, t)
    if report["stragglers"]:
        t = _table(f"Worst stragglers (top {TOP_STRAGGLERS} instances by skew)")
        for col in ("op", "pg", "seq", "size", "straggler rank", "skew µs", "sync µs"):
            t.add_column(col, justify="right" if col not in ("op", "pg") else "left")
        for r in report["stragglers"]:
            t.add_row(r["op"], str(r["pg_name"]), str(r["seq"]), fmt_bytes(r["size_bytes"]), str(r["straggler"]),
                      fmt_us(r["skew_ns"]), fmt_us(r["sync_time_ns"]))
        _show(con, t)
    if report.get("fit"):
        t = _table("α–β fit per op (this run's sync times; weighted by relative error)")
        for col in ("op", "k", "samples used", "α µs", "β GB/s", "n½", "residual spread", "status"):
            t.add_column(col, justify="left" if col in ("op", "status") else "right", no_wrap=(col == "op"))
        for r in report["fit"]:
            t.add_row(r["op"], str(r["group_size"]), f"{r['n_used']}/{r['n_samples']}",
                      fmt_num(None if r["alpha_s"] is None else r["alpha_s"] * 1e6), fmt_num(r["beta_gbps"]),
                      fmt_bytes(r["n_half_bytes"]), fmt_pct(r["residual_spread"]), r["status"])
        _show(con, t)
    if report.get("verdicts"):
        basis = f"fit, else {report['link']}" if report.get("link") else "fit (use --link PRESET to compare with a link)"
        t = _table(f"Verdicts (model basis: {basis})")
        for col in ("op", "verdict", "basis", "count", "median efficiency"):
            t.add_column(col, justify="right" if col in ("count", "median efficiency") else "left")
        for r in report["verdicts"]:
            eff = r["median_efficiency"] if r["median_efficiency"] is not None else r["median_efficiency_link"]
            t.add_row(r["op"], r["verdict"] or "no model", r["verdict_basis"] or "—", str(r["count"]), fmt_num(eff))
        _show(con, t)
    if report.get("furthest_from_model"):
        t = _table("Furthest from the model (lowest predicted/measured)")
        for col in ("op", "seq", "size", "sync µs", "predicted µs", "efficiency", "verdict", "best algo"):
            t.add_column(col, justify="left" if col in ("op", "verdict", "best algo") else "right")
        for r in report["furthest_from_model"]:
            t.add_row(r["op"], str(r["seq"]), fmt_bytes(r["size_bytes"]), fmt_us(r["sync_time_ns"]), fmt_us(r["predicted_ns"]),
                      fmt_num(r["efficiency"]), r["verdict"] or "—", r["best_algo"] or "—")
        _show(con, t)
    if report.get("measured_vs_model"):
        rows = report["measured_vs_model"]
        t = _table("Measured per step (means over the profiled steps)")
        for col in ("rank", "compute ms", "comm ms", "overlap ms", "exposed ms"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r["rank"]), fmt_ms(r["compute_ns"]), fmt_ms(r["comm_ns"]), fmt_ms(r["overlap_ns"]), fmt_ms(r["exposed_ns"]))
        _show(con, t)
        t = _table("Model per step (α–β prediction under the run's overlap model) against the measurement")
        for col in ("rank", "model", "predicted comm ms", "predicted exposed ms", "measured / predicted", "α/β from"):
            t.add_column(col, justify="left" if col in ("model", "α/β from") else "right")
        for r in rows:
            gap = "—" if r["gap_ratio"] is None else f"{r['gap_ratio']:.2f}× ({r['larger']} larger)"
            t.add_row(str(r["rank"]), r["model"], fmt_ms(r["predicted_comm_ns"]), fmt_ms(r["predicted_exposed_ns"]), gap,
                      r["ab_source"] or "—")
        notes = sorted({r["note"] for r in rows if r.get("note")})
        t.caption = "; ".join(notes)
        _show(con, t)
    for w in report["warnings"]:
        con.print(f"[yellow]warning:[/yellow] {w}")
