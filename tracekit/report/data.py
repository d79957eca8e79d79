"""The report for one run: plain data first (:func:`build_report`), then rendering.

``build_report`` returns a JSON-ready dict (times in ns unless a key says
otherwise, bandwidths in GB/s with GB = 1e9); ``print_report`` renders it with
rich tables; ``tracekit analyze --json`` prints the dict itself. No torch import
on this path.

The aggregates are documented views of :mod:`tracekit.analyses` (per op: ``collective_ops``; per
size bucket: ``collective_sizes``, ``collective_peaks``; stragglers: ``straggler_instances``,
``straggler_ranks``; verdicts and references: ``verdict_counts``, ``verdict_references``; degraded
links: ``group_plateau``; machines, the critical path, the Flight Recorder: ``machine_summary``,
``critical_path_events``, ``fr_collectives``...): this module selects from them and renders. The
verdicts call the model for every instance, so a run's ``verdict_rows`` are copied once into a
temporary table and passed by name to the same macros the views use.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tracekit.store import CRITICAL_PATH_TABLES, SUMMARY_TABLES, Store
from tracekit.report.textfmt import (PARAMS_DROPPED, fit_table, fmt_bytes, fmt_ms, fmt_num, fmt_pct, fmt_size, fmt_us,
                                     plain_table, terminal_kernel_name)

TOP_STRAGGLERS = 10

def _calibration_runs(st: Store) -> list[str]:
    """Runs that calibrate a machine (``collect sweep`` runs and nccl-tests logs), newest first."""
    con = st.connect(tables=("runs",))
    try:
        return [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE workload = 'sweep' OR source = 'nccl_tests' ORDER BY created_at DESC"
        ).fetchall()]
    finally:
        con.close()


_FLOAT_TYPES = ("DOUBLE", "FLOAT")
"""The result types whose values DuckDB's Python client gives as floats."""


def _rows(con, sql: str, params: list | None = None) -> list[dict]:
    """The result of ``sql`` as one dict per row, a float that is not finite (NaN, ±inf) as None."""
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    recs = cur.fetchall()
    if len(set(cols)) == len(cols):  # only the float columns can hold a float to clear
        fl = [(i, c) for i, (c, d) in enumerate(zip(cols, cur.description)) if str(d[1]) in _FLOAT_TYPES]
        out = [dict(zip(cols, rec)) for rec in recs]
        for row, rec in zip(out, recs):
            for i, c in fl:
                v = rec[i]
                if v is not None and not math.isfinite(v):
                    row[c] = None
        return out
    out = []
    for rec in recs:
        row = {}
        for c, v in zip(cols, rec):
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            row[c] = v
        out.append(row)
    return out


def apply_reference_options(con, alpha_s=None, beta_Bps=None, nics_per_node=None) -> None:
    """Set the user's α/β (seconds, bytes/s; both or neither) and NICs per node on an analysis
    connection and rebuild ``collective_reference`` (the verdicts' views read it lazily).
    Raises BadInputError for one of α/β alone, bad values, or a NIC count < 1."""
    from tracekit.errors import BadInputError

    if (alpha_s is None) != (beta_Bps is None):
        raise BadInputError("give both α and β (--alpha and --beta), or neither")
    if alpha_s is None and nics_per_node is None:
        return
    from tracekit.analyses.fit import create_reference
    from tracekit.model import custom_link

    if alpha_s is not None:
        custom_link(alpha_s, beta_Bps)  # validates: one-line BadInputError
        con.execute("SET VARIABLE tk_alpha = ?", [float(alpha_s)])
        con.execute("SET VARIABLE tk_beta = ?", [float(beta_Bps)])
    if nics_per_node is not None:
        if isinstance(nics_per_node, bool) or not isinstance(nics_per_node, int) or nics_per_node < 1:
            raise BadInputError(f"bad --nics-per-node {nics_per_node!r}: expected an integer >= 1")
        con.execute("SET VARIABLE tk_nics_per_node = ?", [int(nics_per_node)])
    create_reference(con)


def report_connection(store: Store | str | None = None, run_id: str | None = None, link: str | None = None):
    """(run id, connection) for one run's report: ``run_id`` (default: the newest run) and every
    calibration run of the store (sweeps, nccl-tests logs: the verdicts' reference may be one), with
    the analyses (``tracekit.analyses.connect``).

    One connection serves the terminal report, ``--json`` and ``--html``: each analysis table is
    built once. The caller closes it. Raises StoreError when the store is empty or the run is
    unknown, BadInputError for an unknown ``link``.
    """
    from tracekit import analyses

    st = store if isinstance(store, Store) else Store(store)
    run_id = st.resolve_run(run_id)
    calib = [r for r in _calibration_runs(st) if r != run_id]
    return run_id, analyses.connect(st, run_ids=[run_id] + calib, link=link)


def build_report(
    store: Store | str | None = None, run_id: str | None = None, link: str | None = None,
    alpha_s: float | None = None, beta_Bps: float | None = None, nics_per_node: int | None = None, con=None,
    critical_path: bool | None = None, strips: bool = True,
) -> dict[str, Any]:
    """Everything ``tracekit analyze`` shows for ``run_id`` (default: the newest run).

    ``critical_path``: build the critical path (True, or None: the default;
    tracekit.analyses.critical_path) or leave it out (False). ``strips``: False leaves
    ``critical_path.paths`` (the HTML page's strips, in ``--json`` too) None, not computed, for a
    report printed only to the terminal, which does not draw them (:func:`print_run_report`); the
    HTML page refuses such a report (ValueError).

    Keys: ``run`` (metadata), ``ranks`` (per-rank facts and warnings; ``gpu_events`` 0 for a
    CPU-only rank, ``same_stream_overlaps``), ``cpu_side`` (:func:`cpu_side_section`),
    ``collectives`` (per op: count, bytes, size range and buckets, peak busbw and the size it was
    reached at (``peak_lower_bound``: it is an incomplete instance's, a lower bound), total wait (None
    when no wait can be measured), ``over_cap`` (instances whose busbw exceeds ``cap_gbps``, the
    device's fastest link), ``k_world`` (instances whose k is the world size); mismatched instances
    left out of every count; nothing is a median across sizes), ``mismatched``
    (:func:`mismatched_section`), ``null_reasons`` (section.column → why its nulls are null, once per
    section), ``by_size`` (per op, group size,
    locality class (instance_locality), benchmark run of a nccl-tests log (``bench_run``, else None) and power-of-two size bucket
    (``bucket_bytes``, tracekit.model.size_bucket): count, medians within the bucket of sync time,
    algbw, busbw, the reference's predicted time and efficiency, peak busbw, the most frequent
    verdict, ``references`` (how many references judged the bucket's groups: its model time and
    efficiency are medians over them when > 1), and the efficiency against the link with the bucket's regime), ``peak_busbw`` (per op,
    group size and benchmark run: the largest busbw and the size it was reached at),
    ``unattributed`` (comm spans with no collective), ``instances`` (matching
    health), ``overlap_by_rank``, ``overlap_by_step``, ``stragglers`` (worst
    instances by skew) and ``straggler_ranks`` (per rank: times it arrived last, ``wait_caused_ns``
    = the waiting it imposed on the others, Σ over those instances of the other ranks' waits, and
    ``skew_sum_ns`` = Σ of those instances' largest wait), ``fit`` (alpha_beta_fit's rows: per
    process group or benchmark run, named by its description and dimension from process_groups,
    and per locality class: α, β, n½, D*, status), ``verdicts`` (counts per op, locality class and
    verdict), ``furthest_from_model``
    (lowest efficiency), ``link`` (the preset compared with, or None),
    ``measured_vs_model`` (per rank: measured vs predicted exposed communication per
    step; α/β per call from its group's verdict reference, collective_reference),
    ``measured_vs_model_by_dimension`` (per rank and dimension tp/pp/dp/ep, each under its own
    overlap model; empty for a run without per-dimension models) and ``model_by_dimension`` (those
    rows summed per dimension, :func:`model_by_dimension`), ``warnings``;
    ``references`` (per op, group size, locality class and reference — each fit its own row, ``groups``
    the process groups judged by it: what the verdicts were judged against,
    with α, β, the collective's crossover size D* and fixed latency, or the reason for "no
    model"; ``nccl_algos``: the NCCL algorithm/protocol pairs a preset reference assumed, when it
    is NCCL's model) and ``degraded_links`` (the buckets that raised the degraded-link warning).
    ``alpha_s`` and ``beta_Bps`` (both, seconds and bytes/s) are the user's own α/β, used as the
    reference for every verdict; ``nics_per_node`` shares a node's NICs among its GPUs for groups
    across hosts (collective_reference).
    Raises StoreError when the store is empty or the run is unknown, or when a run of the
    connection was stored without a summary table the report reads or holds one damaged
    (``AnalysisConnection.require_stored``, before any analysis is built); BadInputError for a bad
    α/β or NIC count.
    ``con``: a connection from :func:`report_connection` for this ``run_id`` and ``link`` (kept
    open for the caller); without it the report opens and closes its own.
    """
    options = dict(alpha_s=alpha_s, beta_Bps=beta_Bps, nics_per_node=nics_per_node)
    if con is None:
        run_id, con = report_connection(store, run_id, link)
        try:
            return build_report(store, run_id, link, con=con, critical_path=critical_path, strips=strips,
                                **options)
        finally:
            con.close()
    st = store if isinstance(store, Store) else Store(store)
    apply_reference_options(con, **options)
    from tracekit.analyses.critical_path import critical_path_wanted

    # every stored summary the report reads, checked before any analysis is built: a run stored
    # without one (or holding one damaged) is refused at once, not after most of the report
    with_path = critical_path_wanted(critical_path)[0]
    con.require_stored([t for t in SUMMARY_TABLES if with_path or t not in CRITICAL_PATH_TABLES])
    p = [run_id]
    run = _rows(con, "SELECT * FROM runs WHERE run_id = ?", p)[0]
    try:
        run["config"] = json.loads(run.get("config") or "{}")
    except ValueError:
        pass
    run["created_at"] = str(run.get("created_at"))
    ranks = _rows(
        con,
        "SELECT rank, host, source_path, events, events_quarantined, clock_offset_ns, clock_offset_err_ns, warnings, "
        "gpu_events, same_stream_overlaps FROM ranks WHERE run_id = ? ORDER BY rank",
        p,
    )
    # per op over the run's instances (no statistic across sizes), per rank, and the matching's
    # health: analyses/collective_ops.sql
    by_op = _rows(con, "SELECT * EXCLUDE (run_id) FROM collective_ops WHERE run_id = ? ORDER BY count DESC, op", p)
    per_rank_calls = _rows(con, "SELECT * EXCLUDE (run_id) FROM calls_by_rank WHERE run_id = ? ORDER BY rank, op", p)
    unattributed = _rows(con, "SELECT * EXCLUDE (run_id) FROM unattributed_comm WHERE run_id = ? ORDER BY rank", p)
    inst = _rows(con, "SELECT * EXCLUDE (run_id) FROM instance_health WHERE run_id = ?", p)[0]
    overlap_rank = _rows(con, "SELECT * EXCLUDE (run_id) FROM overlap_by_rank WHERE run_id = ? ORDER BY rank", p)
    overlap_step = _rows(con, "SELECT * EXCLUDE (run_id) FROM overlap_by_step WHERE run_id = ? ORDER BY step, rank", p)
    # the worst instances by skew and who arrived last (analyses/stragglers.sql)
    stragglers = _rows(con, "SELECT * EXCLUDE (run_id, win) FROM straggler_instances WHERE run_id = ? "
                            f"ORDER BY skew_ns DESC, pg_name, seq, win LIMIT {TOP_STRAGGLERS}", p)
    straggler_ranks = _rows(con, "SELECT * EXCLUDE (run_id) FROM straggler_ranks WHERE run_id = ? "
                                 "ORDER BY wait_caused_ns DESC, rank", p)
    fit = _rows(
        con,
        "SELECT f.scope, f.pg_name, f.locality, f.groups, f.op, f.group_size, f.algo, "
        "f.source, f.n_samples, f.n_used, f.n_dropped, f.n_warmup, f.n_sizes, f.alpha_s, f.alpha_se_s, "
        "f.alpha_lo_s, f.alpha_hi_s, f.fixed_latency_s, f.beta_gbps, f.beta_se_Bps / 1e9 AS beta_se_gbps, "
        "f.beta_lo_Bps / 1e9 AS beta_lo_gbps, f.beta_hi_Bps / 1e9 AS beta_hi_gbps, f.n_half_bytes, f.crossover_bytes, "
        "f.residual_spread, f.size_spread, f.residual_max_abs, f.min_size_bytes, f.max_size_bytes, f.status, "
        "f.status_reason, f.split, f.alpha_range_min_bytes, f.alpha_range_max_bytes, f.beta_range_min_bytes, "
        "f.beta_range_max_bytes FROM alpha_beta_fit f "
        "WHERE f.run_id = ? ORDER BY f.op, f.group_size, f.scope, f.locality, f.pg_name",
        p,
    )
    # collective_verdicts calls the model (Python UDFs) for every instance: its rows (verdict_rows,
    # analyses/collective_sizes.sql) evaluated once, then passed by name to the analyses' macros
    con.execute("CREATE OR REPLACE TEMP TABLE __report_verdicts AS SELECT * FROM verdict_rows "
                "WHERE run_id = ?", p)
    # verdicts per op and class, and the references judged against (analyses/verdict_summary.sql)
    verdicts = _rows(con, "SELECT * EXCLUDE (run_id) FROM verdict_statistics('__report_verdicts') "
                          "ORDER BY op, locality, verdict, reference, verdict_basis")
    references = _rows(con, "SELECT * EXCLUDE (run_id) FROM reference_statistics('__report_verdicts') "
                            "ORDER BY op, group_size, locality, reference, note, kind, alpha_s, beta_gbps")
    own_fit = sum(r["instances"] for r in references if r["kind"] == "own_fit")
    # per op, k, locality class, benchmark run of a nccl-tests log and size bucket: the
    # nccl-tests-style table, and the peak busbw per op and k (analyses/collective_sizes.sql)
    is_log = run.get("source") == "nccl_tests"
    by_size = _rows(con, "SELECT * EXCLUDE (run_id) FROM size_statistics('__report_verdicts') "
                         "ORDER BY op, group_size, locality, bench_run, bucket_bytes")
    peak_busbw = _rows(con, "SELECT * EXCLUDE (run_id) FROM peak_statistics('__report_verdicts') ORDER BY ALL")
    # degraded links: each group's large-message plateau against its peers and the machine model
    # (analyses/fleet.py, group_plateau)
    degraded = _rows(con, "SELECT * EXCLUDE (run_id) FROM group_plateau WHERE run_id = ? AND degraded "
                          "ORDER BY op, group_size, pg_name", p)
    furthest = _rows(
        con,
        f"""
        SELECT pg_name, seq, op, size_bytes, group_size, sync_time_ns, skew_ns, verdict, verdict_basis, reference,
               predicted_ns, efficiency, efficiency_link, crossover_bytes, best_algo, best_predicted_ns
        FROM __report_verdicts
        WHERE efficiency IS NOT NULL
        ORDER BY efficiency ASC, pg_name, seq LIMIT {TOP_STRAGGLERS}
        """,
    )
    mvm = _rows(con, "SELECT * EXCLUDE (run_id) FROM measured_vs_model WHERE run_id = ? ORDER BY rank", p)
    mvm_dim = _rows(con, "SELECT * EXCLUDE (run_id) FROM measured_vs_model_by_dimension WHERE run_id = ? "
                         "ORDER BY dimension, rank", p)
    process_groups = _rows(
        con, "SELECT * EXCLUDE (run_id) FROM process_groups WHERE run_id = ? ORDER BY dimension, pg_name", p)
    named = {g["pg_name"]: g for g in process_groups}
    for g in process_groups:
        g["by_size"] = []
    for r in _rows(con, "SELECT * EXCLUDE (run_id) FROM process_group_sizes WHERE run_id = ? "
                        "ORDER BY pg_name, op, bucket_bytes", p):  # statistics per op and size bucket
        if r["pg_name"] in named:
            named[r["pg_name"]]["by_size"].append({k: v for k, v in r.items() if k != "pg_name"})
    for f in fit:  # the fitted group's description and dimension (process_groups), None for a class
        g = named.get(f["pg_name"]) or {}
        f["description"], f["dimension"] = g.get("description"), g.get("dimension")
    warnings = []
    if is_log:
        # one row per message size from rank 0's log: nothing to match, no timeline to overlap
        overlap_rank, overlap_step = [], []
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
    for r in by_op:
        if r.get("over_cap"):
            warnings.append(
                f"{r['op']}: {r['over_cap']} instance(s) with a busbw that would exceed the device's physical cap "
                f"({fmt_num(r['cap_gbps'])} GB/s per direction, its fastest link): a wrong group size or size, "
                "clocks that disagree, or an in-switch reduction — marked ! in the tables")
    k_world = sum(r.get("k_world") or 0 for r in by_op)
    if k_world:
        warnings.append(f"{k_world} instance(s) whose group size is the world size (k_source 'world': no metadata, "
                        "tensor shapes or group membership in the trace names their group): their busbw assumes it")
    null_reasons = {}  # section → why its nulls are null (once per section; the terminal shows "—")
    if any(r["total_wait_ns"] is None for r in by_op):
        null_reasons["collectives.total_wait_ns"] = (
            "a nccl-tests log holds per-size averages, no rank's arrival" if is_log else
            "fewer than two ranks of the group recorded its calls: no wait can be measured")
    if inst.get("instances") and not stragglers and not is_log:
        null_reasons["stragglers"] = "no instance recorded by two or more ranks of its group: no skew, no straggler"
    if any(m.get("wait_ns") is None and m.get("gap_ns") is not None for m in mvm):
        null_reasons["measured_vs_model.gap_skew_ns"] = (
            "the rank's calls were recorded by fewer than two ranks of their group: the skew and transfer "
            "parts of the gap cannot be told apart")
    if any(r.get("group_size") is None for r in by_size):
        null_reasons["by_size.group_size"] = "no metadata, tensor shapes, group membership or world size names the group"
    mismatched = mismatched_section(con, run_id)
    if mismatched:
        warnings.append(mismatched_line(mismatched))
    warnings.extend(degraded_warnings(degraded))
    if own_fit:
        warnings.append(
            f"{own_fit} instance(s) judged with their own process group's ok α–β fit: their efficiency is ≈ 1 by "
            "construction and cannot show a slow link; 'vs link' (or --link) compares them with the hardware"
        )
    for rk, pg, kind, n in con.execute(  # a rank's repeated (pg, seq) rows (analyses/instance_rows.sql)
            "SELECT rank, pg_name, kind, n FROM collective_duplicates WHERE run_id = ? ORDER BY ALL", p).fetchall():
        warnings.append(f"rank {rk}: " + {
            "copy": f"{n} collective span(s) of group {pg} recorded twice (same seq and start): counted once",
            "window": f"seq of group {pg} restarts {n} time(s) (profiler windows in one file): matched per window",
            "conflict": f"{n} seq(s) of group {pg} recorded as different spans: flagged disagree, no sync time",
        }[kind])
    report = dict(
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
        references=references,
        reference_options={k: v for k, v in options.items() if v is not None},
        by_size=by_size,
        peak_busbw=peak_busbw,
        degraded_links=degraded,
        furthest_from_model=furthest,
        measured_vs_model=mvm,
        measured_vs_model_by_dimension=mvm_dim,
        model_by_dimension=model_by_dimension(mvm_dim),
        process_groups=process_groups,
        by_dimension=by_dimension(process_groups),
        warnings=warnings,
        cpu_side=cpu_side_section(con, run_id, ranks),
        gpu_time_breakdown=gpu_breakdown_section(con, run_id),
        **kernel_sections(con, run_id),
        alltoall_imbalance=alltoall_section(con, run_id),
        bandwidth_by_locality=_rows(con, "SELECT * EXCLUDE (run_id) FROM bandwidth_by_locality WHERE run_id = ? "
                                         "ORDER BY op, locality, bucket_bytes", [run_id]),
        pipeline_bubbles=_rows(con, "SELECT * EXCLUDE (run_id) FROM pipeline_bubbles WHERE run_id = ? "
                                    "ORDER BY step, rank", [run_id]),
        critical_path=critical_path_section(con, run_id, critical_path, strips=strips),
        mismatched=mismatched,
        null_reasons=null_reasons,
        machine=machine_section(con, run_id),
        fleet=fleet_section(con, run_id),
        hang=hang_section(con, run_id),
        remedies=_remedies(con, run, fit, references),
    )
    from tracekit.report.glance import glance_summary

    return {"summary": glance_summary(con, report), **report}  # "At a glance" first (tracekit/report/glance.py)


def _remedies(con, run: dict, fit: list[dict], references: list[dict]) -> list[dict]:
    """tracekit.report.remedies.reference_remedies: each weak reference with the command that fixes it."""
    from tracekit.report.remedies import reference_remedies

    return reference_remedies(con, run, fit, references)


def by_dimension(groups: list[dict]) -> list[dict]:
    """The process_groups rows summed per dimension (tp, pp, dp, ep, cp, other): groups, calls,
    instances, incomplete, bytes, sync_time_ns, comm_ns, overlap_ns, overlap_fraction
    (overlap / comm; None without communication)."""
    out: dict[str, dict] = {}
    for g in groups:
        d = out.setdefault(g["dimension"], {"dimension": g["dimension"], "groups": 0, "calls": 0, "instances": 0,
                                            "incomplete": 0, "bytes": 0, "sync_time_ns": 0.0, "comm_ns": 0,
                                            "overlap_ns": 0})
        d["groups"] += 1
        for k in ("calls", "instances", "incomplete", "bytes", "sync_time_ns", "comm_ns", "overlap_ns"):
            d[k] += g[k] or 0
        d["_sync_known"] = d.get("_sync_known", False) or g["sync_time_ns"] is not None
    for d in out.values():
        if not d.pop("_sync_known"):
            d["sync_time_ns"] = None  # no group of the dimension has a sync time (one rank each, a log): unknown
        d["overlap_fraction"] = d["overlap_ns"] / d["comm_ns"] if d["comm_ns"] else None
    return sorted(out.values(), key=lambda d: (d["dimension"] == "other", d["dimension"]))


def model_by_dimension(rows: list[dict]) -> list[dict]:
    """measured_vs_model_by_dimension summed per dimension: dimension, model, ranks, and means over
    its ranks of calls, comm_ns, exposed_ns, predicted_exposed_ns (ns per step; None when some rank
    has no prediction), max_exposed_ns (the rank exposing most), ratio (measured / predicted
    exposed, None when predicted is 0 or missing), note."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["dimension"], []).append(r)
    out = []
    for dim, rs in sorted(by.items()):
        n = len(rs)
        pred = None if any(r["predicted_exposed_ns"] is None for r in rs) else sum(r["predicted_exposed_ns"] for r in rs) / n
        exposed = sum(r["exposed_ns"] for r in rs) / n
        out.append(dict(dimension=dim, model=rs[0]["model"], ranks=n, calls=sum(r["calls"] for r in rs) / n,
                        comm_ns=sum(r["comm_ns"] for r in rs) / n, exposed_ns=exposed,
                        max_exposed_ns=max(r["exposed_ns"] for r in rs), predicted_exposed_ns=pred,
                        ratio=exposed / pred if pred else None,
                        note="; ".join(sorted({r["note"] for r in rs if r.get("note")}))))
    return out


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


def _show(console, t) -> None:
    """Print a :func:`_table`: title and caption as text wrapping at spaces at any width, and the
    table fitted to the console (:func:`tracekit.report.textfmt.fit_table`): cells wrap between
    words, a long kernel name folds, nothing is cut (tests/report/test_report_layout_piped.py)."""
    from rich.text import Text

    if getattr(t, "tk_title", None):
        console.print()
        console.print(Text(t.tk_title, style="bold"))
    fit_table(t, console.width)
    caption, t.caption = t.caption, None
    console.print(plain_table(t, console) or t)  # rich lays out only what the shortcut cannot
    if caption:
        console.print(Text(caption, style="dim"))


LOCALITY_SHORT = {"intra_node": "intra", "inter_node": "inter", "mixed": "mixed", "unknown": "unknown"}
"""instance_locality's classes as the terminal tables print them."""


def size_label(bucket_bytes) -> str:
    """A size bucket's lower bound as the tables print it: binary prefixes (the buckets are powers
    of two, 1048576 → '1 MiB'); None → '—'."""
    from tracekit.model.bandwidth import _binary

    return "—" if bucket_bytes is None else _binary(int(bucket_bytes))


def fit_group_label(r: dict) -> str:
    """What an alpha_beta_fit row (as report['fit']) fitted, in words: the group's description or
    dimension with its name (``tp (pg 3)``), the benchmark run of a log, or ``all intra`` for a
    locality class's pooled groups."""
    if r.get("scope") == "locality":
        return f"all {LOCALITY_SHORT.get(r['locality'], r['locality'])} ({r['groups']})"
    if r.get("source") == "nccl_tests":
        return bench_label(r.get("pg_name"))
    name = str(r.get("pg_name"))
    label = r.get("description") or (r.get("dimension") if r.get("dimension") not in (None, "other") else None)
    return f"{label} ({name})" if label and label != name else name


def bench_label(pg_name) -> str:
    """A nccl-tests benchmark run's group name as the tables print it: ``nccl_tests:all_reduce:run1``
    → ``run1`` (the op is in its own column)."""
    return str(pg_name).rsplit(":", 1)[-1]


def print_by_size(report: dict, console) -> None:
    """``report['by_size']`` as ONE nccl-tests-style table per op, group size, locality class (and
    benchmark run of a log) and size bucket: count, time, algbw, busbw, peak, the reference's model
    time and efficiency, the efficiency against the link (``vs link``) and the verdict. Sizes are
    the buckets' lower bounds in binary units (:func:`size_label`)."""
    rows = report.get("by_size") or []
    if not rows:
        return
    # a benchmark run column only when some run's name says more than its op (one log per op: it would repeat it)
    runs = any(r["bench_run"] and bench_label(r["bench_run"]) != r["op"] for r in rows)
    classes = True  # locality is a column of the one table (bandwidth_by_locality's rows are in --json)
    links = sorted({r["link"] for r in rows if r.get("link")})

    def mixed(r):
        return "†" if (r.get("references") or 0) > 1 else ""

    t = _table("Collectives per op, class and size (power-of-two buckets as nccl-tests steps sizes; medians within "
               "a bucket)")
    for col in ("op", "k") + (("class",) if classes else ()) + (("run",) if runs else ()) + (
            "size ≥", "count", "sync µs", "algbw", "busbw", "peak", "model µs", "eff") + (
            ("vs link",) if links else ()) + ("bound",):
        t.add_column(col, justify="left" if col in ("op", "class", "run", "bound") else "right", no_wrap=(col == "op"))
    for r in rows:
        bound = (r["verdict"] or "—").replace("-bound", "") + ("*" if (r["verdicts"] or 0) > 1 else "")
        t.add_row(r["op"], _k(r["group_size"]), *((LOCALITY_SHORT.get(r["locality"], "?"),) if classes else ()),
                  *((bench_label(r["bench_run"]),) if runs else ()),
                  size_label(r["bucket_bytes"]), str(r["count"]), fmt_us(r["median_sync_time_ns"]),
                  fmt_num(r["median_algbw_gbps"]), fmt_num(r["median_busbw_gbps"]),
                  ("!" if _over_cap(r) else "") + fmt_num(r["peak_busbw_gbps"]),
                  fmt_us(r["median_predicted_ns"]) + mixed(r), fmt_num(r["median_efficiency"]) + mixed(r),
                  *((fmt_num(r["median_efficiency_link"]),) if links else ()), bound)
    t.caption = ("algbw, busbw GB/s (nccl-tests rules); model, eff: the verdicts' reference (predicted / measured; "
                 "† = medians over groups judged against different references: see the references below); "
                 + (f"vs link: predicted / measured against {', '.join(links)}; " if links else "")
                 + "bound: the most frequent verdict (* = the bucket holds several), by the reference's D* at that "
                 "size; under NCCL's model the protocol it picks per size sets α, so a switch (LL → LL128) raises "
                 "the fixed latency and D* and a larger size can read latency after a smaller read bandwidth"
                 + ("; eff > 1: faster than the reference predicts (a pessimistic reference for that op and size, "
                    "e.g. a preset's α)" if any((r["median_efficiency"] or 0) > 1 for r in rows) else "")
                 + ("; ! = above the device's physical cap (see the warnings)" if any(_over_cap(r) for r in rows)
                    else ""))
    _show(console, t)


def print_peak_busbw(report: dict, console) -> None:
    """For a sweep or nccl-tests log, the peak busbw per op (and benchmark run) and the exact size it
    was reached at, in binary units as the size buckets are."""
    runs = any(r["bench_run"] and bench_label(r["bench_run"]) != r["op"] for r in report.get("peak_busbw") or [])
    workload, source = report["run"].get("workload"), report["run"].get("source")
    if (workload == "sweep" or source == "nccl_tests") and report.get("peak_busbw"):
        t = _table("Peak busbw per op" + (" and benchmark run" if runs else ""))
        for col in ("op", "k") + (("run",) if runs else ()) + ("peak busbw GB/s", "at size", "sizes"):
            t.add_column(col, justify="left" if col in ("op", "run") else "right")
        for r in report["peak_busbw"]:
            t.add_row(r["op"], _k(r["group_size"]), *((bench_label(r["bench_run"]),) if runs else ()),
                      fmt_num(r["peak_busbw_gbps"]), fmt_size(r["at_size_bytes"]), str(r["size_buckets"]))
        _show(console, t)


SECTIONS: dict[str, str] = {
    # the terminal report's sections, in print order (`tracekit analyze --section NAME`)
    "glance": "At a glance: step, exposed communication, worst collectives, what to do, what was not judged",
    "collectives": "collectives per op (count, bytes, peak busbw, wait)",
    "sizes": "ONE table per op, group size, class and size bucket: time, algbw, busbw, model, efficiency, "
             "efficiency against the link, verdict (only with --detail)",
    "peak": "peak busbw per op (sweeps and nccl-tests logs)",
    "overlap": "overlap per rank",
    "stragglers": "worst stragglers and stragglers by rank",
    "fit": "the α–β fits per op and group and their quality (only with --detail)",
    "references": "what each op was judged against, and the references' α, β, D* (only with --detail)",
    "remedies": "weak references and the command that fixes each",
    "verdicts": "verdicts per op and class",
    "furthest": "the instances furthest from the model",
    "model": "measured vs model per step, the gap decomposed, per dimension",
    "groups": "process groups by dimension",
    "gpu": "GPU time breakdown and idle time",
    "kernels": "top GPU ops and their launchers",
    "alltoall": "all-to-all imbalance",
    "fleet": "fleet view of node pairs",
    "bubbles": "pipeline bubbles",
    "critical-path": "critical path per step and rank",
    "hang": "Flight Recorder triage",
    "warnings": "warnings",
}
DETAIL_ONLY = ("sizes", "fit", "references")
"""Sections the terminal shows only with --detail or --section (the JSON keeps everything)."""


def check_sections(names) -> list[str]:
    """The ``--section`` names, checked against :data:`SECTIONS`. Raises BadInputError naming the
    unknown one and listing the names."""
    from tracekit.errors import BadInputError

    for n in names:
        if n not in SECTIONS:
            raise BadInputError(f"unknown --section {n!r}: expected one of {', '.join(SECTIONS)} "
                                "(--section help describes them)")
    return list(names)


def print_report(report: dict, console=None, detail: bool = False, sections=None) -> None:
    """Render a :func:`build_report` dict as rich tables (to stdout by default): the run's line,
    then "At a glance", then the sections of :data:`SECTIONS`. The :data:`DETAIL_ONLY` ones only
    with ``detail`` (else one line says how to see them); ``sections`` (names) prints only those."""
    from tracekit.report.textfmt import literal, output_console

    console = console or output_console(120)
    run = report["run"]
    from rich.text import Text

    # a benchmark log is one file measuring all its ranks together: "ranks ingested=1" would read as 1 of N
    ranks = ("ranks: a benchmark log (per-size averages over all ranks, no per-rank trace)"
             if run.get("source") == "nccl_tests" else f"ranks ingested={len(report['ranks'])}")
    only = set(check_sections(sections)) if sections else None

    def want(name: str) -> bool:
        return name in only if only is not None else (detail or name not in DETAIL_ONLY)

    console.print(Text.assemble(("run", "bold"), literal(
        f" {run['run_id']}  workload={run.get('workload')}  backend={run.get('backend')}  "
        f"world_size={run.get('world_size')}  device={run.get('device_name') or '—'}  {ranks}"
    )))
    print_machine(report, console)
    if want("glance"):
        from tracekit.report.glance import print_glance

        print_glance(report, console)
    if only is None and not detail:
        hidden = [f"sizes ({len(report.get('by_size') or [])} row(s))" if n == "sizes" else n for n in DETAIL_ONLY
                  if n != "sizes" or report.get("by_size")]
        console.print(Text("not shown: " + ", ".join(hidden) + " — tracekit analyze --detail (all) or --section NAME "
                           "(--section help lists them); --json and --html hold everything", style="dim"))
    print_cpu_side(report, console)
    offs = [r for r in report["ranks"] if r.get("clock_offset_ns")]
    if offs and want("collectives"):
        console.print("clock offsets applied: " + ", ".join(
            f"rank {r['rank']} {r['clock_offset_ns'] / 1e3:+,.1f} µs (± {r['clock_offset_err_ns'] / 1e3:,.1f})" for r in offs))
    t = _table("Collectives per op (matched instances; per size: --section sizes)")
    for col in ("op", "count", "total bytes", "size buckets", "peak busbw GB/s", "at size", "total wait ms",
                "incomplete"):
        t.add_column(col, justify="right" if col != "op" else "left", no_wrap=(col == "op"))
    notes = []
    for r in report["collectives"]:
        t.add_row(
            r["op"], str(r["count"]), fmt_size(r["total_bytes"]), str(r["size_buckets"]),
            ("!" if _over_cap(r) else "") + ("≥" if r.get("peak_lower_bound") else "") + fmt_num(r["peak_busbw_gbps"]),
            fmt_size(r["peak_busbw_size_bytes"]),
            fmt_ms(r["total_wait_ns"]), str(r["incomplete"]),
        )
    if any(r.get("peak_lower_bound") for r in report["collectives"]):
        notes.append("≥ = the peak of an incomplete instance: its sync time holds the wait for ranks not recorded, "
                     "so the busbw is a lower bound")
    if any(_over_cap(r) for r in report["collectives"]):
        notes.append("! = above the device's physical cap (see the warnings): not a rate the hardware carries")
    if any(r["total_wait_ns"] is None for r in report["collectives"]):
        notes.append("total wait — : a nccl-tests log holds per-size averages, no rank's arrival"
                     if run.get("source") == "nccl_tests" else
                     "total wait — : fewer than two ranks of the group recorded its calls, no wait can be measured")
    if report["unattributed"]:
        n = sum(u["spans"] for u in report["unattributed"])
        notes.append(f"{n} unattributed comm span(s) (no collective metadata) are counted in overlap but not here")
    if notes:
        t.caption = "; ".join(notes)
    if want("collectives"):
        _show(console, t)
    if want("sizes"):
        print_by_size(report, console)
    if want("peak"):
        print_peak_busbw(report, console)
    if run.get("source") == "nccl_tests" and want("collectives"):
        console.print(Text("nccl-tests log: one row per message size (the log's average time); no timeline to overlap",
                       style="dim"))
    t = _table("Overlap per rank (whole trace)")
    for col in ("rank", "comm ms", compute_header(report), "overlap ms", "exposed comm ms", "overlap ratio"):
        t.add_column(col, justify="right")
    for r in report["overlap_by_rank"]:  # empty for nccl-tests runs
        t.add_row(str(r["rank"]), fmt_ms(r["comm_ns"]), fmt_ms(r["compute_ns"]), fmt_ms(r["overlap_ns"]),
                  fmt_ms(r["exposed_comm_ns"]), fmt_pct(r["overlap_ratio"]))
    if report["overlap_by_rank"] and want("overlap"):
        _show(console, t)
    if report["stragglers"] and want("stragglers"):
        t = _table(f"Worst stragglers (top {TOP_STRAGGLERS} instances by skew)")
        for col in ("op", "pg", "seq", "size", "straggler rank", "skew µs", "sync µs"):
            t.add_column(col, justify="right" if col not in ("op", "pg") else "left")
        for r in report["stragglers"]:
            t.add_row(r["op"], str(r["pg_name"]), str(r["seq"]), fmt_size(r["size_bytes"]), str(r["straggler"]),
                      fmt_us(r["skew_ns"]), fmt_us(r["sync_time_ns"]))
        _show(console, t)
    if report.get("straggler_ranks") and want("stragglers"):
        t = _table("Stragglers by rank (the waiting each imposed on the others)")
        for col in ("rank", "times last", "waiting imposed ms", "largest waits summed ms"):
            t.add_column(col, justify="right")
        for r in report["straggler_ranks"]:
            t.add_row(str(r["rank"]), str(r["times_last"]), fmt_ms(r["wait_caused_ns"]), fmt_ms(r["skew_sum_ns"]))
        _show(console, t)
    if report.get("fit") and want("fit"):
        t = _table("α–β fit per op and process group (this run's sync times; weighted by relative error; "
                   "only a group's 'ok' fit judges anything)")
        for col in ("op", "k", "group", "used", "sizes", "α/step µs (95 %)", "fixed latency µs", "β GB/s (95 %)"):
            t.add_column(col, justify="left" if col in ("op", "group") else "right", no_wrap=(col == "op"))
        for r in report["fit"]:
            # an insufficient fit's α, β (clamped at their bounds, from too few sizes) describe nothing
            shown = r["status"] != "insufficient"
            a = r["alpha_s"] if shown else None
            alpha = "—" if a is None else (
                f"{a * 1e6:,.2f} ({fmt_num(None if r['alpha_lo_s'] is None else r['alpha_lo_s'] * 1e6)}–"
                f"{fmt_num(None if r['alpha_hi_s'] is None else r['alpha_hi_s'] * 1e6)})")
            beta = "—" if r["beta_gbps"] is None or not shown else (
                f"{r['beta_gbps']:,.2f} ({fmt_num(r['beta_lo_gbps'])}–{fmt_num(r['beta_hi_gbps']) if r['beta_hi_gbps'] is not None else '∞'})")
            t.add_row(r["op"], _k(r["group_size"]), fit_group_label(r), f"{r['n_used']}/{r['n_samples']}",
                      str(r.get("n_sizes") or 0), alpha,
                      fmt_us(None if r["fixed_latency_s"] is None or not shown else r["fixed_latency_s"] * 1e9), beta)
        _show(console, t)
        t = _table("α–β fit quality per op: the boundary it implies, its spread, its status")
        for col in ("op", "k", "group", "class", "D*", "link n½", "spread (sizes)", "status"):
            t.add_column(col, justify="left" if col in ("op", "group", "class", "status") else "right",
                         no_wrap=(col == "op"))
        for r in report["fit"]:
            status = r["status"] + (f": {r['status_reason']}" if r.get("status_reason") else "")
            t.add_row(r["op"], _k(r["group_size"]), fit_group_label(r), LOCALITY_SHORT.get(r["locality"], "?"),
                      fmt_bytes(r["crossover_bytes"] if r["status"] != "insufficient" else None),
                      fmt_bytes(r["n_half_bytes"] if r["status"] != "insufficient" else None),
                      f"{fmt_pct(r['residual_spread'])} ({fmt_pct(r.get('size_spread'))})", status)
        t.caption = ("D* = the collective's crossover size (α term = β term): its latency/bandwidth boundary; "
                     "n½ = α·β is the link's (one message). spread: RMS relative residual of the samples "
                     "(of the per-size medians, which is judged: ok <= 15 %); class: the group's ranks on one "
                     "host (intra), one on each of several (inter), several on each of several (mixed) or unknown; "
                     "'all <class>': that class's groups pooled; β from "
                     "the plateau sizes >= 4·D*, α from the sizes below (--json: alpha_range_*, beta_range_*)")
        _show(console, t)
    if report.get("references") and want("references"):
        t = _table("Reference of the verdicts (what each op was judged against)")
        for col in ("op", "k", "class", "instances", "reference", "note"):
            t.add_column(col, justify="left" if col in ("op", "class", "reference", "note") else "right")
        for r in report["references"]:
            note = r["no_model_reason"] if r["kind"] is None else (r["note"] or "")
            t.add_row(r["op"], _k(r["group_size"]), LOCALITY_SHORT.get(r["locality"], "?"), str(r["instances"]),
                      r["reference"] + (f" [{r['kind']}]" if r["kind"] else "")
                      + (f"; NCCL's model: {r['nccl_algos']}" if r.get("nccl_algos") else ""), note or "")
        _show(console, t)
        t = _table("The references' α and β, fixed latency and boundary D*")
        for col in ("op", "k", "reference", "α/step µs", "fixed latency µs", "β GB/s", "D* (boundary)", "link n½"):
            t.add_column(col, justify="left" if col in ("op", "reference") else "right")
        for r in report["references"]:
            if r["kind"] is None:
                continue
            short = r["kind"] if r["kind"] in ("sweep", "nccl_tests") else r["reference"]  # run ids are long
            lat, dstar = fmt_us(r["fixed_latency_ns"]), fmt_bytes(r["crossover_bytes"])
            if r["fixed_latency_ns"] is None and r.get("fixed_latency_min_ns") is not None:  # per size (NCCL's model)
                lat = f"{fmt_us(r['fixed_latency_min_ns'])}–{fmt_us(r['fixed_latency_max_ns'])}"
            if r["crossover_bytes"] is None and r.get("crossover_min_bytes") is not None:
                dstar = f"{fmt_bytes(r['crossover_min_bytes'])}–{fmt_bytes(r['crossover_max_bytes'])}"
            t.add_row(r["op"], _k(r["group_size"]), short, fmt_num(None if r["alpha_s"] is None else r["alpha_s"] * 1e6),
                      lat, fmt_num(r["beta_gbps"]), dstar, fmt_bytes(r["n_half_bytes"]))
        if t.row_count:
            _show(console, t)
    from tracekit.report.remedies import print_remedies

    if want("remedies"):
        print_remedies(report, console)  # why each weak reference is weak and the command that fixes it
    if report.get("verdicts") and want("verdicts"):
        t = _table("Verdicts (skew-bound: waiting > transfer; else latency-bound below D*, bandwidth-bound above)")
        for col in ("op", "class", "verdict", "reference", "count", "efficiency", "vs link"):
            t.add_column(col, justify="right" if col in ("count", "efficiency", "vs link") else "left")
        for r in report["verdicts"]:
            ref = r["reference"] + (f" [{r['verdict_basis']}]" if r["verdict_basis"] else "")
            verdict = r["verdict"] or ("no verdict: " + (r.get("no_model_reason") or "no reference"))
            t.add_row(r["op"], LOCALITY_SHORT.get(r["locality"], "?"), verdict, ref, str(r["count"]),
                      fmt_num(r["median_efficiency"]), fmt_num(r["median_efficiency_link"]))
        links = sorted({r["link"] for r in report["verdicts"] if r.get("link")})
        t.caption = ("efficiency: median predicted / measured sync time, against the reference; vs link: against "
                     "the link (" + (", ".join(links) or "none") + "); class: the group's ranks on one host (intra), "
                     "one on each of several (inter), several on each of several (mixed), unknown")
        _show(console, t)
    if report.get("furthest_from_model") and want("furthest"):
        t = _table("Furthest from the model (lowest predicted/measured under each verdict's reference, see above)")
        for col in ("op", "seq", "size", "sync µs", "predicted µs", "efficiency", "verdict", "best algo"):
            t.add_column(col, justify="left" if col in ("op", "verdict", "best algo") else "right")
        for r in report["furthest_from_model"]:
            t.add_row(r["op"], str(r["seq"]), fmt_size(r["size_bytes"]), fmt_us(r["sync_time_ns"]), fmt_us(r["predicted_ns"]),
                      fmt_num(r["efficiency"]), r["verdict"] or "—", r["best_algo"] or "—")
        _show(console, t)
    if report.get("measured_vs_model") and want("model"):
        rows = report["measured_vs_model"]
        t = _table("Measured per step (means over the profiled steps that hold communication)")
        for col in ("rank", "steps", compute_header(report), "comm ms", "overlap ms", "exposed ms"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r["rank"]), str(r["steps"]), fmt_ms(r["compute_ns"]), fmt_ms(r["comm_ns"]), fmt_ms(r["overlap_ns"]),
                      fmt_ms(r["exposed_ns"]))
        _show(console, t)
        t = _table("Model per step (α–β prediction under the run's overlap model) against the measurement")
        for col in ("rank", "model", "predicted comm ms", "predicted exposed ms", "measured / predicted", "α/β from"):
            t.add_column(col, justify="left" if col in ("model", "α/β from") else "right")
        unmeasured_wait = False
        for r in rows:
            gap = "—" if r["gap_ratio"] is None else f"{r['gap_ratio']:.2f}× ({r['larger']} larger)"
            if r["gap_ratio"] is not None and r.get("wait_ns") is None and r.get("larger") == "measured":
                gap, unmeasured_wait = "≤ " + gap, True  # the measurement holds waits no recorded rank can split off
            t.add_row(str(r["rank"]), r["model"], fmt_ms(r["predicted_comm_ns"]), fmt_ms(r["predicted_exposed_ns"]), gap,
                      r["ab_source"] or "—")
        t.caption = "; ".join(sorted({r["note"] for r in rows if r.get("note")}) + (
            ["≤: the rank's measured communication includes waiting for ranks that were not recorded (waits need two "
             "ranks of a group), so the transfer itself is at most this much slower than the model"]
            if unmeasured_wait else []))
        _show(console, t)
        t = _table("Gap per step, decomposed: which part to fix")
        for col in ("rank", "gap ms", "skew ms", "transfer ms", "exposure ms"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r["rank"]), fmt_ms(r.get("gap_ns")), *(fmt_ms(_to_fix(r.get(k))) for k in (
                "gap_skew_ns", "gap_transfer_ns", "gap_exposure_ns")))
        t.caption = ("gap = measured exposed − predicted exposed = skew (waiting for stragglers) + transfer (beyond "
                     "the α–β model) + exposure (what the overlap model would hide, minus what was hidden); a part "
                     "below the model shows 0 (nothing to fix there; --json keeps its signed value); — : not "
                     "measurable (waits need two ranks of a group)")
        _show(console, t)
    if report.get("model_by_dimension") and want("model"):
        t = _table("Measured vs model per dimension (means over ranks, per step; each dimension's overlap model)")
        for col in ("dim", "model", "ranks", "calls", "comm ms", "exposed ms", "max rank ms", "pred. exposed ms",
                    "meas/pred"):
            t.add_column(col, justify="left" if col in ("dim", "model") else "right")
        for d in report["model_by_dimension"]:
            t.add_row(d["dimension"], d["model"] or "—", str(d["ranks"]), fmt_num(d["calls"]), fmt_ms(d["comm_ns"]),
                      fmt_ms(d["exposed_ns"]), fmt_ms(d["max_exposed_ns"]), fmt_ms(d["predicted_exposed_ns"]),
                      "—" if d["ratio"] is None else f"{d['ratio']:.3g}×")
        t.caption = ("exposed = Σ over the dimension's calls of their time not covered by compute; predicted: α–β "
                     "per call, then " + "; ".join(f"{d['dimension']}: {d['note']}" for d in report["model_by_dimension"]))
        _show(console, t)
    if want("groups") and (len(report.get("by_dimension") or []) > 1
                           or any(d["dimension"] != "other" for d in report.get("by_dimension") or [])):
        t = _table("Process groups by dimension (tp/pp/dp/ep from the groups' descriptions, else the run's layout)")
        for col in ("dimension", "groups", "calls", "instances", "incomplete", "bytes", "sync ms", "comm ms", "overlap"):
            t.add_column(col, justify="left" if col == "dimension" else "right")
        for d in report["by_dimension"]:
            t.add_row(d["dimension"], str(d["groups"]), str(d["calls"]), str(d["instances"]), str(d["incomplete"]),
                      fmt_bytes(d["bytes"]), fmt_ms(d["sync_time_ns"]), fmt_ms(d["comm_ns"]), fmt_pct(d["overlap_fraction"]))
        _show(console, t)
    for name, show in (("gpu", print_gpu_breakdown), ("kernels", print_kernel_sections), ("alltoall", print_alltoall),
                       ("fleet", print_fleet), ("bubbles", print_bubbles), ("critical-path", print_critical_path),
                       ("hang", print_hang)):  # bandwidth by locality: a column of --section sizes (all in --json)
        if want(name):
            show(report, console)
    for w in report["warnings"] if want("warnings") else ():
        console.print(Text.assemble(("warning:", "yellow"), " " + literal(str(w))))


def print_run_report(store: Store | str | None, run_id: str) -> None:
    """Build the report of ``run_id`` in ``store`` and print it to the terminal (:func:`print_report`),
    without what only ``--json`` and ``--html`` show (``build_report(strips=False)``). Raises as
    :func:`build_report`."""
    print_report(build_report(store, run_id, strips=False))


# -- CPU-only ranks, CPU-side collectives, same-stream overlaps (tracekit.ingest.linkpass) ---------


def cpu_side_section(con, run_id: str, ranks: list[dict]) -> dict:
    """The report's ``cpu_side`` key: ``cpu_only_ranks`` (ranks whose trace has no GPU activity,
    ``ranks.gpu_events`` = 0: their "compute" is CPU op time), ``cpu_side_calls`` (collectives rows
    with ``cpu_side``: a CPU span, no GPU kernel), ``same_stream_overlaps`` (per rank with any: GPU
    ops kept whole over the next op on their stream, ``ranks.same_stream_overlaps``)."""
    n = con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND cpu_side", [run_id]).fetchone()[0]
    return dict(
        cpu_only_ranks=[r["rank"] for r in ranks if r.get("gpu_events") == 0],
        cpu_side_calls=int(n),
        same_stream_overlaps={r["rank"]: r["same_stream_overlaps"] for r in ranks if r.get("same_stream_overlaps")},
    )


def compute_header(report: dict) -> str:
    """"compute ms", or "CPU compute ms" when every rank of the run is CPU-only."""
    cs = report.get("cpu_side") or {}
    cpu = cs.get("cpu_only_ranks") or []
    return "CPU compute ms" if cpu and len(cpu) == len(report["ranks"]) else "compute ms"


def _rank_list(ranks: list) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def cpu_side_lines(report: dict) -> list[str]:
    """One line each, as plain text: the CPU-only ranks (their compute is CPU op time), the
    CPU-side collectives (their span is the CPU call), the same-stream overlaps kept whole."""
    from tracekit.store import CLIP_TOLERANCE_NS

    cs = report.get("cpu_side") or {}
    out = []
    cpu = cs.get("cpu_only_ranks") or []
    if cpu:
        out.append(f"{_rank_list(cpu)}: no GPU activity in the trace; compute = CPU op time, not GPU compute")
    if cs.get("cpu_side_calls"):
        out.append(f"{cs['cpu_side_calls']:,} CPU-side collective call(s), no GPU kernel: span = the CPU call "
                   "(launch and wait included) or gloo's span")
    ss = cs.get("same_stream_overlaps") or {}
    if ss:
        out.append(f"{sum(ss.values()):,} GPU op(s) overlap the next on their stream ({_rank_list(sorted(ss))}; "
                   f"programmatic dependent launch on sm_90+, or <= {CLIP_TOLERANCE_NS} ns): kept whole, "
                   "counted once in the unions")
    return out


def print_cpu_side(report: dict, console) -> None:
    """The :func:`cpu_side_lines` under the run's header."""
    from rich.text import Text

    for line in cpu_side_lines(report):
        console.print(Text(line))


# -- GPU time breakdown (analyses/gpu_time_breakdown.py) -----------------------------

GPU_PARTS = ("compute_only_ns", "comm_exposed_ns", "comm_hidden_ns", "memory_ns", "sync_ns", "other_ns", "idle_ns")
"""The parts of gpu_time_breakdown that sum to window_ns, in display order."""


def gpu_breakdown_section(con, run_id: str) -> dict[str, list[dict]]:
    """The report's ``gpu_time_breakdown`` key: ``by_rank`` (the whole-trace window of each rank)
    and ``by_step`` (one row per rank and profiler step, ``step`` for ``grp``), each row the
    columns of ``gpu_time_breakdown`` (analyses/gpu_time_breakdown.py; ns, idle_fraction a ratio).
    Both lists are empty for a run without GPU tracks (CPU-only traces, nccl-tests logs)."""
    rows = _rows(con, "SELECT * EXCLUDE (run_id) FROM gpu_time_breakdown WHERE run_id = ? ORDER BY grp, rank", [run_id])
    by_rank = [{k: v for k, v in r.items() if k != "grp"} for r in rows if r["grp"] == -1]
    by_step = [{"step": r["grp"], **{k: v for k, v in r.items() if k != "grp"}} for r in rows if r["grp"] != -1]
    return {"by_rank": by_rank, "by_step": by_step}


def print_gpu_breakdown(report: dict, console) -> None:
    """The GPU time breakdown per rank (whole trace) as a rich table; nothing without GPU tracks; for a
    run whose GPU work the ingest could not sweep, one line saying so and why (its rank warning,
    tracekit.store.GPU_NOT_SUMMARISED)."""
    from rich.table import Table
    from rich.text import Text

    from tracekit.store import GPU_NOT_SUMMARISED

    rows = (report.get("gpu_time_breakdown") or {}).get("by_rank") or []
    if not rows:
        why = next((w for w in report.get("warnings") or [] if GPU_NOT_SUMMARISED in w), None)
        if why is not None:
            console.print(Text(f"GPU time per rank: — ({why})"))
        return
    t = _table("GPU time per rank (whole trace; parts sum to the window; idle = no GPU activity)")
    for col in ("rank", "window ms", "compute only", "comm exposed", "comm hidden", "memcpy/set", "sync", "other",
                "idle"):
        t.add_column(col, justify="right")
    for r in rows:
        w = r["window_ns"] or None
        t.add_row(str(r["rank"]), fmt_ms(r["window_ns"]), *(fmt_pct(None if w is None else r[k] / w) for k in GPU_PARTS))
    _show(console, t)
    t = _table("GPU idle time per rank, by class (whole trace)")
    for col in ("rank", "idle ms", "host wait ms", "kernel wait ms", "other idle ms"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["rank"]), fmt_ms(r["idle_ns"]),
                  *(fmt_ms(r[k]) for k in ("idle_host_wait_ns", "idle_kernel_wait_ns", "idle_other_ns")))
    t.caption = ("idle classes as HTA's idle-time breakdown: host wait = the next GPU op was launched after the GPU "
                 "went idle; kernel wait = gap < 30 ns; other = the rest")
    _show(console, t)


# -- kernel summary and GPU time by launcher (analyses/kernel_summary.sql) -------------

TOP_KERNELS_PER_CLASS = 5
TOP_LAUNCHERS = 10


def kernel_sections(con, run_id: str) -> dict[str, list[dict]]:
    """The report's ``kernel_summary`` (the TOP_KERNELS_PER_CLASS largest GPU ops by total time in
    each class: the columns of ``kernel_summary``, ns) and ``gpu_time_by_launcher`` (the
    TOP_LAUNCHERS largest launchers per kind, cpu_op and annotation, plus the unattributed row,
    launcher null: the columns of ``gpu_time_by_launcher``). Empty lists without GPU tracks."""
    kernels = _rows(con, "SELECT * EXCLUDE (run_id) FROM kernel_summary WHERE run_id = ? AND class_rank <= ? "
                         "ORDER BY class, class_rank", [run_id, TOP_KERNELS_PER_CLASS])
    launchers = _rows(con, """
        SELECT * EXCLUDE (run_id, n) FROM (
            SELECT *, row_number() OVER (PARTITION BY launcher_kind ORDER BY launcher IS NULL, gpu_total_ns DESC,
                                         launcher) AS n
            FROM gpu_time_by_launcher WHERE run_id = ?)
        WHERE n <= ? OR launcher IS NULL ORDER BY launcher_kind, launcher IS NULL, gpu_total_ns DESC, launcher
        """, [run_id, TOP_LAUNCHERS])
    return {"kernel_summary": kernels, "gpu_time_by_launcher": launchers}


def print_kernel_sections(report: dict, console) -> None:
    """The top GPU ops per class and the GPU time per launcher as rich tables (nothing without GPU ops)."""
    from rich.table import Table

    if report.get("kernel_summary"):
        t = _table(f"Top GPU ops per class (by total time; top {TOP_KERNELS_PER_CLASS})")
        for col in ("class", "name", "count", "total ms", "mean µs", "p50 µs", "p95 µs", "share of steps"):
            t.add_column(col, justify="left" if col in ("class", "name") else "right")
        for r in report["kernel_summary"]:
            t.add_row(r["class"], terminal_kernel_name(r["name"]), str(r["count"]), fmt_ms(r["total_ns"]), fmt_us(r["mean_ns"]),
                      fmt_us(r["p50_ns"]), fmt_us(r["p95_ns"]), fmt_pct(r["step_share"]))
        if any(terminal_kernel_name(r["name"]).endswith(PARAMS_DROPPED) for r in report["kernel_summary"]):
            t.caption = f"{PARAMS_DROPPED} = a templated kernel's parameter list, left out (full names in --json and --html)"
        _show(console, t)
    if report.get("gpu_time_by_launcher"):
        t = _table("GPU time by the CPU op / record_function range that launched it")
        for col in ("kind", "launcher", "GPU ops", "GPU ms", "compute ms", "comm ms", "share"):
            t.add_column(col, justify="left" if col in ("kind", "launcher") else "right")
        for r in report["gpu_time_by_launcher"]:
            t.add_row(r["launcher_kind"], terminal_kernel_name(r["launcher"]) if r["launcher"] else "(none)",
                      str(r["gpu_ops"]), fmt_ms(r["gpu_total_ns"]),
                      fmt_ms(r["compute_ns"]), fmt_ms(r["comm_ns"]), fmt_pct(r["share"]))
        _show(console, t)


# -- all-to-all imbalance (analyses/alltoall_imbalance.sql) ----------------------------

TOP_ALLTOALL = 10


def alltoall_section(con, run_id: str) -> dict[str, Any]:
    """The report's ``alltoall_imbalance``: ``calls`` (the TOP_ALLTOALL instances with the largest
    imbalance_cost_ns, the columns of ``alltoall_imbalance``: bytes, ns, ratios), ``matrix_total``
    (src, dst, calls, bytes: ``alltoall_matrix_total``), ``instances`` (all-to-alls with splits) and
    ``imbalance_cost_ns`` (their imbalance_cost_ns summed). Empty lists and 0 without all-to-alls."""
    if not con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND op = 'all_to_all'", [run_id]).fetchone()[0]:
        return {"calls": [], "matrix_total": [], "instances": 0, "imbalance_cost_ns": 0.0}  # the views' rows are its rows
    calls = _rows(con, f"SELECT * EXCLUDE (run_id) FROM alltoall_imbalance WHERE run_id = ? "
                       f"ORDER BY imbalance_cost_ns DESC NULLS LAST, pg_name, win, seq LIMIT {TOP_ALLTOALL}", [run_id])
    matrix = _rows(con, "SELECT src, dst, calls, bytes FROM alltoall_matrix_total WHERE run_id = ? ORDER BY src, dst",
                   [run_id])
    # a float sum in one fixed order (pg_name, win, seq): the view's rows come in no fixed order, and a
    # sum in scan order could differ in its last digit from one run to the next
    n, cost = con.execute("SELECT count(*), coalesce(sum(imbalance_cost_ns ORDER BY pg_name, win, seq), 0) FROM alltoall_imbalance "
                          "WHERE run_id = ?", [run_id]).fetchone()
    return {"calls": calls, "matrix_total": matrix, "instances": n, "imbalance_cost_ns": float(cost)}


def print_alltoall(report: dict, console) -> None:
    """The most imbalanced all-to-all calls as a rich table (nothing without all-to-alls with splits)."""
    from rich.table import Table

    sec = report.get("alltoall_imbalance") or {}
    if not sec.get("calls"):
        return
    t = _table(f"All-to-all imbalance (top {TOP_ALLTOALL} of {sec['instances']} calls by imbalance cost)")
    for col in ("pg", "seq", "bytes", "send max/mean", "recv max/mean", "heaviest recv", "sync µs", "imbalance cost µs",
                "slowest rank", "its excess µs"):
        t.add_column(col, justify="left" if col == "pg" else "right")
    for r in sec["calls"]:
        t.add_row(str(r["pg_name"]), str(r["seq"]), fmt_bytes(r["total_bytes"]), fmt_num(r["send_imbalance"]),
                  fmt_num(r["recv_imbalance"]), str(r["heaviest_receiver"]), fmt_us(r["sync_time_ns"]),
                  fmt_us(r["imbalance_cost_ns"]), str(r["slowest_rank"]), fmt_us(r["slowest_excess_ns"]))
    t.caption = ("imbalance cost = sync × (1 − 1/max imbalance): the transfer time a balanced call would not need "
                 f"if bandwidth-bound; all calls: {fmt_us(sec['imbalance_cost_ns'])} µs")
    _show(console, t)


# -- intra- vs inter-node (analyses/node_locality.sql) ----------------------------------


def print_locality(report: dict, console) -> None:
    """``report['bandwidth_by_locality']`` (the columns of ``bandwidth_by_locality``) as a rich
    table; nothing when the run has no collectives or all are of unknown locality on one host."""
    from rich.table import Table

    rows = report.get("bandwidth_by_locality") or []
    if not rows:
        return
    t = _table("Bandwidth by locality and size (group's ranks on one host = intra_node, on several = inter_node)")
    for col in ("op", "locality", "size ≥", "instances", "total bytes", "median sync µs", "median busbw GB/s",
                "max busbw GB/s"):
        t.add_column(col, justify="left" if col in ("op", "locality") else "right")
    for r in rows:
        t.add_row(r["op"], r["locality"], size_label(r["bucket_bytes"]), str(r["instances"]),
                  fmt_bytes(r["total_bytes"]), fmt_us(r["median_sync_time_ns"]), fmt_num(r["median_busbw_gbps"]),
                  fmt_num(r["max_busbw_gbps"]))
    if all(r["locality"] == "unknown" for r in rows):
        t.caption = "hosts unknown: the traces name no host (ranks.host)"
    _show(console, t)


# -- pipeline bubbles (analyses/pipeline_bubbles.sql) -----------------------------------


MAX_BUBBLE_ROWS = 16
"""(step, stage) rows of the terminal's pipeline-bubble table; the JSON has them all."""


def print_bubbles(report: dict, console) -> None:
    """``report['pipeline_bubbles']`` (the columns of ``pipeline_bubbles``) as a rich table; nothing
    for runs without send/recv."""
    from rich.table import Table

    rows = report.get("pipeline_bubbles") or []
    if not rows:
        return
    t = _table("Pipeline bubbles per stage and step (measured vs (p−1)/(m+p−1), GPipe)")
    for col in ("step", "stage (rank)", "step ms", "compute ms", "recv wait ms", "other ms", "bubble", "model"):
        t.add_column(col, justify="right")
    for r in rows[:MAX_BUBBLE_ROWS]:
        t.add_row(str(r["step"]), str(r["rank"]), fmt_ms(r["window_ns"]), fmt_ms(r["compute_ns"]),
                  fmt_ms(r["recv_wait_ns"]), fmt_ms(r["other_ns"]), fmt_pct(r["bubble_fraction"]),
                  fmt_pct(r["model_bubble_fraction"]))
    t.caption = ("bubble = (step − compute) / step; the model assumes equal stages and free transfers"
                 + (f"; {MAX_BUBBLE_ROWS} of {len(rows)} rows (--json has them all)" if len(rows) > MAX_BUBBLE_ROWS else ""))
    _show(console, t)


# -- critical path (analyses/critical_path.py) ------------------------------------------

TOP_PATH_EVENTS = 10
"""Events shown in the report's "Top events on the critical paths" (by time on the paths)."""
MAX_PATH_ROWS = 16
"""(step, rank) rows of the terminal's critical-path table; the JSON has them all."""
PATH_PARTS = ("compute_ns", "exposed_comm_ns", "memory_ns", "launch_cpu_ns", "sync_other_ns", "straggler_ns",
              "idle_ns")
"""critical_path_summary's composition columns (they sum to length_ns), in display order."""


def critical_path_section(con, run_id: str, want: bool | None = None, strips: bool = True) -> dict[str, Any]:
    """The report's ``critical_path`` (``want``: see :func:`critical_path_wanted`; when it is not
    built: empty lists and ``skipped``, the reason): ``summary`` (the columns of ``critical_path_summary`` per rank
    and step, ns), ``top_events`` (the TOP_PATH_EVENTS (name, class) with the most time on the run's
    paths: events, ranks, on_path_ns, share = on_path_ns / the paths' summed length),
    ``top_by_path`` (per rank and step, its 3 events with the most time on its path) and ``paths``
    (:func:`path_strips`; None, not computed, when ``strips`` is False). Empty lists for a run
    without events."""
    from tracekit.analyses.critical_path import critical_path_wanted

    build, why = critical_path_wanted(want)
    if not build:
        return {"summary": [], "top_events": [], "top_by_path": [], "paths": [], "skipped": why}
    summary = _rows(con, "SELECT * EXCLUDE (run_id) FROM critical_path_summary WHERE run_id = ? "
                         "ORDER BY step, rank", [run_id])
    for r in summary:
        r["longer_than_step"] = longer_than_step(r)
    # the events with most time on the paths, and each path's 3 largest (analyses/critical_path_events.sql)
    top = _rows(con, "SELECT * EXCLUDE (run_id) FROM critical_path_events WHERE run_id = ? "
                     "ORDER BY on_path_ns DESC, name LIMIT ?", [run_id, TOP_PATH_EVENTS])
    by_path = _rows(con, "SELECT * EXCLUDE (run_id, pos) FROM critical_path_top WHERE run_id = ? "
                         "ORDER BY step, rank, on_path_ns DESC, pos", [run_id])
    return {"summary": summary, "top_events": top, "top_by_path": by_path,
            "paths": path_strips(con, run_id) if strips else None}


MAX_PATH_STRIPS = 16
"""Paths (rank, step) whose pieces the report keeps (``critical_path.paths``, the HTML's strip)."""


def path_strips(con, run_id: str) -> list[dict]:
    """The first MAX_PATH_STRIPS paths (by step, rank) as time strips: ``rank``, ``step``,
    ``start_ns``, ``end_ns`` and ``segments``, consecutive pieces of one part and rank merged:
    [start_ns, end_ns, part, name of the longest piece, pieces, event_rank] (ns on the run clock;
    part as critical_path_summary's columns without ``_ns``)."""
    from tracekit.analyses.critical_path import path_strips as strips

    return strips(con, run_id, MAX_PATH_STRIPS)


def print_critical_path(report: dict, console) -> None:
    """The critical path per step and rank (its length and composition in % of it) and the top
    events on the paths, as rich tables; nothing for a run without events."""
    sec = report.get("critical_path") or {}
    rows = sec.get("summary") or []
    if sec.get("skipped"):
        from rich.text import Text

        console.print()
        console.print(Text(f"Critical path: {sec['skipped']}", style="dim"))
    if not rows:
        return
    shown = rows[:MAX_PATH_ROWS]
    t = _table("Critical path per step and rank (parts in % of the path; they sum to it)")
    for col in ("step", "rank", "path ms", "step ms", "compute", "comm", "memory", "CPU", "sync", "other ranks", "idle"):
        t.add_column(col, justify="right")
    for r in shown:
        n = r["length_ns"] or None
        t.add_row("—" if r["step"] is None else str(r["step"]), str(r["rank"]),
                  fmt_ms(r["length_ns"]) + ("*" if r.get("longer_than_step") else ""),
                  fmt_ms(r["window_ns"]), *(fmt_pct(None if n is None else r[k] / n) for k in PATH_PARTS))
    more = f"; {len(shown)} of {len(rows)} rows (all in --json)" if len(rows) > len(shown) else ""
    why = sorted({r["longer_than_step"] for r in shown if r.get("longer_than_step")})
    if why:
        more += "; * path longer than the step: " + "; ".join(why)
    t.caption = ("the chain of stream order, launches, host thread order, syncs and collective last arrivals that "
                 "ends at the rank's last event of the step; comm = communication after the last arrival; "
                 "other ranks = the path on the work of a rank that arrived last at a collective (late by that "
                 "collective's skew, however small: see the stragglers for how late; JSON straggler_ns); CPU = "
                 "runtime calls and host code; idle = a launched "
                 "op on a free stream held back by nothing recorded (cross-stream and host waits are inferred)" + more)
    _show(console, t)
    top = sec.get("top_events") or []
    if top:
        t = _table(f"Top events on the critical paths (top {TOP_PATH_EVENTS} by time on the paths)")
        t.add_column("name")
        for col in ("class", "events", "ranks", "on path ms", "share"):
            t.add_column(col, justify="left" if col == "class" else "right")
        for r in top:
            t.add_row(r["name"] or "", r["class"], str(r["events"]), str(r["ranks"]), fmt_ms(r["on_path_ns"]),
                      fmt_pct(r["share"]))
        t.caption = "share = time on the paths / the paths' summed length (gaps are in no event)"
        _show(console, t)


MISMATCHED_SHOWN = 5
"""Mismatched instances named in the report's one line (all of them are in the JSON)."""


def mismatched_section(con, run_id: str) -> list[dict]:
    """The run's mismatched instances (the view ``mismatched_instances``: ranks whose calls at one (group,
    window, seq) disagree on op or size), ordered by group and seq: dicts of pg_name, win, seq,
    ranks, ops, sizes (bytes). Such instances are left out of every count, wait, straggler,
    bandwidth, fit and verdict of the report."""
    return _rows(con, "SELECT * EXCLUDE (run_id) FROM mismatched_instances WHERE run_id = ? ORDER BY pg_name, win, seq",
                 [run_id])


def mismatched_line(rows: list[dict]) -> str:
    """The report's one line about mismatched instances: how many, and the first few as
    ``group g seq s: rank r op size, ...``."""
    def one(m):
        calls = ", ".join(f"rank {r} {o or '?'} {fmt_bytes(z) if z is not None else '?'}"
                          for r, o, z in zip(m["ranks"], m["ops"], m["sizes"]))
        return f"group {m['pg_name']} seq {m['seq']}: {calls}"
    shown = "; ".join(one(m) for m in rows[:MISMATCHED_SHOWN])
    more = f"; and {len(rows) - MISMATCHED_SHOWN} more" if len(rows) > MISMATCHED_SHOWN else ""
    return (f"{len(rows)} mismatched instance(s) (ranks' calls disagree on op or size; left out of counts, "
            f"waits, stragglers, bandwidth, fits, verdicts and the critical path): {shown}{more}")


def _over_cap(r: dict) -> bool:
    """Whether a by-op row's peak busbw exceeds its device's physical cap (collective_bandwidth.cap_gbps)."""
    return r.get("peak_busbw_gbps") is not None and r.get("cap_gbps") is not None and r["peak_busbw_gbps"] > r["cap_gbps"]


def _to_fix(ns):
    """A gap part as "which part to fix" shows it: None stays None (not measurable), a part below the
    model (negative: ahead of it) is 0, nothing to fix."""
    return None if ns is None else max(0.0, ns)


def longer_than_step(r: dict) -> str | None:
    """Why a critical_path_summary row's path is longer than the rank's own step span (length_ns >
    window_ns), or None when it is not: it starts on another rank's work (a straggler's, entered
    through a collective's last arrival) or before the rank's first event of the step (work the
    previous step left running)."""
    if r.get("length_ns") is None or r.get("window_ns") is None or r["length_ns"] <= r["window_ns"]:
        return None
    if r.get("other_ranks") or r.get("straggler_ns"):
        return "it starts on another rank's work before this rank's step began (a straggler)"
    return "it starts before the rank's first event of the step (work the previous step left running)"


def _k(group_size) -> str:
    """A group size as the terminal tables show it: "—" when unknown (no metadata, tensor shapes,
    membership or world size gave one)."""
    return "—" if group_size is None else str(group_size)


# -- the machine, degraded links and the fleet (tracekit/analyses/machine.py, fleet.py) ---------------

def machine_section(con, run_id: str) -> list[dict]:
    """The machines the run's groups ran on: one dict per distinct (gpu, nodes, ranks_per_host,
    nics_per_node, nic, locality, locality_reason, source) of group_machine, with ``groups`` (how many
    groups) and ``hosts`` (distinct hosts over those groups, sorted)."""
    return _rows(con, "SELECT * EXCLUDE (run_id) FROM machine_summary WHERE run_id = ? "
                      "ORDER BY nodes, ranks_per_host NULLS LAST, locality", [run_id])  # analyses/machine_summary.sql


def machine_lines(report: dict) -> list[str]:
    """The report's machine lines: "machine: 2 nodes × 8 NVIDIA H100 ... (source: ...)", one per shape;
    a class unknown says why."""
    out = []
    for m in report.get("machine") or []:
        if m["locality"] == "unknown" and not m["nodes"]:
            out.append(f"machine: {m['groups']} group(s) with hosts unknown: {m['locality_reason'] or 'no host named'}")
            continue
        per = f"{m['ranks_per_host']}" if m["ranks_per_host"] else "uneven"
        nics = (f", {m['nics_per_node']} NICs/node" if m["nics_per_node"] else "") + (f" ({m['nic']})" if m["nic"] else "")
        hosts = ", ".join(m["hosts"][:4]) + (f" and {len(m['hosts']) - 4} more" if len(m["hosts"]) > 4 else "")
        out.append(f"machine: {m['nodes']} node(s) × {per} rank(s) of {m['gpu'] or 'unknown GPU'}{nics}, "
                   f"{m['locality'].replace('_', '-')}, {m['groups']} group(s) on {hosts} (source: {m['source']})"
                   + (f" — {m['locality_reason']}" if m["locality_reason"] else ""))
    return out


def print_machine(report: dict, console) -> None:
    """The machine lines (:func:`machine_lines`)."""
    for line in machine_lines(report):
        console.print(line, highlight=False)


def degraded_warnings(rows: list[dict]) -> list[str]:
    """Warning lines for degraded groups (group_plateau rows with degraded true). Groups of the same op,
    rank count, class, basis and model fold into one line with their count; numbers that differ
    between them show as a range (min–max)."""
    from tracekit.analyses.fleet import MODEL_FRACTION, PEER_FRACTION

    def rng(vals, fmt):
        lo, hi = fmt(min(vals)), fmt(max(vals))
        return lo if lo == hi else f"{lo}–{hi}"

    pct = lambda v: f"{v:.0%}"  # noqa: E731
    folded: dict[tuple, list[dict]] = {}
    for d in rows:
        folded.setdefault((d["op"], d["group_size"], d["locality"], d["degraded_basis"], d["model"]), []).append(d)
    out = []
    for (op, k, loc, basis, model), ds in folded.items():
        why = []
        if "peers" in (basis or ""):
            why.append(f"{rng([d['peer_ratio'] for d in ds], pct)} of its peers' median "
                       f"{rng([d['peer_busbw_gbps'] for d in ds], fmt_num)} GB/s (< {PEER_FRACTION:.0%})")
        if "model" in (basis or ""):
            why.append(f"{rng([d['model_ratio'] for d in ds], pct)} of {model} "
                       f"({fmt_num(ds[0]['model_busbw_gbps'])} GB/s, < {MODEL_FRACTION:.0%})")
        if "pairs" in (basis or ""):
            why.append(f"{rng([d['pair_ratio'] for d in ds], pct)} of the median of its "
                       f"{rng([d['pair_peers'] for d in ds], str)} node pairs' "
                       f"{rng([d['pair_busbw_gbps'] for d in ds], fmt_num)} GB/s (< {PEER_FRACTION:.0%})")
        ask = ("link degraded or misconfigured?" if set((basis or "").split(",")) - {"pairs"} else
               "every pair alone is faster: the fabric under the whole group's traffic "
               "(routing, oversubscription)?")
        names = [f"{d['pg_name']} ({d['hosts'] or 'hosts not recorded'})" for d in ds]
        who = names[0] if len(ds) == 1 else (f"{len(ds)} groups: " + "; ".join(names[:3])
                                             + (f" and {len(ds) - 3} more" if len(ds) > 3 else ""))
        out.append(f"{op} on {k} ranks ({loc.replace('_', '-')}): large-message busbw "
                   f"{rng([d['plateau_busbw_gbps'] for d in ds], fmt_num)} GB/s (the sizes where its curve is flat, "
                   f"{fmt_bytes(min(d['plateau_min_bytes'] for d in ds))}–{fmt_bytes(max(d['plateau_max_bytes'] for d in ds))}) "
                   f"reaches {' and '.join(why)}: {ask} [{who}]")
    return out


def fleet_section(con, run_id: str) -> dict[str, Any]:
    """The fleet view (JSON key ``fleet``): ``pairs`` (fleet_pairs rows: per op, ranks per host and node
    pair, plateau busbw, fleet median, ratio, slow), ``nodes`` (fleet_nodes rows), ``slow_pairs`` and
    ``suspect_nodes`` (the rows flagged). Empty lists when the run has no two-node groups."""
    pairs = _rows(con, "SELECT * EXCLUDE (run_id) FROM fleet_pairs WHERE run_id = ? ORDER BY ALL", [run_id])
    nodes = _rows(con, "SELECT * EXCLUDE (run_id) FROM fleet_nodes WHERE run_id = ? ORDER BY ALL", [run_id])
    return dict(pairs=pairs, nodes=nodes, slow_pairs=[p for p in pairs if p["slow"]],
                suspect_nodes=[n for n in nodes if n["suspect"]])


def print_fleet(report: dict, console) -> None:
    """The fleet view: per op and ranks per host, a node × node table of plateau busbw (GB/s), then the
    slow pairs and the nodes common to several of them."""
    fleet = report.get("fleet") or {}
    pairs = fleet.get("pairs") or []
    if not pairs:
        return
    from tracekit.analyses.fleet import PEER_FRACTION, SUSPECT_SLOW_PAIRS

    for op, rph in sorted({(p["op"], p["ranks_per_host"]) for p in pairs}):
        sel = [p for p in pairs if p["op"] == op and p["ranks_per_host"] == rph]
        hosts = sorted({p["host_a"] for p in sel} | {p["host_b"] for p in sel})
        import os.path

        prefix = os.path.commonprefix(hosts) if len(hosts) > 1 else ""
        cell = {}
        for p in sel:
            cell[(p["host_a"], p["host_b"])] = cell[(p["host_b"], p["host_a"])] = p
        t = _table(f"Fleet: {op}, {rph} rank(s) per node — plateau busbw per node pair (GB/s; * slow)")
        t.add_column("node", justify="left", no_wrap=True)
        for h in hosts:
            t.add_column(h[len(prefix):], justify="right")
        for a in hosts:
            t.add_row(a[len(prefix):], *(("—" if a == b or (a, b) not in cell else
                            fmt_num(cell[(a, b)]["plateau_busbw_gbps"]) + ("*" if cell[(a, b)]["slow"] else ""))
                           for b in hosts))
        t.caption = ((f"nodes without their common prefix '{prefix}'; " if prefix else "")
                     + f"fleet median {fmt_num(sel[0]['fleet_busbw_gbps'])} GB/s; a pair is slow below "
                     f"{PEER_FRACTION:.0%} of its peers (tracekit/analyses/fleet.py)")
        _show(console, t)
    slow = fleet.get("slow_pairs") or []
    console.print("slow pairs: " + ("none" if not slow else "; ".join(
        f"{p['host_a']}–{p['host_b']} ({p['op']}, {p['ranks_per_host']}/node, "
        f"{fmt_num(p['plateau_busbw_gbps'])} GB/s = {p['ratio']:.0%} of the fleet)" for p in slow)), highlight=False)
    sus = fleet.get("suspect_nodes") or []
    if sus:
        console.print(f"node(s) common to >= {SUSPECT_SLOW_PAIRS} slow pairs: " + "; ".join(
            f"{n['host']} ({n['op']}, {n['ranks_per_host']}/node: {n['slow_pairs']} of {n['pairs']} pairs slow)"
            for n in sus), highlight=False)


# -- when the job hangs: Flight Recorder triage (analyses/hang.py) ----------------------------------

def _ranks_text(ranks) -> str:
    """``[0, 2]`` → ``'0, 2'``; empty or None → ``''``."""
    return ", ".join(map(str, ranks or []))


MAX_HANG_ROWS = 20
"""Diverging instances the terminal shows (all are in --json)."""


def hang_section(con, run_id: str) -> dict | None:
    """The report's ``hang`` section: None for a run without Flight Recorder dumps; else
    ``divergence`` (the hang_divergence row: the first collective where the ranks diverged, its
    classification, the culprit ranks and their last call, the longest wait in ns), ``diverging``
    (the hang_instances rows not fully_matched, by first arrival), ``dumps`` (rank, version,
    entries, reason, dumped_at_ns per dump), ``instances`` (how many were matched), ``collectives``
    (:func:`fr_collectives`) and ``timeline_after_first_event_ns`` (the divergence's place on the
    traces' timeline, ns after their first event; None when not placed or without events)."""
    div = _rows(con, "SELECT * EXCLUDE (run_id) FROM hang_divergence WHERE run_id = ?", [run_id])
    (n,) = con.execute("SELECT count(*) FROM fr_dumps WHERE run_id = ?", [run_id]).fetchone()
    if not n:
        return None
    bad = _rows(con, "SELECT * EXCLUDE (run_id) FROM hang_instances WHERE run_id = ? AND match_state <> 'fully_matched' "
                     "ORDER BY first_created_ns NULLS LAST, pg_name, seq", [run_id])
    dumps = _rows(con, "SELECT rank, version, entries, reason, dumped_at_ns FROM fr_dumps WHERE run_id = ? ORDER BY rank",
                  [run_id])
    d = div[0] if div else None
    first = None
    if d and d.get("timeline_ts_ns") is not None:
        (lo,) = con.execute("SELECT min(ts_ns) FROM events WHERE run_id = ?", [run_id]).fetchone()
        first = None if lo is None else d["timeline_ts_ns"] - int(lo)
    return dict(divergence=d, diverging=bad, dumps=dumps, instances=d["instances"] if d else 0,
                collectives=fr_collectives(con, run_id), timeline_after_first_event_ns=first)


def fr_collectives(con, run_id: str) -> list[dict]:
    """What the Flight Recorder dumps say of the run's collectives, per (process group, op, input
    bytes): calls (entries over ranks), ranks, instances (distinct seq), bytes = Σ in_bytes over
    calls, timed = calls with a recorded duration, median_duration_ns over them (NULL when none:
    gloo records none; NCCL only with TORCH_NCCL_ENABLE_TIMING). The dumps hold the last
    TORCH_FR_BUFFER_SIZE entries of each rank, so the counts cover that window, not the whole job."""
    return _rows(con, "SELECT * EXCLUDE (run_id) FROM fr_collectives WHERE run_id = ? "
                      "ORDER BY pg_name, op, in_bytes NULLS LAST", [run_id])  # analyses/fr_collectives.sql


def hang_lines(report: dict) -> list[str]:
    """The hang section as sentences (the terminal and the HTML page print them); [] without dumps."""
    sec = report.get("hang")
    if not sec:
        return []
    d = sec.get("divergence") or {}
    dumps = sec.get("dumps") or []
    lines = [f"{len(dumps)} Flight Recorder dump(s) (rank(s) {_ranks_text([x['rank'] for x in dumps])}); "
             f"{sec.get('instances', 0)} collective instance(s) matched by (process group, seq)"]
    if d.get("ranks_without_dump"):
        lines.append(f"rank(s) {_ranks_text(d['ranks_without_dump'])} left no dump: what they did is unknown")
    if not d or d.get("match_state") == "fully_matched":
        lines.append("every collective that the dumps hold matched on every rank that recorded it: no divergence")
        return lines
    group = f"group {d['pg_name']}" + (f" ({d['pg_desc']})" if d.get("pg_desc") else "")
    dim = f", dimension {d['dimension']}" if d.get("dimension") else ""
    lines.append(f"first divergence: {group}{dim}, seq {d['seq']}, {d['op']}: {d['match_state']} — {d['detail']}")
    if d.get("culprit_rank") is not None:
        basis = {"missing": "never arrived", "majority": "differs from the majority",
                 "tie": "a tie, differs from the lowest rank: either side may be the one"}.get(d.get("culprit_basis"), "")
        last = "no entry recorded"
        if d.get("culprit_last_op") is not None:
            last = (f"{d['culprit_last_op']} seq {d['culprit_last_seq']} of group {d['culprit_last_pg']} "
                    f"({d['culprit_last_state']})" + (f" at {d['culprit_last_frame']}" if d.get("culprit_last_frame") else ""))
        lines.append(f"culprit: rank(s) {_ranks_text(d['culprit_ranks'])} ({basis}); rank {d['culprit_rank']}'s last "
                     f"call: {last}")
    waited = "—" if d.get("waited_ns") is None else f"{d['waited_ns'] / 1e9:.3f} s"
    lines.append(f"waiting: rank(s) {_ranks_text(d.get('waiting_ranks') or [])}, up to {waited} (from issuing it to "
                 "their next call or their dump)")
    after = sec.get("timeline_after_first_event_ns")
    if d.get("timeline_ts_ns") is not None and after is not None:
        lines.append(f"on the traces' timeline {fmt_ms(after)} ms after their first event (Flight Recorder's wall clock "
                     f"aligned on {d['timeline_pairs']} collective call(s); marked in `tracekit export --perfetto`)")
    if d.get("mismatched", 0) > 1:
        lines.append(f"{d['mismatched']} instance(s) diverge in all (the first is the cause; the rest may follow from it)")
    return lines


def print_hang(report: dict, console) -> None:
    """The hang section: its sentences and the diverging instances, as rich text and a table."""
    from rich.text import Text

    lines = hang_lines(report)
    if not lines:
        return
    console.print()
    console.print(Text("When the job hangs: Flight Recorder triage", style="bold"))
    for line in lines:
        console.print(Text(line))
    bad = (report.get("hang") or {}).get("diverging") or []
    if bad:
        t = _table("Diverging collectives (first arrival order)")
        for col in ("group", "seq", "op", "state", "culprits", "missing", "detail"):
            t.add_column(col, justify="right" if col == "seq" else "left")
        for r in bad[:MAX_HANG_ROWS]:
            t.add_row(str(r["pg_name"]), str(r["seq"]), str(r["op"]), r["match_state"], _ranks_text(r["culprit_ranks"]),
                      _ranks_text(r["missing_ranks"]) or "—", r["detail"] or "—")
        if len(bad) > MAX_HANG_ROWS:
            t.caption = f"{MAX_HANG_ROWS} of {len(bad)} rows (all in --json)"
        _show(console, t)
    colls = (report.get("hang") or {}).get("collectives") or []
    if colls:
        t = _table("Collectives in the Flight Recorder dumps (per group, op and input size)")
        for col in ("group", "op", "bytes each", "calls", "ranks", "instances", "seq", "median ms"):
            t.add_column(col, justify="left" if col in ("group", "op") else "right")
        for r in colls[:MAX_HANG_ROWS]:
            t.add_row(str(r["pg_name"]), str(r["op"]), "—" if r["in_bytes"] is None else fmt_bytes(r["in_bytes"]),
                      str(r["calls"]), str(r["ranks"]), str(r["instances"]), f"{r['first_seq']}–{r['last_seq']}",
                      fmt_ms(r["median_duration_ns"]))
        t.caption = ("the last --fr-buffer entries of each rank only; median ms over the calls with a recorded "
                     "duration (— : none recorded: gloo records none, NCCL only with TORCH_NCCL_ENABLE_TIMING=1)")
        _show(console, t)
