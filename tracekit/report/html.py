"""The self-contained HTML report of one run (``tracekit analyze --html FILE``).

Three layers, kept apart (STYLE.md: no plotting inside analysis code):

1. :func:`html_data` gathers plain data: the :func:`tracekit.report.data.build_report` dict plus rows
   read from the analysis views (collective_bandwidth, collective_verdicts, collective_waits,
   comm/compute/overlap islands, alpha_beta_fit) and the model curves of
   :func:`model_curves`, whose every number comes from :mod:`tracekit.model`;
2. the ``*_figure`` functions turn that data into plotly figures, and :func:`report_tables`
   into generic :class:`Table` objects (a title, typed columns, a list of rows);
3. :func:`render_html` assembles one page: plotly's JavaScript is inlined once in the page head
   (no CDN: the file opens offline), then each figure, the tables and the run's metadata.

Units on the page: times in µs or ms, bandwidth in GB/s with GB = 10⁹ B, sizes in bytes with
decimal prefixes (kB = 10³ B, MB = 10⁶ B). The page records any JavaScript error into the
``#tk-js-errors`` element (shown when not empty) so a browser test can read it from the DOM.
"""

from __future__ import annotations

import functools
import html
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tracekit.errors import BadInputError
from tracekit.model import size_bucket_label
from tracekit.store import Store
from tracekit.report.textfmt import fmt_bytes, fmt_ms, fmt_num, fmt_pct, fmt_size, fmt_us  # noqa: F401  (also this module's API)

VERDICT_COLORS = {
    "bandwidth-bound": "#2b8a3e",
    "latency-bound": "#1c7ed6",
    "skew-bound": "#e03131",
    "no model": "#868e96",
}
PRESET_STYLES = ("dash", "dot", "dashdot", "longdash", "longdashdot")
PRESET_COLORS = ("#7048e8", "#f08c00", "#0c8599", "#c2255c", "#5c940d")
FIT_COLOR = "#212529"
COMPUTE_COLOR = "#4c6ef5"
COMM_WAIT_COLOR = "#ffc9c9"
COMM_COLOR = "#e03131"
COMM_UNSPLIT_COLOR = "#adb5bd"  # a call whose wait and transfer cannot be told apart (one rank of its group)
OVERLAP_COLOR = "#2f9e44"
MEMORY_COLOR = "#ae3ec9"  # memcpy/memset, in every figure that shows them
IDLE_COLOR = "#e9ecef"  # idle time, in the GPU breakdown and the critical path
FONT = dict(family="DejaVu Sans, Liberation Sans, Arial, sans-serif", size=14, color="#212529")

MAX_TIMELINE_BARS = 20000
"""Above this many bars the timeline keeps fewer steps, then a prefix of the window."""
MAX_HEATMAP_INSTANCES = 1500
"""Above this many instances the wait heatmap keeps those with the largest skew."""
MAX_TIMELINE_RANKS = 16
MAX_STEP_RANK_GROUPS = 24
"""Above this many (step, rank) groups the per-step overlap bars sum each step over its ranks."""
DEFAULT_PRESETS = {
    "nccl": ("nvlink4", "pcie4", "ib_ndr"),
    "rccl": ("nvlink4", "pcie4", "ib_ndr"),
    "gloo": ("eth25", "eth100"),
}
FALLBACK_PRESETS = ("nvlink4", "ib_ndr", "eth100")


# -- 1. data ------------------------------------------------------------------------------------


def _rows(con, sql: str, params: Sequence | None = None) -> list[dict]:
    cur = con.execute(sql, list(params or []))
    cols = [d[0] for d in cur.description]
    out = []
    for rec in cur.fetchall():
        r = {}
        for c, v in zip(cols, rec):
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            r[c] = v
        out.append(r)
    return out


def default_presets(backend: str | None, link: str | None = None, device: str | None = None) -> list[str]:
    """Preset links drawn beside the fit: ``link`` if given, else the device's intra-node preset and
    its systems' typical NIC (tracekit.model.device_presets), else a few typical of the backend."""
    if link:
        return [link]
    from tracekit.model import device_presets

    dev = device_presets(device)
    if dev is not None:
        return list(dict.fromkeys(dev))
    return list(DEFAULT_PRESETS.get((backend or "").lower(), FALLBACK_PRESETS))


def reference_presets(run: dict, ranks: Sequence[dict] = (), link: str | None = None) -> list[str]:
    """The preset links drawn beside the fit, chosen as the verdicts choose: ``link`` (``--link``)
    when given; else from the device and the topology (:func:`tracekit.model.presets_for_device`:
    the device's intra-node link, plus its systems' NIC when the ranks span several hosts); CPU
    runs (gloo) get Ethernet presets; an unknown GPU gets NVLink 4 and PCIe 4."""
    if link:
        return [link]
    device = str(run.get("device_name") or "")
    backend = str(run.get("backend") or "").lower()
    hosts = len({r.get("host") for r in ranks if r.get("host")}) or 1
    from tracekit.model import presets_for_device

    got = presets_for_device(device, backend, hosts)
    if got:
        return got
    low = device.lower()
    if backend == "gloo" or low.startswith("cpu") or (not low and backend not in ("nccl", "rccl")):
        return list(DEFAULT_PRESETS["gloo"])
    return ["nvlink4", "pcie4"] + (["ib_ndr"] if hosts > 1 else [])


def per_size_rows(by_size: Sequence[dict]) -> list[dict]:
    """The rows of ``report['by_size']`` (per op, k, locality class, benchmark run and power-of-two size
    bucket) of the ops measured at two size buckets or more (sweeps, nccl-tests runs): the page's
    per-size table."""
    buckets: dict[tuple, set] = {}
    for r in by_size:
        buckets.setdefault((r["op"], r["group_size"], r["locality"], r["bench_run"]), set()).add(r["bucket_bytes"])
    return [r for r in by_size if len(buckets[(r["op"], r["group_size"], r["locality"], r["bench_run"])]) > 1]


def run_versions(run: dict) -> list[str]:
    """``["torch 2.13.0", "NCCL 2.21.5", ...]``: the versions the trace (run row) or the run's config
    records; none when neither has them (nothing is printed for a missing one)."""
    cfg = run.get("config") if isinstance(run.get("config"), dict) else {}
    nested = cfg.get("versions") if isinstance(cfg.get("versions"), dict) else {}
    out = []
    for key, label in (("torch_version", "torch"), ("nccl_version", "NCCL"), ("cuda_version", "CUDA")):
        v = run.get(key) or cfg.get(key) or nested.get(key) or nested.get(label.lower())
        if v:
            out.append(f"{label} {v}")
    return out


def html_data(
    store: Store | str | os.PathLike | None = None,
    run_id: str | None = None,
    link: str | None = None,
    presets: Sequence[str] | None = None,
    steps: int = 2,
    report: dict | None = None,
    con=None,
) -> dict[str, Any]:
    """Everything the HTML page draws, as plain data (ns, bytes, GB/s).

    Keys: ``report`` (:func:`tracekit.report.data.build_report`), ``bandwidth`` (one row per
    collective instance with size, sync time, busbw, verdict), ``curves``
    (:func:`model_curves`), ``timeline`` (:func:`_timeline`), ``waits`` (rank × instance wait
    matrix), ``presets`` (the preset links drawn). ``steps``: how many profiler steps the
    timeline shows (the first ones); ``report``: an already built report of the run (saves
    building it again; ``run_id`` and ``link`` are then taken from it); ``con``: the connection
    that report was built on (:func:`tracekit.report.data.report_connection`; kept open), so that
    no analysis is built twice. Raises StoreError for an empty store or unknown run, ValueError
    for a report built without its path strips (``build_report(strips=False)``: the terminal's).
    """
    from tracekit.report.data import build_report, report_connection

    if report is not None:
        if (report.get("critical_path") or {}).get("paths", []) is None:
            raise ValueError("the report was built with strips=False (for the terminal): the page draws the "
                             "critical path's strips; build it with strips=True")
        link = report.get("link")
        run_id = report["run"]["run_id"]
    own = con is None
    if own:
        run_id, con = report_connection(store, run_id, link)
        from tracekit.report.data import apply_reference_options

        # the same reference options as the report, so that every verdict has the same reference
        apply_reference_options(con, **((report or {}).get("reference_options") or {}))
    try:
        if report is None:
            report = build_report(store, run_id, link, con=con)
        rid = report["run"]["run_id"]
        bandwidth = _rows(
            con,
            """
            SELECT b.pg_name, b.seq, b.op, b.size_bytes, b.group_size, b.sync_time_ns, b.algbw_gbps, b.busbw_gbps,
                   v.verdict, v.verdict_basis, v.reference, v.efficiency, v.efficiency_link, v.crossover_bytes,
                   v.predicted_ns, i.skew_ns, i.straggler
            FROM collective_bandwidth b
            JOIN collective_instances i USING (run_id, pg_name, win, seq)
            LEFT JOIN collective_verdicts v USING (run_id, pg_name, win, seq)
            WHERE b.run_id = ? AND b.busbw_gbps IS NOT NULL AND b.size_bytes > 0
            ORDER BY b.op, b.size_bytes, b.pg_name, b.win, b.seq
            """,
            [rid],
        )
        fit = _rows(con, "SELECT * FROM alpha_beta_fit WHERE run_id = ? ORDER BY op, group_size", [rid])
        timeline = _timeline(con, rid, steps)
        waits = _wait_matrix(con, rid)
    finally:
        if own:
            con.close()
    names = list(presets) if presets is not None else reference_presets(report["run"], report["ranks"], link)
    if presets is None:  # the presets the verdicts were judged against are drawn too (first)
        from tracekit.errors import BadInputError
        from tracekit.model import link_from_preset

        for r in report.get("references") or []:
            ref = r.get("reference")
            if r.get("kind") == "preset" and ref and ref not in names:
                try:
                    link_from_preset(ref)
                except (BadInputError, KeyError, ValueError):
                    continue  # a shared NIC ("ib_ndr (1 NIC/2 GPUs)"): not a preset name
                names.insert(0, ref)
    return dict(
        report=report,
        bandwidth=bandwidth,
        curves=model_curves(bandwidth, fit, names),
        fit=fit,
        timeline=timeline,
        waits=waits,
        presets=names,
    )


def _log_grid(lo: float, hi: float, points: int = 80) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (points - 1)) for i in range(points)]


def model_curves(bandwidth: Sequence[dict], fit: Sequence[dict], presets: Sequence[str]) -> list[dict]:
    """Predicted bus bandwidth vs size, per op: the run's α–β fit and each preset link.

    Every number comes from :mod:`tracekit.model`: the time from ``predict_collective`` (the
    fit's algorithm for fitted curves, the op's default algorithm for presets), the bus bandwidth
    from ``busbw``, n½ from the link (α·β). Sizes span the measured ones (and each n½) with a
    margin. Returns dicts: op, group_size, kind ('fit' / 'preset'), name, algo, sizes_bytes,
    busbw_gbps, n_half_bytes, n_half_busbw_gbps, alpha_s, beta_gbps.
    Ops the model has no algorithm for (reduce, gather, scatter, barrier) get no curve.
    """
    from tracekit.errors import TracekitError
    from tracekit.model import busbw, custom_link, link_from_preset, predict_collective

    by_op: dict[str, list[dict]] = {}
    for r in bandwidth:
        by_op.setdefault(r["op"], []).append(r)
    links = []
    for name in presets:
        try:
            links.append(link_from_preset(name))
        except TracekitError:
            continue
    out = []

    def curve(op, k, lnk, algo, kind, sizes):
        ys = []
        try:
            for s in sizes:
                p = predict_collective(op, s, k, lnk, algo=algo)
                ys.append(busbw(op, s, p.time_s, k))
            nh = lnk.n_half_bytes
            pn = predict_collective(op, nh, k, lnk, algo=algo) if nh > 0 else None
            nh_bw = busbw(op, nh, pn.time_s, k) if pn is not None and pn.time_s > 0 else None
            used_algo = p.algo
            ds = p.crossover_bytes
            pd = predict_collective(op, ds, k, lnk, algo=algo) if ds else None
            ds_bw = busbw(op, ds, pd.time_s, k) if pd is not None and pd.time_s > 0 else None
        except TracekitError:
            return None
        return dict(
            op=op, group_size=k, kind=kind, name=lnk.name, algo=used_algo, sizes_bytes=list(sizes), busbw_gbps=ys,
            n_half_bytes=nh, n_half_busbw_gbps=nh_bw, crossover_bytes=ds, crossover_busbw_gbps=ds_bw,
            fixed_latency_s=p.fixed_latency_s, alpha_s=lnk.alpha_s, beta_gbps=lnk.beta_Bps / 1e9,
        )

    for op, rows in by_op.items():
        counts: dict[int, int] = {}
        for r in rows:
            counts[r["group_size"]] = counts.get(r["group_size"], 0) + 1
        k_main = max(counts, key=lambda k: (counts[k], k))
        fits = [f for f in fit if f["op"] == op and f["status"] == "ok" and f["alpha_s"] is not None
                and f.get("scope", "group") == "group"]
        fit_links = []
        for f in fits:  # one line per group's fit: "fit", or "fit <group>" where several groups have one
            try:
                fit_links.append((f, custom_link(f["alpha_s"], f["beta_Bps"],
                                                 name="fit" if len(fits) == 1 else f"fit {f.get('pg_name')}")))
            except TracekitError:
                continue
        marks = [r["size_bytes"] for r in rows]
        # each line's D* (k·n½ for rings on k ranks) must be on the plot
        marks += [k_main * lk.n_half_bytes for _, lk in fit_links if lk.n_half_bytes > 0]
        marks += [k_main * lk.n_half_bytes for lk in links if lk.n_half_bytes > 0]
        lo = max(1.0, 10 ** math.floor(math.log10(min(marks) / 2)))
        hi = 10 ** math.ceil(math.log10(max(marks) * 2))
        sizes = _log_grid(lo, hi)
        for f, lk in fit_links:
            c = curve(op, f["group_size"], lk, f["algo"], "fit", sizes)
            if c is not None:
                out.append(c)
        if k_main < 2 and op not in ("send", "recv"):
            continue
        for lk in links:
            c = curve(op, k_main, lk, None, "preset", sizes)
            if c is not None:
                out.append(c)
    return out


def _pick_steps(con, run_id: str, steps: int) -> list[int]:
    have = [r[0] for r in con.execute(
        "SELECT DISTINCT step FROM overlap_by_step WHERE run_id = ? ORDER BY step", [run_id]).fetchall()]
    return have[: max(1, steps)] if have else []


def _timeline(con, run_id: str, steps: int) -> dict[str, Any]:
    """Bars for the per-rank timeline of the first ``steps`` profiler steps (whole trace without steps).

    Returns: steps (list; empty = whole trace), t0_ns (window start), t1_ns, ranks (shown),
    compute / overlap (lists of {rank, s, e} islands, ns), comm (one per call: rank, s, e,
    last_arrival_ns, wait_ns, op, size_bytes, instance, verdict, sync_time_ns; op None for
    unattributed spans), note (why something was left out, or '').
    """
    chosen = _pick_steps(con, run_id, steps)
    note = ""
    ranks = [r[0] for r in con.execute("SELECT rank FROM ranks WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    if len(ranks) > MAX_TIMELINE_RANKS:
        note = f"showing ranks {ranks[0]}–{ranks[MAX_TIMELINE_RANKS - 1]} of {len(ranks)}"
        ranks = ranks[:MAX_TIMELINE_RANKS]

    def load(step_list):
        grps = step_list or [-1]
        gl = ", ".join(str(int(g)) for g in grps)
        rl = ", ".join(str(int(r)) for r in ranks) or "NULL"
        # the islands of the shown ranks and windows only: merge_intervals and intersect_islands work
        # per (run, rank, window), so filtering their spans first gives the same islands, while a
        # filter on the islands views is applied after computing every rank's (DuckDB does not push
        # it through their windows)
        where = f"run_id = '{run_id.replace(chr(39), chr(39) * 2)}' AND grp IN ({gl}) AND rank IN ({rl})"
        for kind in ("comm", "compute"):
            con.execute(f"CREATE OR REPLACE TEMP VIEW __tl_{kind}_spans AS SELECT * FROM _{kind}_spans WHERE {where}")
            con.execute(f"CREATE OR REPLACE TEMP TABLE __tl_{kind}_islands AS "
                        f"SELECT * FROM merge_intervals('__tl_{kind}_spans')")
        isl = {}
        for name, rel in (("compute_islands", "__tl_compute_islands"),
                          ("overlap_islands", "intersect_islands('__tl_comm_islands', '__tl_compute_islands')")):
            isl[name] = _rows(
                con, f"SELECT rank, min(s) AS s, max(e) AS e FROM (SELECT rank, s, e FROM {rel}) GROUP BY rank, s ORDER BY rank, s")
        step_filter = "" if not step_list else f"AND e.step IN ({gl})"
        comm = _rows(
            con,
            f"""
            SELECT e.rank, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e, e.name,
                   c.op, c.size_bytes, c.pg_name, c.seq,
                   -- the last arrival only where it is one: two or more ranks of the group recorded
                   -- the instance (skew_ns not NULL) and their calls match
                   CASE WHEN i.skew_ns IS NOT NULL AND NOT i.mismatched THEN i.last_arrival_ns END AS last_arrival_ns,
                   w.wait_ns, i.sync_time_ns,
                   i.straggler, v.verdict
            FROM events e
            LEFT JOIN collectives c ON c.run_id = e.run_id AND c.rank = e.rank AND c.event_id = e.event_id
            -- the call's profiler window (instance key (pg, win, seq)); a copy of a span the matching
            -- dropped has none: drawn without an instance's values
            LEFT JOIN __instance_calls ic ON ic.run_id = c.run_id AND ic.rank = c.rank AND ic.event_id = c.event_id
            LEFT JOIN collective_instances i ON i.run_id = c.run_id AND i.pg_name = c.pg_name
                                            AND i.win = ic.win AND i.seq = c.seq
            LEFT JOIN collective_waits w ON w.run_id = c.run_id AND w.rank = c.rank AND w.event_id = c.event_id
            LEFT JOIN collective_verdicts v ON v.run_id = c.run_id AND v.pg_name = c.pg_name
                                           AND v.win = ic.win AND v.seq = c.seq
            WHERE e.run_id = ? AND e.class = 'comm' AND e.rank IN ({rl}) {step_filter}
            ORDER BY e.rank, e.ts_ns
            """,
            [run_id],
        )
        return isl["compute_islands"], isl["overlap_islands"], comm

    compute, overlap, comm = load(chosen)
    if len(compute) + len(overlap) + 2 * len(comm) > MAX_TIMELINE_BARS and len(chosen) > 1:
        chosen = chosen[:1]
        compute, overlap, comm = load(chosen)
    spans = [(x["s"], x["e"]) for x in compute + comm]
    if not spans:
        return dict(steps=chosen, t0_ns=0, t1_ns=0, ranks=ranks, compute=[], overlap=[], comm=[], note=note)
    t0 = min(s for s, _ in spans)
    t1 = max(e for _, e in spans)
    total = len(compute) + len(overlap) + 2 * len(comm)
    if total > MAX_TIMELINE_BARS:
        starts = sorted(s for s, _ in spans)
        cut = starts[int(len(starts) * MAX_TIMELINE_BARS / total) - 1]
        compute = [x for x in compute if x["s"] <= cut]
        overlap = [x for x in overlap if x["s"] <= cut]
        comm = [x for x in comm if x["s"] <= cut]
        t1 = max(x["e"] for x in compute + comm)
        note = (note + "; " if note else "") + f"window cut to its first {(t1 - t0) / 1e6:,.1f} ms (too many bars)"
    for x in comm:
        x["instance"] = None if x["op"] is None or x["seq"] is None else f"{x['pg_name']}:{x['seq']}"
    return dict(steps=chosen, t0_ns=t0, t1_ns=t1, ranks=ranks, compute=compute, overlap=overlap, comm=comm, note=note)


def _wait_matrix(con, run_id: str) -> dict[str, Any]:
    """Wait per rank and instance: instances (in order of last arrival), ranks, wait_ns[rank][instance]."""
    inst = _rows(
        con,
        """
        SELECT pg_name, win, seq, op, size_bytes, group_size, last_arrival_ns, skew_ns, sync_time_ns, straggler
        FROM collective_instances WHERE run_id = ? AND ranks_seen > 1
        ORDER BY last_arrival_ns, pg_name, win, seq
        """,
        [run_id],
    )
    note = ""
    if len(inst) > MAX_HEATMAP_INSTANCES:
        keep = sorted(inst, key=lambda r: -(r["skew_ns"] or 0))[:MAX_HEATMAP_INSTANCES]
        keys = {(r["pg_name"], r["win"], r["seq"]) for r in keep}
        note = f"the {MAX_HEATMAP_INSTANCES} instances with the largest skew of {len(inst)}"
        inst = [r for r in inst if (r["pg_name"], r["win"], r["seq"]) in keys]
    index = {(r["pg_name"], r["win"], r["seq"]): j for j, r in enumerate(inst)}
    ranks = [r[0] for r in con.execute("SELECT rank FROM ranks WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    row_of = {r: i for i, r in enumerate(ranks)}
    wait: list[list[float | None]] = [[None] * len(inst) for _ in ranks]
    for pg, win, seq, rank, w in con.execute(
        "SELECT pg_name, win, seq, rank, wait_ns FROM collective_waits WHERE run_id = ?", [run_id]
    ).fetchall():
        j = index.get((pg, win, seq))
        i = row_of.get(rank)
        if j is not None and i is not None:
            wait[i][j] = w
    for r in inst:
        del r["win"]  # the key's window: not shown
        r["instance"] = f"{r['pg_name']}:{r['seq']}"
    return dict(instances=inst, ranks=ranks, wait_ns=wait, note=note)


# -- formatting (the number helpers are tracekit.report.textfmt's) ----------------------------------------


def _time_unit(span_ns: float) -> tuple[str, float]:
    """('ms', 1e6) for spans over 5 ms, else ('µs', 1e3)."""
    return ("ms", 1e6) if span_ns > 5e6 else ("µs", 1e3)


# -- 2. figures ---------------------------------------------------------------------------------


def _layout(fig, title: str, height: int, **kw) -> None:
    """The page's title, font, height and margins on ``fig``, and the empty template ``"none"``: the
    page's template, plotly_white, goes into the figure's dict where it is written
    (:func:`_white_template`), not through plotly's validation (a copy of it per figure)."""
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=18)),
        font=FONT,
        height=height,
        template="none",
        margin=dict(l=90, r=30, t=80, b=70),
        hoverlabel=dict(font_size=13),
        **kw,
    )


TITLE_TOP_PX, LEGEND_TOP_PX = 20, 56
"""Where the title and a legend under it start, in px from the figure's top (:func:`_legend_under_title`)."""


def _legend_under_title(fig, height: int, top: int) -> None:
    """A horizontal legend on its own band under the figure's (left-aligned) title, left-aligned, and
    a top margin of ``top`` px holding title, legend and panel titles. A legend at the top right was
    drawn over a long title at 1,000 px (tests/report/test_html_overlaps.py). :func:`_wrap_figure_title`
    moves the band down when the title wraps."""
    fig.update_layout(legend=dict(orientation="h", yref="container", y=1 - LEGEND_TOP_PX / height, yanchor="top",
                                  x=0, xanchor="left"), margin=dict(t=top),
                      title=dict(yref="container", y=1 - TITLE_TOP_PX / height, yanchor="top"))  # not mid-margin


def bandwidth_figure(data: dict):
    """Bus bandwidth vs message size per op (log–log): instances by verdict, fit and preset curves, n½.
    Returns the figure as a dict (:func:`figure_dict`, its title wrapped), or None without instances."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ops = sorted({r["op"] for r in data["bandwidth"]})
    if not ops:
        return None
    cols = min(len(ops), 2)
    nrows = math.ceil(len(ops) / cols)
    fig = make_subplots(
        rows=nrows, cols=cols, subplot_titles=[o.replace("_", "-") for o in ops],
        horizontal_spacing=0.1, vertical_spacing=0.16 if nrows > 1 else 0.1,
    )
    shown = set()
    preset_style = {name: i for i, name in enumerate(data["presets"])}
    # one dot per instance: plotly would validate and copy every one, so each measured trace is built
    # on its first dot and gets all of them in the figure's plain dict (figure_dict), written
    # unvalidated: the same page
    cells: dict[int, dict] = {}
    for n, op in enumerate(ops):
        row, col = n // cols + 1, n % cols + 1
        pts = [r for r in data["bandwidth"] if r["op"] == op]
        for verdict in ("bandwidth-bound", "latency-bound", "skew-bound", "no model"):
            sel = [r for r in pts if (r["verdict"] or "no model") == verdict]
            if not sel:
                continue
            dots = dict(x=[r["size_bytes"] for r in sel], y=[r["busbw_gbps"] for r in sel], customdata=[[
                f"{r['pg_name']}:{r['seq']}", fmt_bytes(r["size_bytes"]), fmt_us(r["sync_time_ns"]),
                fmt_us(r["predicted_ns"]), fmt_num(r["efficiency"]), fmt_us(r["skew_ns"]), r["group_size"],
            ] for r in sel])
            cells[len(fig.data)] = dots
            fig.add_trace(
                go.Scatter(
                    x=dots["x"][:1], y=dots["y"][:1], mode="markers",
                    name=f"measured: {verdict}", legendgroup=f"v-{verdict}", showlegend=verdict not in shown,
                    marker=dict(color=VERDICT_COLORS[verdict], size=10, line=dict(color="white", width=1)),
                    customdata=dots["customdata"][:1],
                    hovertemplate=(
                        "<b>%{customdata[0]}</b> " + op + " (k=%{customdata[6]})<br>size %{customdata[1]}"
                        "<br>busbw %{y:.3g} GB/s<br>sync %{customdata[2]} µs, model %{customdata[3]} µs"
                        "<br>efficiency %{customdata[4]}<br>skew %{customdata[5]} µs<br>" + verdict + "<extra></extra>"
                    ),
                ),
                row=row, col=col,
            )
            shown.add(verdict)
        for c in (c for c in data["curves"] if c["op"] == op):
            if c["kind"] == "fit":
                label = f"α–β fit (α {c['alpha_s'] * 1e6:.3g} µs, β {c['beta_gbps']:.3g} GB/s)"
                line = dict(color=FIT_COLOR, width=3)
                group = f"fit-{op}-{c['group_size']}"
                showleg = True
            else:
                i = preset_style.get(c["name"], 0)
                label = f"{c['name']} preset ({c['algo']})"
                line = dict(color=PRESET_COLORS[i % len(PRESET_COLORS)], width=2, dash=PRESET_STYLES[i % len(PRESET_STYLES)])
                group = f"preset-{c['name']}"
                showleg = group not in shown
                shown.add(group)
            fig.add_trace(
                go.Scatter(
                    x=c["sizes_bytes"], y=c["busbw_gbps"], mode="lines", name=label if c["kind"] == "preset" else f"{op}: {label}",
                    legendgroup=group, showlegend=showleg, line=line,
                    hovertemplate=f"{label}<br>size %{{x:.3s}}B<br>busbw %{{y:.3g}} GB/s<extra></extra>",
                ),
                row=row, col=col,
            )
            if c.get("crossover_bytes") and c.get("crossover_busbw_gbps"):
                fig.add_trace(
                    go.Scatter(
                        x=[c["crossover_bytes"]], y=[c["crossover_busbw_gbps"]], mode="markers",
                        marker=dict(symbol="diamond", size=11, color=line["color"], line=dict(color="white", width=1)),
                        name="D* (α term = β term)", legendgroup=group, showlegend=False,
                        hovertemplate=(f"{op} on k={c['group_size']} over {c['name']}: boundary D* = "
                                       f"{fmt_bytes(c['crossover_bytes'])} (α term = β term); the link's n½ = α·β = "
                                       f"{fmt_bytes(c['n_half_bytes'])}; fixed latency "
                                       f"{fmt_num(c['fixed_latency_s'] * 1e6)} µs<extra></extra>"),
                    ),
                    row=row, col=col,
                )
            if c["kind"] == "fit" and c.get("crossover_bytes"):
                # shapes take data values on a log axis, annotations take log10 of them
                xref = "x" if n == 0 else f"x{n + 1}"
                yref = "y domain" if n == 0 else f"y{n + 1} domain"
                fig.add_shape(type="line", x0=c["crossover_bytes"], x1=c["crossover_bytes"], y0=0, y1=1, xref=xref,
                              yref=yref, line=dict(color=FIT_COLOR, dash="dot", width=1.5))
                # on the side of the dotted line with more room, in two short lines: never over the
                # neighbouring panel's axis title (tests/report/test_html_overlaps.py)
                sizes = [r["size_bytes"] for r in pts if r["size_bytes"]] + list(c["sizes_bytes"])
                mid = (math.log10(min(sizes)) + math.log10(max(sizes))) / 2 if sizes else 0
                right = math.log10(c["crossover_bytes"]) > mid
                fig.add_annotation(x=math.log10(c["crossover_bytes"]), y=0.02, xref=xref, yref=yref, yanchor="bottom",
                                   xanchor="right" if right else "left", xshift=-4 if right else 4, align="left",
                                   text=(f"fit D* = {fmt_bytes(c['crossover_bytes'])}<br>(link n½ "
                                         f"{fmt_bytes(c['n_half_bytes'])})"), showarrow=False,
                                   font=dict(size=13), bgcolor="rgba(255,255,255,0.85)")
        # the tick labels stand off the axes (the lowest y label and the first x label met at the
        # corner); the y title on the left column only: in the right column it was drawn over the
        # left panel (the same quantity, one title per row)
        fig.update_xaxes(type="log", exponentformat="SI", dtick=1, title_text="message size S (bytes; k = 10³, M = 10⁶)",
                         row=row, col=col, showline=True, linecolor="#adb5bd", ticklabelstandoff=6)
        fig.update_yaxes(type="log", exponentformat="power", dtick=1,
                         title_text="bus bandwidth (GB/s, GB = 10⁹ B)" if col == 1 else None,
                         row=row, col=col, showline=True, linecolor="#adb5bd", ticklabelstandoff=6)
    _layout(
        fig, "Bus bandwidth vs message size (measured instances by verdict; α–β fit and preset links from the model)",
        height=430 * nrows + 190,
        # below the x-axis titles: 80 px under the plot area (paper coordinates are the plot area)
        legend=dict(orientation="h", yanchor="top", y=-80 / (430 * nrows + 190 - 170 - 110), x=0, font=dict(size=13)),
    )
    fig.update_layout(margin=dict(b=170, t=110))
    _wrap_figure_title(fig)  # as _figure_html does for a go.Figure
    return figure_dict(fig, cells)


def timeline_figure(data: dict):
    """Per-rank timeline: compute, communication (waiting, then transfer) and their overlap. Returns
    the figure as a dict (:func:`figure_dict`, its title wrapped), or None without bars."""
    import plotly.graph_objects as go

    tl = data["timeline"]
    if not tl["ranks"] or tl["t1_ns"] <= tl["t0_ns"]:
        return None
    unit, f = _time_unit(tl["t1_ns"] - tl["t0_ns"])
    t0 = tl["t0_ns"]
    lanes = []
    for r in tl["ranks"]:
        lanes += [f"rank {r} · compute", f"rank {r} · comm", f"rank {r} · overlap"]
    fig = go.Figure()
    # one bar per island and call: each trace is built on its first bar and gets all of them in the
    # figure's plain dict (figure_dict), written unvalidated, as bandwidth_figure does: the same page
    cells: dict[int, dict] = {}

    def bars(items, lane_of, color, name, width, hover, custom=None, text=None, **kw):
        if not items:
            return
        full = dict(base=[(x["s"] - t0) / f for x in items], x=[max(x["e"] - x["s"], 0) / f for x in items],
                    y=[lane_of(x) for x in items])
        if custom is not None:
            full["customdata"] = custom
        if text is not None:
            full["text"] = text
        cells[len(fig.data)] = full
        fig.add_trace(
            go.Bar(**kw,
                base=full["base"][:1], x=full["x"][:1],
                y=full["y"][:1], orientation="h", name=name, marker=dict(color=color, line=dict(width=0)),
                width=width, customdata=None if custom is None else custom[:1], hovertemplate=hover,
                text=None if text is None else text[:1], textposition="inside" if text else None,
                insidetextanchor="start", textfont=dict(size=12, color="#212529"), cliponaxis=True,
            )
        )

    bars(tl["compute"], lambda x: f"rank {x['rank']} · compute", COMPUTE_COLOR, "compute", 0.7,
         f"compute %{{base:,.1f}}–%{{customdata[0]:,.1f}} {unit}<extra></extra>",
         custom=[[(x["e"] - t0) / f] for x in tl["compute"]])
    calls = tl["comm"]
    hover_call = (
        "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>size %{customdata[2]}<br>wait %{customdata[3]} µs"
        "<br>sync %{customdata[4]} µs<br>verdict %{customdata[5]}<br>straggler rank %{customdata[6]}<extra></extra>"
    )
    custom = [[
        x["instance"] or "unattributed comm", x["op"] or (x["name"] or "")[:60], fmt_bytes(x["size_bytes"]),
        fmt_us(x["wait_ns"]), fmt_us(x["sync_time_ns"]), x["verdict"] or "—",
        "—" if x["straggler"] is None else x["straggler"],
    ] for x in calls]
    text = [("" if x["op"] is None else f"{x['op']} {fmt_bytes(x['size_bytes'])}") for x in calls]
    lane = lambda x: f"rank {x['rank']} · comm"  # noqa: E731
    # waiting vs transfer only where the last arrival is known; a call of which one rank of its group
    # was recorded (or an unattributed span) is drawn whole in grey: the split cannot be measured
    split = [x for x in calls if x["last_arrival_ns"] is not None]
    unsplit = [x for x in calls if x["last_arrival_ns"] is None]
    bars(split, lane, COMM_WAIT_COLOR, "comm: waiting for the last rank", 0.7, None, hoverinfo="skip")
    xfer = [{"rank": x["rank"], "s": max(x["s"], min(x["e"], x["last_arrival_ns"])), "e": x["e"]} for x in split]
    bars(xfer, lane, COMM_COLOR, "comm: transfer (after last arrival)", 0.7, None, hoverinfo="skip")
    bars(unsplit, lane, COMM_UNSPLIT_COLOR, "comm: wait and transfer not separable (fewer than two ranks of the group)",
         0.7, None, hoverinfo="skip")
    # on top: the whole call, transparent, carrying the label and the hover text
    bars(calls, lane, "rgba(0,0,0,0)", "collective", 0.7, hover_call, custom=custom, text=text, showlegend=False)
    bars(tl["overlap"], lambda x: f"rank {x['rank']} · overlap", OVERLAP_COLOR, "overlap (comm ∩ compute)", 0.7,
         f"overlap %{{base:,.1f}}–%{{customdata[0]:,.1f}} {unit}<extra></extra>",
         custom=[[(x["e"] - t0) / f] for x in tl["overlap"]])
    steps = tl["steps"]
    what = (("step " if len(steps) == 1 else "steps ") + ", ".join(str(s) for s in steps)) if steps else "whole trace"
    title = f"Timeline per rank ({what}; hover a collective for op, size and wait)"
    if tl["note"]:
        title += f"<br><sup>{html.escape(tl['note'])}</sup>"
    height = max(360, 26 * len(lanes) + 190)
    _layout(fig, title, height=height, barmode="overlay", uniformtext=dict(minsize=10, mode="hide"))
    _legend_under_title(fig, height, 105)  # at the top right it met a long title (tests/report/test_html_overlaps.py)
    fig.update_layout(legend_font_size=13)
    order = list(reversed(lanes))
    fig.update_yaxes(categoryorder="array", categoryarray=order, title_text="", tickfont=dict(size=13),
                     range=[-0.5, len(order) - 0.5])
    for i, r in enumerate(tl["ranks"]):
        if i % 2:  # a light band behind every other rank's three lanes
            top = order.index(f"rank {r} · compute")
            fig.add_shape(type="rect", xref="x domain", x0=0, x1=1, yref="y", y0=top - 2.5, y1=top + 0.5,
                          fillcolor="#f1f3f5", line=dict(width=0), layer="below")
    fig.update_xaxes(title_text=f"time since the window start ({unit}; t = 0 at {t0 / 1e9:.6f} s on the run clock)",
                     range=[0, (tl["t1_ns"] - t0) / f], showgrid=True, zeroline=False)
    _wrap_figure_title(fig)  # as _figure_html does for a go.Figure
    return figure_dict(fig, cells)


def overlap_figure(data: dict):
    """Communication, overlap and exposed communication per rank (whole trace) and per step."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rep = data["report"]
    by_rank = rep["overlap_by_rank"]
    by_step = rep["overlap_by_step"]
    if not by_rank:
        return None
    peak = max([r["comm_ns"] or 0 for r in by_rank] + [1])
    unit, f = _time_unit(peak)
    series = (("comm_ns", "comm", COMM_COLOR), ("overlap_ns", "overlap (hidden by compute)", OVERLAP_COLOR),
              ("exposed_comm_ns", "exposed comm", "#f59f00"))
    cols = 2 if by_step else 1
    fig = make_subplots(
        rows=1, cols=cols, horizontal_spacing=0.08, column_widths=[0.45, 0.55] if cols == 2 else None,
        subplot_titles=["per rank (whole trace)"] + (["per profiler step and rank"] if by_step else []),
    )

    def add(rows, x, col, showlegend):
        for key, name, color in series:
            fig.add_trace(
                go.Bar(
                    x=x, y=[(r[key] or 0) / f for r in rows], name=name, legendgroup=key, showlegend=showlegend,
                    marker_color=color,
                    customdata=[[fmt_pct(r["overlap_ratio"]), fmt_ms(r["compute_ns"])] for r in rows],
                    hovertemplate=(name + ": %{y:,.2f} " + unit + "<br>overlap ratio %{customdata[0]}"
                                   "<br>compute %{customdata[1]} ms<extra></extra>"),
                ),
                row=1, col=col,
            )

    add(by_rank, [f"rank {r['rank']}" for r in by_rank], 1, True)
    if by_step and len(by_step) <= MAX_STEP_RANK_GROUPS:
        add(by_step, [[f"step {r['step']}" for r in by_step], [f"r{r['rank']}" for r in by_step]], 2, False)
    elif by_step:  # too many (step, rank) groups to read: sum each step over its ranks
        sums: dict[int, dict] = {}
        for r in by_step:
            t = sums.setdefault(r["step"], {"comm_ns": 0, "overlap_ns": 0, "exposed_comm_ns": 0, "compute_ns": 0})
            for k in t:
                t[k] += r[k] or 0
        rows = []
        for step in sorted(sums):
            t = sums[step]
            rows.append(dict(t, step=step, overlap_ratio=t["overlap_ns"] / t["comm_ns"] if t["comm_ns"] else None))
        add(rows, [str(r["step"]) for r in rows], 2, False)
        fig.layout.annotations[1].text = "per profiler step (sum over ranks)"
        fig.update_xaxes(title_text="profiler step", type="category", row=1, col=2)
    _layout(fig, "Communication hidden by compute: comm, overlap and exposed comm", height=500, barmode="group")
    _legend_under_title(fig, 500, 150)
    fig.update_yaxes(title_text=f"time ({unit})", row=1, col=1)
    return fig


def wait_heatmap(data: dict):
    """Rank × collective instance heatmap of wait time (µs); × marks the straggler (last arrival).
    Returns the figure as a dict (:func:`figure_dict`), or None without instances."""
    import plotly.graph_objects as go

    w = data["waits"]
    if not w["instances"]:
        return None
    inst = w["instances"]
    xs = list(range(len(inst)))
    z = [[None if v is None else v / 1e3 for v in row] for row in w["wait_ns"]]
    per_instance = [[i["instance"], i["op"], fmt_bytes(i["size_bytes"]), fmt_us(i["skew_ns"]), i["straggler"]]
                    for i in inst]
    custom = [per_instance for _ in w["ranks"]]
    # rank × instance cells (at 1,024 ranks 1,024 × 1,500 × 6 values): plotly's validation and
    # to_dict copy of them dominated the whole analyze (benchmarks/README.md), so the figure is
    # built with one-cell stand-ins and the cells put into its plain dict (figure_dict), which
    # _figure_html writes unvalidated: the same page
    fig = go.Figure(
        go.Heatmap(
            z=[[0.0]], x=xs, y=[f"rank {r}" for r in w["ranks"]], colorscale="YlOrRd", zmin=0,
            colorbar=dict(title=dict(text="wait (µs)", side="right")), customdata=[per_instance[:1]], xgap=1, ygap=1,
            hovertemplate=("%{y}, instance <b>%{customdata[0]}</b> (%{customdata[1]}, %{customdata[2]})"
                           "<br>waited %{z:,.1f} µs for the last rank<br>straggler: rank %{customdata[4]}"
                           "<br>skew %{customdata[3]} µs<extra></extra>"),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=xs, y=[f"rank {i['straggler']}" for i in inst], mode="markers", name="straggler (arrived last)",
            marker=dict(symbol="x-thin", size=9 if len(inst) <= 40 else 6, line=dict(width=2 if len(inst) <= 40 else 1.5,
                        color="#212529")), hoverinfo="skip",
        )
    )
    many = len(inst) > 12
    step = max(1, math.ceil(len(inst) / 24))
    tickvals = xs[::step]
    ticktext = [inst[i]["instance"] if many else f"{inst[i]['instance']}<br>{inst[i]['op'].replace('_', '-')}"
                for i in tickvals]
    title = "Wait for the last rank, per rank and collective instance (in order of last arrival)"
    if w["note"]:
        title += f"<br><sup>{html.escape(w['note'])}</sup>"
    _layout(fig, title, height=max(340, 34 * len(w["ranks"]) + 220),
            legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"))
    fig.update_xaxes(tickvals=tickvals, ticktext=ticktext, tickangle=-45 if many else 0, showgrid=False,
                     title_text="collective instance (process group:seq" + (")" if many else ", op)"),
                     tickfont=dict(size=12))
    fig.update_yaxes(autorange="reversed", showgrid=False)
    # the cells' JSON is written row by row by _figure_html (a rank's hover row, the same for every
    # rank, once): the page is the same, without plotly encoding every cell as one document
    return spliced_figure(figure_dict(fig, {0: dict(z=_SPLICE.format(0), customdata=_SPLICE.format(1))}),
                          {_SPLICE.format(0): z, _SPLICE.format(1): custom})


def figure_dict(fig, cells: dict[int, dict]) -> dict:
    """``fig.to_dict()`` with trace i's keys replaced by ``cells[i]`` (each key present in the trace
    already, so the JSON keeps plotly's key order): large arrays of plain numbers, strings and None
    that need no validation. :func:`_figure_html` writes the dict as plotly writes the figure."""
    d = fig.to_dict()
    for i, keys in cells.items():
        assert keys.keys() <= d["data"][i].keys(), "a replaced key must exist in the validated trace"
        d["data"][i].update(keys)
    return d


_SPLICE = "__tracekit_rows_{}__"
"""The placeholder a :func:`spliced_figure` dict holds in place of an array."""


class SplicedFigure(dict):
    """A figure dict (:func:`figure_dict`) with placeholders (``splices``: placeholder → list of rows)
    that :func:`_figure_html` replaces by the rows' JSON in the written page."""

    splices: dict[str, list]


def spliced_figure(d: dict, splices: dict[str, list]) -> SplicedFigure:
    """``d`` (holding each key of ``splices`` as a string value) as a :class:`SplicedFigure`."""
    out = SplicedFigure(d)
    out.splices = splices
    return out


def _splice_rows(page: str, splices: dict[str, list]) -> str:
    """``page`` with each placeholder's JSON string replaced by its rows' JSON array, each row
    encoded by plotly's own encoder (``plotly.io.json.to_json_plotly``, the one ``to_html`` uses: a
    JSON array is its rows' JSON joined by commas, the same text), a row object repeated in the list
    encoded once. Raises AssertionError unless each placeholder occurs once."""
    from plotly.io.json import to_json_plotly

    for token, rows in splices.items():
        quoted = to_json_plotly(token)
        assert page.count(quoted) == 1, f"placeholder {token} not once in the page"
        done: dict[int, str] = {}
        parts = []
        for row in rows:
            text = done.get(id(row))
            if text is None:
                text = done[id(row)] = to_json_plotly(row)
            parts.append(text)
        page = page.replace(quoted, "[" + ",".join(parts) + "]")
    return page


# -- tables -------------------------------------------------------------------------------------



GPU_BREAKDOWN_SERIES = (
    # (key, legend, colour): the parts of gpu_time_breakdown that sum to the window, idle by class
    ("compute_only_ns", "compute only", COMPUTE_COLOR),
    ("comm_hidden_ns", "comm hidden by compute", OVERLAP_COLOR),
    ("comm_exposed_ns", "comm exposed", COMM_COLOR),
    ("memory_ns", "memcpy/memset", MEMORY_COLOR),
    ("sync_ns", "sync", "#495057"),
    ("other_ns", "other GPU", "#adb5bd"),
    ("idle_host_wait_ns", "idle: host wait", "#ffd43b"),
    ("idle_kernel_wait_ns", "idle: kernel wait", "#ffe8cc"),
    ("idle_other_ns", "idle: other", IDLE_COLOR),
)


def gpu_breakdown_figure(data: dict):
    """Stacked bars of each rank's GPU window (whole trace, and per profiler step when at most
    MAX_STEP_RANK_GROUPS (step, rank) pairs): the parts of ``gpu_time_breakdown``, idle split into
    HTA's classes; each bar's height is the window. None without GPU tracks."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sec = data["report"].get("gpu_time_breakdown") or {}
    by_rank, by_step = sec.get("by_rank") or [], sec.get("by_step") or []
    if not by_rank:
        return None
    if len(by_step) > MAX_STEP_RANK_GROUPS:
        by_step = []
    unit, f = _time_unit(max([r["window_ns"] or 0 for r in by_rank] + [1]))
    cols = 2 if by_step else 1
    fig = make_subplots(rows=1, cols=cols, horizontal_spacing=0.08,
                        subplot_titles=["per rank (whole trace)"] + (["per profiler step and rank"] if by_step else []))

    def add(rows, x, col, showlegend):
        for key, name, color in GPU_BREAKDOWN_SERIES:
            fig.add_trace(go.Bar(
                x=x, y=[(r[key] or 0) / f for r in rows], name=name, legendgroup=key, showlegend=showlegend,
                marker_color=color,
                customdata=[[fmt_pct((r[key] or 0) / r["window_ns"] if r["window_ns"] else None), fmt_ms(r["window_ns"])]
                            for r in rows],
                hovertemplate=name + ": %{y:,.3f} " + unit + " (%{customdata[0]} of the window %{customdata[1]} ms)"
                              "<extra></extra>",
            ), row=1, col=col)

    add(by_rank, [f"rank {r['rank']}" for r in by_rank], 1, True)
    if by_step:
        add(by_step, [[f"step {r['step']}" for r in by_step], [f"r{r['rank']}" for r in by_step]], 2, False)
    _layout(fig, "GPU time: compute, communication, memory, sync and idle", height=500, barmode="stack")
    _legend_under_title(fig, 500, 150)
    fig.update_yaxes(title_text=f"time ({unit})", row=1, col=1)
    return fig


def kernel_figure(data: dict):
    """Horizontal bars: the largest GPU ops by total time (report['kernel_summary'], coloured by
    class) above GPU time per record_function range (report['gpu_time_by_launcher'], kind
    annotation). None without GPU ops."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rep = data["report"]
    kernels = sorted(rep.get("kernel_summary") or [], key=lambda r: r["total_ns"])
    if not kernels:
        return None
    launch = sorted([r for r in rep.get("gpu_time_by_launcher") or [] if r["launcher_kind"] == "annotation"],
                    key=lambda r: r["gpu_total_ns"])
    unit, f = _time_unit(max(r["total_ns"] for r in kernels))
    colors = {"compute": COMPUTE_COLOR, "comm": COMM_COLOR, "memory": MEMORY_COLOR, "sync": "#495057"}
    # one panel above the other: side by side, the right panel's long range names were drawn over the
    # left panel's bars (tests/report/test_html_overlaps.py); stacked, both share the left margin
    rows_px = [26 * len(kernels) + 40, 26 * len(launch) + 40] if launch else [26 * len(kernels) + 40]
    height = sum(rows_px) + 90 * len(rows_px) + 80
    fig = make_subplots(rows=len(rows_px), cols=1, row_heights=rows_px,
                        vertical_spacing=100 / (height - 150) if launch else 0.1,
                        subplot_titles=["largest GPU ops per class (total time)"]
                        + (["GPU time per record_function range"] if launch else []))
    short = lambda n: n if len(n) <= 48 else n[:47] + "…"  # noqa: E731
    fig.add_trace(go.Bar(
        y=[f"{short(r['name'])} [{r['class']}]" for r in kernels], x=[r["total_ns"] / f for r in kernels],
        orientation="h", marker_color=[colors.get(r["class"], "#adb5bd") for r in kernels], showlegend=False,
        customdata=[[r["name"], r["count"], fmt_us(r["p50_ns"]), fmt_us(r["p95_ns"])] for r in kernels],
        hovertemplate="%{customdata[0]}<br>%{x:,.3f} " + unit + " in %{customdata[1]} ops"
                      "<br>p50 %{customdata[2]} µs, p95 %{customdata[3]} µs<extra></extra>"), row=1, col=1)
    if launch:
        fig.add_trace(go.Bar(
            y=[short(r["launcher"] or "(none)") for r in launch], x=[r["gpu_total_ns"] / f for r in launch],
            orientation="h", marker_color="#868e96", showlegend=False,
            customdata=[[fmt_pct(r["share"]), r["gpu_ops"]] for r in launch],
            hovertemplate="%{y}: %{x:,.3f} " + unit + " (%{customdata[0]}) in %{customdata[1]} GPU ops<extra></extra>"),
            row=2, col=1)
    _layout(fig, "Where GPU time goes: ops and the ranges that launched them", height=height)
    fig.update_yaxes(automargin=True)  # the left margin grows to the longest name
    fig.update_xaxes(title_text=f"time ({unit})")
    return fig


def alltoall_heatmap(data: dict):
    """Rank × peer heatmap of the bytes all-to-alls sent over the run (report['alltoall_imbalance']
    ['matrix_total']), beside each call's send and receive imbalance (max/mean). None without
    all-to-alls with splits."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sec = data["report"].get("alltoall_imbalance") or {}
    cells = sec.get("matrix_total") or []
    if not cells:
        return None
    ranks = sorted({c["src"] for c in cells} | {c["dst"] for c in cells})
    at = {(c["src"], c["dst"]): c["bytes"] for c in cells}
    z = [[at.get((s, d)) for d in ranks] for s in ranks]
    calls = sorted(sec.get("calls") or [], key=lambda r: (str(r["pg_name"]), r["seq"]))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.15, column_widths=[0.45, 0.55],
                        subplot_titles=["bytes sent, summed over the run<br>(row: sender, column: receiver)",
                                        f"imbalance of the top {len(calls)} calls<br>by cost (max/mean)"])
    fig.add_trace(go.Heatmap(
        z=z, x=[f"to {d}" for d in ranks], y=[f"rank {s}" for s in ranks], colorscale="Blues",
        text=[[fmt_bytes(v) for v in row] for row in z], texttemplate="%{text}",
        # each cell prints its bytes: no colour bar (it was drawn over the right panel's axis title)
        hovertemplate="%{y} → %{x}: %{text}<extra></extra>", showscale=False), row=1, col=1)
    x = [f"{r['pg_name']}:{r['seq']}" for r in calls]
    for key, name, color in (("send_imbalance", "send", COMPUTE_COLOR), ("recv_imbalance", "receive", COMM_COLOR)):
        fig.add_trace(go.Bar(x=x, y=[r[key] for r in calls], name=name, marker_color=color,
                             hovertemplate=name + " max/mean %{y:.3f}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text="max / mean", row=1, col=2)
    fig.update_xaxes(title_text="group:seq", type="category", row=1, col=2)
    height = max(450, 40 * len(ranks) + 250)
    # the legend 50 px above the plot area (paper coordinates are the plot area), over the two-line panel titles
    _layout(fig, "All-to-all: who sends how much to whom", height=height, barmode="group",
            legend=dict(orientation="h", yanchor="bottom", y=1 + 50 / (height - 170 - 70), x=1, xanchor="right"))
    fig.update_layout(margin=dict(t=170))
    return fig


LOCALITY_COLORS = {"intra_node": "#2f9e44", "inter_node": "#1c7ed6", "mixed": "#7048e8", "unknown": "#adb5bd"}


class NotDrawn(str):
    """What a figure builder returns instead of a figure when the data cannot carry the plot: the
    reason, in words; the page prints it as one line in place of the figure (:func:`render_html`)."""


def locality_figure(data: dict):
    """Median busbw per op and size bucket, one line per (op, locality class)
    (report['bandwidth_by_locality']; the hover gives instances and the bucket's best busbw). None
    without collectives; :class:`NotDrawn` when every instance's locality is unknown (nothing to
    compare) or there is a single point."""
    import plotly.graph_objects as go

    rows = data["report"].get("bandwidth_by_locality") or []
    rows = [r for r in rows if r["median_busbw_gbps"] is not None and r["bucket_bytes"]]
    if not rows:
        return None
    if all(r["locality"] == "unknown" for r in rows):
        return NotDrawn("the locality of every collective is unknown (the traces name no host for "
                        "some rank of each group), so intra- and inter-node cannot be told apart")
    if len(rows) == 1:
        r = rows[0]
        return NotDrawn(f"a single point ({r['op']}, {r['locality'].replace('_', '-')}, "
                        f"{size_bucket_label(r['bucket_bytes'])}: median busbw {fmt_num(r['median_busbw_gbps'])} GB/s "
                        f"over {r['instances']} instances)")
    fig = go.Figure()
    for loc in ("intra_node", "inter_node", "mixed", "unknown"):
        for op in sorted({r["op"] for r in rows if r["locality"] == loc}):
            sel = sorted((r for r in rows if r["locality"] == loc and r["op"] == op), key=lambda r: r["bucket_bytes"])
            fig.add_trace(go.Scatter(
                x=[r["bucket_bytes"] for r in sel], y=[r["median_busbw_gbps"] for r in sel], mode="lines+markers",
                name=f"{op}, {loc.replace('_', '-')}", line=dict(color=LOCALITY_COLORS[loc]),
                customdata=[[size_bucket_label(r["bucket_bytes"]), r["instances"], fmt_num(r["max_busbw_gbps"])]
                            for r in sel],
                hovertemplate=(f"{op} {loc}: %{{customdata[0]}}<br>median busbw %{{y:,.2f}} GB/s, "
                               "%{customdata[1]} instances, best %{customdata[2]} GB/s<extra></extra>")))
    _layout(fig, "Bus bandwidth within a node and across nodes, per size", height=420)
    fig.update_xaxes(title_text="size bucket (bytes, ≥)", type="log")
    fig.update_yaxes(title_text="median busbw (GB/s)")
    return fig


def bubbles_figure(data: dict):
    """Measured bubble fraction per (step, stage) beside the model's (p−1)/(m+p−1)
    (report['pipeline_bubbles']). None for runs without send/recv."""
    import plotly.graph_objects as go

    rows = data["report"].get("pipeline_bubbles") or []
    if not rows:
        return None
    x = [[f"step {r['step']}" for r in rows], [f"stage r{r['rank']}" for r in rows]]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=x, y=[r["bubble_fraction"] for r in rows], name="measured", marker_color=COMM_WAIT_COLOR,
        customdata=[[fmt_ms(r["window_ns"]), fmt_ms(r["compute_ns"]), fmt_ms(r["recv_wait_ns"])] for r in rows],
        hovertemplate=("bubble %{y:.1%}<br>step %{customdata[0]} ms, compute %{customdata[1]} ms, "
                       "recv wait %{customdata[2]} ms<extra></extra>")))
    fig.add_trace(go.Scatter(
        x=x, y=[r["model_bubble_fraction"] for r in rows], name="model (p−1)/(m+p−1)", mode="markers",
        marker=dict(symbol="line-ew-open", size=36, line=dict(width=3, color=FIT_COLOR)),
        hovertemplate="model %{y:.1%}<extra></extra>"))
    _layout(fig, "Pipeline bubble per stage and step: measured vs GPipe's (p−1)/(m+p−1)", height=420)
    fig.update_yaxes(title_text="bubble fraction of the step", tickformat=".0%", rangemode="tozero")
    return fig


@dataclass
class Column:
    """One table column: ``key`` into the row dicts, ``label`` for the header, ``fmt`` to text."""

    key: str
    label: str
    fmt: Callable[[Any], str] = lambda v: "—" if v is None else str(v)
    numeric: bool = False


@dataclass
class Table:
    """A titled table of plain rows, rendered as HTML. Extend the page by adding more of these."""

    title: str
    columns: list[Column]
    rows: list[dict]
    note: str = ""
    id: str = ""


_SUFFIX_FORMATS: tuple[tuple[str, bool, str, Callable[[Any], str]], ...] = (
    # (key suffix, strip it from the label, unit added to the label, formatter)
    ("_ns", True, " (µs)", fmt_us),
    ("_bytes", True, "", fmt_bytes),
    ("_gbps", True, " (GB/s)", fmt_num),
    ("overlap_ratio", False, "", fmt_pct),
    ("_fraction", False, "", fmt_pct),
    ("_ratio", False, " (×)", lambda v: "—" if v is None else f"{v:,.2f}×"),
    ("_s", True, " (µs)", lambda v: "—" if v is None else f"{v * 1e6:,.2f}"),
    ("_Bps", True, " (GB/s)", lambda v: "—" if v is None else f"{v / 1e9:,.2f}"),
)


def infer_columns(rows: Sequence[dict]) -> list[Column]:
    """Columns for arbitrary rows by key suffix: ``*_ns`` → µs, ``*_bytes`` → decimal bytes,
    ``*_gbps`` and ``*_Bps`` → GB/s, ``overlap_ratio``/``*_fraction`` → %, other ``*_ratio`` → ×,
    ``*_s`` → µs; other numbers as numbers, the rest as text."""
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    cols = []
    for k in keys:
        for suffix, strip, unit, fmt in _SUFFIX_FORMATS:
            if k.endswith(suffix):
                base = k[: -len(suffix)] if strip else k
                cols.append(Column(k, base.replace("_", " ") + unit, fmt, True))
                break
        else:
            sample = next((r.get(k) for r in rows if r.get(k) is not None), None)
            if isinstance(sample, (int, float)) and not isinstance(sample, bool):
                cols.append(Column(k, k.replace("_", " "), fmt_num, True))
            else:
                cols.append(Column(k, k.replace("_", " ")))
    return cols


def report_tables(report: dict) -> list[Table]:
    """The measured-vs-model tables of the page: verdicts per op, the α–β fit, the instances
    furthest from the model, and any ``report['measured_vs_model']`` rows (a list of dicts, e.g.
    a workload's measured-vs-predicted analysis), whose columns are inferred from their keys."""
    tables = []
    if report.get("references"):
        tables.append(Table(
            "Reference of the verdicts", [
                Column("op", "op"), Column("group_size", "k", fmt_num, True), Column("locality", "class"),
                Column("instances", "instances", fmt_num, True),
                Column("reference", "reference"), Column("kind", "kind", lambda v: v or "—"),
                Column("alpha_s", "α per step (µs)", lambda v: "—" if v is None else f"{v * 1e6:,.3f}", True),
                Column("fixed_latency_ns", "fixed latency (µs)", fmt_us, True),
                Column("beta_gbps", "β (GB/s)", fmt_num, True),
                Column("crossover_bytes", "D* (boundary)", fmt_bytes, True),
                Column("n_half_bytes", "link n½ = α·β", fmt_bytes, True),
                Column("note", "note", lambda v: v or ""),
                Column("no_model_reason", "why no model", lambda v: v or ""),
            ], report["references"],
            note=("Chosen in order: --link or the user's α/β; the ok fit of the instance's own process group; the "
                  "machine's newest ok sweep / nccl-tests fit; the preset of the device for the group's class (one host: "
                  "NVLink/xGMI/PCIe; several: the network); else no model, with the reason. D* = A·α·β/B is where the "
                  "collective's α and β terms are equal."),
            id="references",
        ))
    if report.get("verdicts"):
        tables.append(Table(
            "Verdicts and efficiency per op", [
                Column("op", "op"), Column("locality", "class"), Column("verdict", "verdict", lambda v: v or "no model"),
                Column("reference", "reference"), Column("verdict_basis", "kind", lambda v: v or "—"),
                Column("count", "instances", fmt_num, True),
                Column("median_efficiency", "median efficiency (reference)", fmt_num, True),
                Column("median_efficiency_link", "median efficiency (link)", fmt_num, True),
                Column("link", "link", lambda v: v or "—"),
                Column("no_model_reason", "why no model", lambda v: v or ""),
            ], report["verdicts"],
            note="efficiency = predicted / measured sync time (1 = as the model says, < 1 slower).",
            id="verdicts",
        ))
    # efficiency against the link per size: a column of the per-size table (render_html)
    if report.get("fit"):
        from tracekit.report.data import fit_group_label

        fits = [dict(r, group=fit_group_label(r)) for r in report["fit"]]
        tables.append(Table(
            "α–β fit per op and process group", [
                Column("op", "op"), Column("group_size", "k", fmt_num, True), Column("group", "group"),
                Column("algo", "algorithm"),
                Column("n_used", "samples used", fmt_num, True), Column("n_sizes", "sizes", fmt_num, True),
                Column("alpha_s", "α per step (µs)", lambda v: "—" if v is None else f"{v * 1e6:,.3f}", True),
                Column("alpha_lo_s", "α 95 % low", lambda v: "—" if v is None else f"{v * 1e6:,.3f}", True),
                Column("alpha_hi_s", "α 95 % high", lambda v: "—" if v is None else f"{v * 1e6:,.3f}", True),
                Column("fixed_latency_s", "fixed latency (µs)", lambda v: "—" if v is None else f"{v * 1e6:,.2f}", True),
                Column("beta_gbps", "β (GB/s)", fmt_num, True),
                Column("beta_lo_gbps", "β 95 % low", fmt_num, True),
                Column("beta_hi_gbps", "β 95 % high", lambda v: "∞" if v is None else fmt_num(v), True),
            ], fits, id="fit",
        ))
        tables.append(Table(
            "α–β fit quality: the boundary it implies, its spread, its status", [
                Column("op", "op"), Column("group_size", "k", fmt_num, True), Column("group", "group"),
                Column("locality", "class"),
                Column("crossover_bytes", "D*", fmt_bytes, True), Column("n_half_bytes", "link n½", fmt_bytes, True),
                Column("residual_spread", "residual spread", fmt_pct, True),
                Column("size_spread", "per-size spread", fmt_pct, True), Column("status", "status"),
                Column("status_reason", "why", lambda v: v or ""),
            ], fits, id="fit-quality",
            note=("Only a group's ok fit judges anything: >= 3 sizes spanning D*, both parameters determined, per-size "
                  "spread <= 15 %. One fit per process group or nccl-tests benchmark run; 'all <class>': the groups of "
                  "one locality class pooled."),
        ))
    if report.get("furthest_from_model"):
        tables.append(Table(
            "Instances furthest from the model (lowest efficiency)", [
                Column("op", "op"), Column("pg_name", "group"), Column("seq", "seq", fmt_num, True),
                Column("size_bytes", "size", fmt_size, True), Column("sync_time_ns", "sync (µs)", fmt_us, True),
                Column("predicted_ns", "predicted (µs)", fmt_us, True),
                Column("efficiency", "efficiency", fmt_num, True), Column("skew_ns", "skew (µs)", fmt_us, True),
                Column("verdict", "verdict"), Column("best_algo", "best algorithm"),
            ], report["furthest_from_model"], id="furthest",
        ))
    extra = report.get("measured_vs_model")
    if extra:
        notes = sorted({str(r["note"]) for r in extra if r.get("note")})
        cols = [c for c in infer_columns(extra) if c.key not in ("note", "run_id", "workload")]
        # two tables, as in the terminal: what was measured, then what the model predicts (and
        # one table of ~18 columns would not fit the page)
        model_keys = {"model", "alpha_s", "beta_Bps", "ab_source", "gap_ratio", "larger", "bubble_fraction"}
        is_model = [c.key in model_keys or c.key.startswith("predicted") for c in cols]
        rank = [c for c in cols if c.key == "rank"]
        tables.append(Table(
            "Measured for the workload (per rank, means per profiler step)",
            [c for c, m in zip(cols, is_model) if not m], list(extra), id="measured-vs-model",
        ))
        tables.append(Table(
            "Model for the workload (the α–β prediction under the run's overlap model)",
            rank + [c for c, m in zip(cols, is_model) if m], list(extra), note="; ".join(notes), id="model-per-step",
        ))
    dims = report.get("model_by_dimension")
    if dims:
        tables.append(Table(
            "Measured vs model per dimension (means over ranks, per step)",
            [Column("dimension", "dimension"), Column("model", "model"), Column("ranks", "ranks", fmt_num, True),
             Column("calls", "calls", fmt_num, True), Column("comm_ns", "comm (ms)", fmt_ms, True),
             Column("exposed_ns", "exposed (ms)", fmt_ms, True), Column("max_exposed_ns", "max rank (ms)", fmt_ms, True),
             Column("predicted_exposed_ns", "predicted exposed (ms)", fmt_ms, True),
             Column("ratio", "measured / predicted", fmt_num, True)],
            dims, note="; ".join(f"{d['dimension']}: {d['note']}" for d in dims), id="model-by-dimension",
        ))
    if report.get("remedies"):
        tables.append(remedies_table(report["remedies"]))
    return tables


def metadata_tables(report: dict) -> list[Table]:
    """The run's metadata: the run row, and per rank host, source, events and clock offset."""
    run = report["run"]
    keys = ("run_id", "workload", "source", "backend", "world_size", "device_name", "torch_version", "nccl_version",
            "created_at", "schema_version")
    kv = [{"field": k.replace("_", " "), "value": "—" if run.get(k) is None else str(run.get(k))} for k in keys]
    kv.append({"field": "ranks ingested", "value": "a benchmark log (per-size averages over all ranks)"
               if run.get("source") == "nccl_tests" else str(len(report["ranks"]))})
    t_run = Table("Run", [Column("field", "field"), Column("value", "value")], kv, id="run")
    t_ranks = Table(
        "Ranks", [
            Column("rank", "rank", fmt_num, True), Column("host", "host"),
            Column("source_path", "trace file", lambda v: "—" if not v else os.path.basename(str(v))),
            Column("events", "events", fmt_num, True), Column("events_quarantined", "quarantined", fmt_num, True),
            Column("clock_offset_ns", "clock offset (µs)", fmt_us, True),
            Column("clock_offset_err_ns", "± (µs)", fmt_us, True),
            Column("warnings", "warnings", lambda v: str(len(v or [])), True),
        ], report["ranks"], id="ranks",
    )
    return [t_run, t_ranks]


# -- 3. page ------------------------------------------------------------------------------------


_CSS = """
body { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; font-size: 15px; color: #212529;
       margin: 0; background: #f8f9fa; line-height: 1.45; }
header { background: #212529; color: #f8f9fa; padding: 18px 32px; }
header h1 { margin: 0 0 6px 0; font-size: 24px; }
header .meta { font-size: 15px; color: #ced4da; }
main { padding: 8px 32px 40px 32px; max-width: 1500px; box-sizing: border-box; }
section { background: white; border: 1px solid #dee2e6; border-radius: 6px; margin: 18px 0; padding: 14px 18px;
          overflow-x: auto; }
h2 { font-size: 19px; margin: 4px 0 8px 0; }
p.note { color: #495057; margin: 4px 0 10px 0; font-size: 14px; }
table { border-collapse: collapse; font-size: 14px; margin: 6px 0 12px 0; }
th, td { border-bottom: 1px solid #e9ecef; padding: 5px 10px; text-align: left; overflow-wrap: break-word; }
th { white-space: normal; max-width: 12em; }
td { max-width: 28em; }
th { background: #f1f3f5; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.badges span { display: inline-block; padding: 4px 10px; border-radius: 12px; color: white; margin: 0 6px 6px 0;
               font-size: 14px; font-weight: 600; }
ul.warnings li { color: #862e9c; }
#tk-js-errors { color: #c92a2a; background: #fff5f5; border: 1px solid #ffc9c9; padding: 8px; white-space: pre-wrap; }
.figure { margin: 0; }
.table-wrap { overflow-x: auto; max-width: 100%; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; }
"""

_ERROR_HOOK = """
window.__tkErrors = [];
(function () {
  function show() {
    var n = document.getElementById('tk-js-errors');
    if (n && window.__tkErrors.length) { n.textContent = window.__tkErrors.join('\\n'); n.hidden = false; }
  }
  function record(msg) { window.__tkErrors.push(String(msg)); show(); }
  window.addEventListener('error', function (e) {
    record('error: ' + (e.message || e) + (e.filename ? ' at ' + e.filename + ':' + e.lineno : ''));
  });
  window.addEventListener('unhandledrejection', function (e) {
    record('unhandled promise rejection: ' + ((e.reason && e.reason.message) || e.reason));
  });
  document.addEventListener('DOMContentLoaded', show);
})();
"""

_DONE_HOOK = """
(function () {
  var figs = document.querySelectorAll('.plotly-graph-div');
  var drawn = 0;
  figs.forEach(function (d) { if (d.querySelector('.main-svg')) { drawn += 1; } });
  var s = document.getElementById('tk-status');
  if (s) { s.setAttribute('data-figures', String(figs.length)); s.setAttribute('data-drawn', String(drawn)); }
  function measure() {  // horizontal overflow, read by the browser test: scroll width vs the window
    if (!s) { return; }
    s.setAttribute('data-scroll-width', String(document.documentElement.scrollWidth));
    s.setAttribute('data-inner-width', String(window.innerWidth));
    s.setAttribute('data-scroll-height', String(document.body.scrollHeight));  // the page's height, px
    var over = 0, where = '';  // the most any table or section is wider than its box (its own scroll bar)
    document.querySelectorAll('.table-wrap, section').forEach(function (b) {
      var d = b.scrollWidth - b.clientWidth;
      if (d > over) { over = d; where = b.id || (b.querySelector('table') || {}).id || b.className; }
    });
    s.setAttribute('data-box-overflow', String(over));
    s.setAttribute('data-box-overflow-at', where);
  }
  measure();
  window.addEventListener('load', function () { setTimeout(measure, 200); });
})();
"""


def _table_html(t: Table) -> str:
    head = "".join(f'<th class="{"num" if c.numeric else ""}">{html.escape(c.label)}</th>' for c in t.columns)
    body = []
    for r in t.rows:
        cells = []
        for c in t.columns:
            try:
                text = c.fmt(r.get(c.key))
            except (TypeError, ValueError):
                text = str(r.get(c.key))
            cells.append(f'<td class="{"num" if c.numeric else ""}">{html.escape(str(text))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{html.escape(t.note)}</p>' if t.note else ""
    ident = f' id="tk-table-{t.id}"' if t.id else ""
    table = (f'<div class="table-wrap"><table{ident}><thead><tr>{head}</tr></thead>'
             f"<tbody>{''.join(body)}</tbody></table></div>")
    chars = sum(len(str(r.get(c.key) or "")) for r in t.rows for c in t.columns)
    if len(t.rows) > FOLD_ROWS or chars > FOLD_CHARS or t.id in FOLDED:  # a long table folds: the page stays short, a click opens it
        return (f'<h3>{html.escape(t.title)}</h3>{note}<details class="tk-long"><summary>{len(t.rows)} rows: '
                f"show the table</summary>{table}</details>")
    return f'<h3>{html.escape(t.title)}</h3>{note}{table}'


FOLD_ROWS = 12
"""Tables with more rows than this are folded in <details> on the page (the JSON has every row)."""
FOLD_CHARS = 1500
FOLDED = ("references", "fit", "fit-quality", "furthest", "remedies")
"""Tables folded whatever their length: the reference details behind the verdicts (the terminal's
--detail sections) and the lists the page's "At a glance" sums up."""
"""... or with more text than this in their cells (long notes wrap into tall rows)."""


TITLE_CHARS, NOTE_CHARS = 72, 110
"""Characters per line of a figure's title (18 px) and of its ``<sup>`` note: plotly does not wrap
titles, and a longer line ran past the figure's right edge at 1,000 px (tests/report/test_html_overlaps.py)."""


def wrap_title(text: str) -> tuple[str, int]:
    """A plotly title ``text`` (``main<br><sup>note</sup>...``) with each part wrapped between words,
    the main text at :data:`TITLE_CHARS` per line, a ``<sup>`` part at :data:`NOTE_CHARS` (each of its
    lines in its own ``<sup>``). Returns the text and how many lines were added."""
    import textwrap

    out, added = [], 0
    for part in text.split("<br>"):
        note = part.startswith("<sup>") and part.endswith("</sup>")
        inner = part[5:-6] if note else part
        lines = textwrap.wrap(inner, NOTE_CHARS if note else TITLE_CHARS, break_long_words=False,
                              break_on_hyphens=False) or [inner]
        added += len(lines) - 1
        out += [f"<sup>{ln}</sup>" if note else ln for ln in lines]
    return "<br>".join(out), added


def _wrap_figure_title(fig) -> None:
    """Wrap a go.Figure's title (:func:`wrap_title`) and give each added line 24 px more top margin
    (and the figure 24 px more height when its legend is a band under the title)."""
    title = fig.layout.title.text if fig.layout.title else None
    if not title:
        return
    text, added = wrap_title(title)
    band = fig.layout.legend.yref == "container" and fig.layout.legend.y is not None and fig.layout.height
    # a legend band under the title (:func:`_legend_under_title`) moves down by every line past the
    # first (wrapped, or a <br><sup> note); elsewhere the figure's margin already holds its notes
    shift = text.count("<br>") if band else added
    if not shift:
        return
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 80
    fig.update_layout(title_text=text, margin=dict(t=top + 24 * shift))
    if band:
        height = fig.layout.height + 24 * shift
        fig.update_layout(height=height, legend_y=1 - (LEGEND_TOP_PX + 24 * shift) / height,
                          title_y=1 - TITLE_TOP_PX / height)


@functools.cache
def _white_json() -> dict:
    """plotly's ``plotly_white`` template as the plain dict a figure's ``to_dict()`` holds, in its
    key order (built once)."""
    import plotly.graph_objects as go

    return go.Figure(layout=dict(template="plotly_white")).to_dict()["layout"]["template"]


@functools.cache
def _none_json() -> dict:
    """plotly's empty ``"none"`` template as a figure's ``to_dict()`` holds it."""
    import plotly.graph_objects as go

    return go.Figure(layout=dict(template="none")).to_dict()["layout"]["template"]


def _white_template(d: dict) -> dict:
    """A figure dict ``d`` whose layout has the empty template :func:`_layout` set, given plotly_white
    in its place (the same key, so the JSON keeps plotly's key order); another template is left as it is."""
    if d.get("layout", {}).get("template") == _none_json():
        d["layout"]["template"] = _white_json()
    return d


def _figure_html(fig, name: str) -> str:
    """A figure (or a figure's dict from :func:`figure_dict`, written unvalidated) as an HTML div;
    a go.Figure's title is wrapped to the page (:func:`_wrap_figure_title`), and either is given the
    page's template (:func:`_white_template`)."""
    import plotly.io as pio

    if not isinstance(fig, dict):
        _wrap_figure_title(fig)
        fig = fig.to_dict()  # validated as it was built
    _white_template(fig)

    page = pio.to_html(
        fig, validate=False, full_html=False, include_plotlyjs=False, div_id=f"tk-fig-{name}",
        config={"displaylogo": False, "responsive": True, "toImageButtonOptions": {"filename": f"tracekit-{name}"}},
    )
    return _splice_rows(page, fig.splices) if isinstance(fig, SplicedFigure) else page


FIGURES: tuple[tuple[str, str, Callable[[dict], Any], str], ...] = (
    ("bandwidth", "Bandwidth vs message size", bandwidth_figure,
     "Each dot is one collective instance: its size and its bus bandwidth over the sync time (after the last rank "
     "arrived; nccl-tests conventions). Lines are the α–β model: the fit to this run's own instances, and preset "
     "links for comparison. ◆ marks each line's crossover size D*, where the collective's α term equals its β "
     "term: the latency/bandwidth boundary for its op, algorithm and k (for a ring on k ranks D* = k·α·β; "
     "n½ = α·β is the link's, for one message); the dotted line marks the fit's D*."),
    ("timeline", "Timeline", timeline_figure,
     "Per rank: compute (union of compute kernels/ops), communication (light = waiting for the slowest rank, "
     "dark = transfer after the last arrival) and where they overlap. Zoom with the mouse; double-click resets."),
    ("overlap", "Overlap", overlap_figure,
     "comm = |∪ comm| (the union of communication intervals), overlap = |∪ comm ∩ ∪ compute|, "
     "exposed = comm − overlap, overlap ratio = overlap / comm."),
    ("waits", "Who waits for whom", wait_heatmap,
     "Time each rank spent waiting for the last rank to arrive at each collective; × marks the straggler."),
)


def fleet_heatmap(data: dict):
    """The fleet view (report['fleet']['pairs']): one node × node heatmap per op (row) and ranks per node
    (column), colour = the pair's plateau busbw over the fleet median of its panel, text = the busbw
    (GB/s); slow pairs marked ×. None without two-node groups."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pairs = ((data["report"].get("fleet") or {}).get("pairs")) or []
    if not pairs:
        return None
    ops = sorted({p["op"] for p in pairs})
    rphs = sorted({p["ranks_per_host"] for p in pairs})
    height = max(420, 360 * len(ops))
    # 120 px between rows (the spacing is a fraction of the plot area, margins 80 + 70 px): room for
    # a row's slanted host names above the next row's panel titles (tests/report/test_html_overlaps.py)
    hosts_of = {}
    for p in pairs:
        hosts_of.setdefault((p["op"], p["ranks_per_host"]), set()).update((p["host_a"], p["host_b"]))
    same = all(len({tuple(sorted(h)) for (o, _), h in hosts_of.items() if o == op}) == 1 for op in ops)
    # host names only on each row's first panel when every panel of the row has the same hosts; else
    # room for them between the panels (each panel's names were drawn over its left neighbour)
    fig = make_subplots(rows=len(ops), cols=len(rphs), horizontal_spacing=0.04 if same else 0.16,
                        vertical_spacing=120 / (height - 150) if len(ops) > 1 else 0.12,
                        subplot_titles=[f"{op}, {r}/node" for op in ops for r in rphs])
    first = {}  # per row, the hosts of its first panel: a panel with the same hosts prints no host names again
    for i, op in enumerate(ops, start=1):
        for j, rph in enumerate(rphs, start=1):
            sel = [p for p in pairs if p["op"] == op and p["ranks_per_host"] == rph]
            if not sel:
                continue
            hosts = sorted({p["host_a"] for p in sel} | {p["host_b"] for p in sel})
            if first.setdefault(i, hosts) == hosts and j > 1:
                fig.update_yaxes(showticklabels=False, row=i, col=j)
            at = {h: n for n, h in enumerate(hosts)}
            z = [[None] * len(hosts) for _ in hosts]
            text = [[""] * len(hosts) for _ in hosts]
            for p in sel:
                for a, b in ((p["host_a"], p["host_b"]), (p["host_b"], p["host_a"])):
                    z[at[a]][at[b]] = p["ratio"]
                    text[at[a]][at[b]] = f"{p['plateau_busbw_gbps']:.1f}" + (" ×" if p["slow"] else "")
            fig.add_trace(go.Heatmap(
                z=z, x=hosts, y=hosts, text=text, texttemplate="%{text}", zmin=0, zmax=1.2,
                colorscale="RdYlGn", showscale=(i == 1 and j == 1), colorbar=dict(title="÷ fleet median"),
                hovertemplate=f"{op}, {rph}/node: %{{y}} – %{{x}}<br>%{{text}} GB/s, %{{z:.2f}} of the fleet median"
                              "<extra></extra>"), row=i, col=j)
    _layout(fig, "Fleet: plateau busbw per node pair", height=height)
    return fig


RUN_FIGURES: tuple[tuple[str, str, Callable[[dict], Any], str], ...] = (
    # figures of analyses that only some runs have data for (a section saying so otherwise)
    ("gpu-breakdown", "GPU time breakdown", gpu_breakdown_figure,
     "Each bar is a rank's GPU window (first GPU op start to last end; per step: the GPU work launched in it), "
     "split so the parts sum to it: compute only, communication hidden by compute or exposed, memcpy/memset, sync, "
     "and idle (no GPU op on any stream) by HTA's classes: host wait (the next op was launched after the GPU went "
     "idle), kernel wait (a gap under 30 ns), other (analyses/gpu_time_breakdown.py)."),
    ("kernels", "GPU ops and their launchers", kernel_figure,
     "Top: the largest GPU ops of each class by total time over all ranks (sums of durations, so ops on "
     "concurrent streams each count). Below: GPU time by the innermost record_function range around each op's "
     "launch call (analyses/gpu_time_breakdown.py)."),
    ("alltoall", "All-to-all imbalance", alltoall_heatmap,
     "Bytes each rank sent each peer in all-to-all(v) calls (collectives.in_splits × the element size; own "
     "chunk on the diagonal), and per call the max/mean of the bytes ranks send and receive: 1 = even "
     "(analyses/alltoall_imbalance.sql)."),
    ("locality", "Intra- vs inter-node", locality_figure,
     "Each instance is intra-node when every rank of its group is on one host (trace host names, or an nccl-tests "
     "log's 'Using devices' lines), inter-node when they are one on each of several, mixed when several share "
     "each of several hosts, unknown when a host is not known; one line per op and class: the median nccl-tests "
     "busbw of each power-of-two size bucket (analyses/machine.py, node_locality.sql)."),
    ("bubbles", "Pipeline bubbles", bubbles_figure,
     "Per pipeline stage and profiler step: the part of the step (first to last event over all stages) the "
     "stage spends outside compute, beside the model's (p−1)/(m+p−1) for p stages and m micro-batches "
     "(Huang et al., GPipe, 2019; analyses/pipeline_bubbles.sql)."),
    ("fleet", "Fleet: node pairs", fleet_heatmap,
     "Per op and ranks per node, each node pair's large-message busbw (the median over the sizes where its curve "
     "is flat), coloured by its ratio to the fleet median of that panel; × marks a slow pair (below 70 % of its "
     "peers; analyses/fleet.py)."),
)


def render_html(data: dict) -> str:
    """The page for :func:`html_data` output: one self-contained HTML document (plotly inlined)."""
    from plotly.offline import get_plotlyjs

    rep = data["report"]
    run = rep["run"]
    sections = []
    counts: dict[str, int] = {}
    for r in rep.get("verdicts") or []:
        key = r["verdict"] or "no model"
        counts[key] = counts.get(key, 0) + r["count"]
    badges = "".join(
        f'<span style="background:{VERDICT_COLORS.get(k, "#868e96")}">{html.escape(k)}: {v}</span>'
        for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
    )
    tot = {k: sum((r[k] or 0) for r in rep["overlap_by_rank"]) for k in ("comm_ns", "overlap_ns", "exposed_comm_ns")}
    ratio = tot["overlap_ns"] / tot["comm_ns"] if tot["comm_ns"] else None
    line = f'{sum(c["count"] for c in rep["collectives"])} matched collective instances'
    if rep["overlap_by_rank"]:
        line += (f'; communication over all ranks {fmt_ms(tot["comm_ns"])} ms, of which '
                 f'{fmt_ms(tot["exposed_comm_ns"])} ms exposed (overlap ratio {fmt_pct(ratio)})')
    from tracekit.report.data import cpu_side_lines

    notes = "".join(f'<p class="note">{html.escape(n)}.</p>' for n in cpu_side_lines(rep))
    from tracekit.report.data import machine_lines

    notes += "".join(f'<p class="note">{html.escape(n)}</p>' for n in machine_lines(rep))
    from tracekit.report.glance import glance_lines

    answer = "".join(f"<li>{html.escape(x)}</li>" for x in glance_lines(rep["summary"])) if rep.get("summary") else ""
    glance = (
        f'<section id="tk-summary"><h2>At a glance</h2><ul class="tk-glance">{answer}</ul>'
        f'<div class="badges">{badges or "no collectives"}</div>'
        f'<p class="note">{html.escape(line)}.</p>{notes}</section>'
    )
    sections.append(glance)
    sections += hang_sections(rep)
    empty = []  # sections with nothing to show: one line at the end, not one empty box each
    not_drawn = []  # figures the data cannot carry: one line each, saying why
    for name, title, build, note in FIGURES + RUN_FIGURES:
        fig = build(data)
        if fig is None:
            empty.append(title)
            continue
        if isinstance(fig, NotDrawn):
            not_drawn.append(f'<p class="note" id="tk-not-drawn-{name}">{html.escape(title)} — not drawn: {html.escape(fig)}.</p>')
            continue
        sections.append(
            f'<section id="tk-sec-{name}"><h2>{html.escape(title)}</h2><p class="note">{html.escape(note)}</p>'
            f'<div class="figure">{_figure_html(fig, name)}</div></section>'
        )
    tables = report_tables(rep)
    sizes = per_size_rows(rep.get("by_size") or [])
    if sizes:
        runs = [Column("bench_run", "benchmark run")] if any(r["bench_run"] for r in sizes) else []
        runs = [Column("locality", "class")] + runs  # one table: locality and efficiency vs the link are columns
        vs_link = ([Column("median_efficiency_link", "vs link", fmt_num, True)]
                   if any(r.get("link") for r in sizes) else [])
        # a peak busbw above the device's physical cap is never shown bare: a column says so
        over = [r.get("peak_busbw_gbps") is not None and r.get("cap_gbps") is not None
                and r["peak_busbw_gbps"] > r["cap_gbps"] for r in sizes]
        if any(over):
            sizes = [dict(r, over_cap_note=f"! above the device's {fmt_num(r['cap_gbps'])} GB/s" if o else "")
                     for r, o in zip(sizes, over)]
        flag = [Column("over_cap_note", "physical cap", lambda v: v or "")] if any(over) else []
        tables.insert(0, Table(
            "Per op and message size", [
                Column("op", "op"), Column("group_size", "k", fmt_num, True), *runs,
                Column("bucket_bytes", "size", size_bucket_label, True),
                Column("count", "instances", fmt_num, True),
                Column("median_sync_time_ns", "median sync (µs)", fmt_us, True),
                Column("median_algbw_gbps", "median algbw (GB/s)", fmt_num, True),
                Column("median_busbw_gbps", "median busbw (GB/s)", fmt_num, True),
                Column("peak_busbw_gbps", "peak busbw (GB/s)", fmt_num, True), *flag,
                Column("median_predicted_ns", "model (µs)", fmt_us, True),
                Column("median_efficiency", "efficiency", fmt_num, True), *vs_link,
                Column("verdict", "verdict (most frequent)", lambda v: v or "—"),
            ], sizes, note="Power-of-two size buckets, as nccl-tests steps sizes; medians within a bucket, never "
                           "across sizes; model = the verdicts' reference; efficiency = model / measured.",
            id="per-size",
        ))
    if tables:
        sections.append('<section id="tk-sec-model"><h2>Measured vs model</h2>'
                        + "".join(_table_html(t) for t in tables) + "</section>")
    else:
        empty.append("Measured vs model")
    if rep.get("process_groups"):
        groups = Table("Per dimension", infer_columns(rep.get("by_dimension") or []), rep.get("by_dimension") or [],
                       id="by-dimension")
        shown = ("pg_name", "dimension", "group_size", "ops", "calls", "instances", "incomplete", "bytes",
                 "sync_time_ns", "overlap_fraction")  # the rest is in the JSON (fits 1400 px); no median across sizes
        per_group = Table("Per process group", [c for c in infer_columns(rep["process_groups"]) if c.key in shown],
                          rep["process_groups"],
                          note="dimension: the group's description (tp/pp/dp/ep/cp), else inferred from the run's "
                          "layout, else other; overlap: the part of its calls covered by compute.", id="process-groups")
        sections.append('<section id="tk-sec-groups"><h2>Process groups</h2>'
                        + _table_html(groups) + _table_html(per_group) + "</section>")
    if empty or not_drawn:
        line = (f'<p class="note">Nothing to show in this run for: {html.escape(", ".join(empty))}.</p>'
                if empty else "")
        sections.append(f'<section id="tk-sec-empty">{line}{"".join(not_drawn)}</section>')
    meta = "".join(_table_html(t) for t in metadata_tables(rep))
    warns = rep.get("warnings") or []
    warn_html = (
        '<h3>Warnings</h3><ul class="warnings">' + "".join(f"<li>{html.escape(w)}</li>" for w in warns) + "</ul>"
        if warns else '<p class="note">No warnings.</p>'
    )
    config = html.escape(json.dumps(run.get("config"), indent=2, default=str))
    sections.append(
        f'<section id="tk-sec-metadata"><h2>Run metadata</h2>{meta}{warn_html}'
        f"<details><summary>configuration</summary><pre>{config}</pre></details></section>"
    )
    facts = [f"workload {run.get('workload')}", f"backend {run.get('backend')}",
             f"{run.get('world_size')} ranks ({len(rep['ranks'])} ingested)", str(run.get("device_name") or "device unknown"),
             *run_versions(run),
             ("reference links: " + ", ".join(data["presets"])) if data.get("presets") else "no reference links"]
    header = (
        f"<header><h1>tracekit report — run {html.escape(str(run['run_id']))}</h1>"
        f'<div class="meta">{" · ".join(html.escape(f) for f in facts)}</div></header>'
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>tracekit report — {html.escape(str(run['run_id']))}</title>"
        f"<style>{_CSS}</style><script>{_ERROR_HOOK}</script>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f"{header}<main><pre id=\"tk-js-errors\" hidden></pre>{''.join(sections)}"
        f'<div id="tk-status" hidden></div></main><script>{_DONE_HOOK}</script></body></html>\n'
    )


def write_html_report(
    store: Store | str | os.PathLike | None,
    path: str | os.PathLike,
    run_id: str | None = None,
    link: str | None = None,
    presets: Sequence[str] | None = None,
    steps: int = 2,
    report: dict | None = None,
    con=None,
) -> Path:
    """Write the HTML report of ``run_id`` (default: the newest) to ``path``; returns the path.

    ``report``: an already built :func:`tracekit.report.data.build_report` dict of the run (reused);
    ``con``: the connection it was built on (reused, kept open; see :func:`html_data`).
    Written to a temporary file beside ``path`` and renamed. Raises StoreError for an empty
    store or unknown run, BadInputError for an unknown ``link``.
    """

    if link:
        from tracekit.model import link_from_preset

        link_from_preset(link)  # a bad name fails here, with the list of presets
    out = Path(path)
    if out.is_dir():
        raise BadInputError(f"{out}: is a directory; give the HTML file's name")
    if not out.parent.is_dir():
        raise BadInputError(f"{out}: its folder {out.parent} does not exist")
    page = render_html(html_data(store, run_id, link=link, presets=presets, steps=steps, report=report, con=con))
    from tracekit.store import atomic_output

    with atomic_output(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return out


# -- critical path (analyses/critical_path.py) ----------------------------------------------------

CRITICAL_PATH_SERIES = (
    # (part, legend label, colour): the composition of critical_path_summary
    ("compute", "compute", COMPUTE_COLOR),
    ("exposed_comm", "exposed communication", COMM_COLOR),
    ("memory", "memcpy/memset", MEMORY_COLOR),
    ("launch_cpu", "launch/CPU", "#fab005"),
    ("sync_other", "sync/other", "#868e96"),
    ("straggler", "other ranks (last to arrive)", "#f783ac"),
    ("idle", "idle", IDLE_COLOR),
)


def critical_path_figure(data: dict):
    """A Gantt-like strip per (step, rank) of its critical path (report['critical_path']['paths']):
    the pieces that tile the path in time, coloured by part; hover names the piece's longest event
    and the rank it ran on. None for a run without paths."""
    import plotly.graph_objects as go

    paths = ((data["report"].get("critical_path") or {}).get("paths")) or []
    if not paths:
        return None
    origin = min(p["start_ns"] for p in paths)
    unit, f = _time_unit(max(p["end_ns"] for p in paths) - origin)
    labels = [("" if p["step"] is None else f"step {p['step']} · ") + f"rank {p['rank']}" for p in paths]
    fig = go.Figure()
    for part, name, color in CRITICAL_PATH_SERIES:
        segs = [(lab, s) for lab, p in zip(labels, paths) for s in p["segments"] if s[2] == part]
        if not segs:
            continue
        fig.add_trace(go.Bar(
            orientation="h", y=[lab for lab, _ in segs], x=[(s[1] - s[0]) / f for _, s in segs],
            base=[(s[0] - origin) / f for _, s in segs], name=name, marker_color=color,
            marker_line=dict(width=0),
            customdata=[[s[3], s[4], s[5], fmt_us(s[1] - s[0])] for _, s in segs],
            hovertemplate=(name + ": %{customdata[3]} µs<br>%{customdata[0]} (%{customdata[1]} piece(s), "
                           "rank %{customdata[2]})<extra></extra>")))
    height = max(330, 150 + 34 * len(paths))
    _layout(fig, "Critical path per step and rank, coloured by what it is made of", barmode="overlay", height=height)
    _legend_under_title(fig, height, 130)
    fig.update_xaxes(title_text=f"time ({unit}) from the earliest path start")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(margin=dict(l=140))
    return fig


RUN_FIGURES = RUN_FIGURES + (
    ("critical-path", "Critical path", critical_path_figure,
     "Each strip is the chain of dependencies that ends at the rank's last event of the step: stream order, "
     "launch, host thread order, syncs, and collectives (an instance ends no earlier than its last arrival, so "
     "the path continues on the last-arriving rank: pink). Cross-stream and cross-thread waits are inferred "
     "(the op that ended last before); idle = a launched op on a free stream that nothing recorded held back "
     "(analyses/critical_path.py)."),
)


# -- when the job hangs (analyses/hang.py, report['hang']) ------------------------------------------

def hang_sections(rep: dict) -> list[str]:
    """The divergence point of a run with Flight Recorder dumps, first on the page: the triage's
    sentences (tracekit.report.data.hang_lines) and the diverging instances; [] without dumps."""
    from tracekit.report.data import hang_lines

    lines = hang_lines(rep)
    if not lines:
        return []
    bad = (rep.get("hang") or {}).get("diverging") or []
    ranks = lambda v: ", ".join(map(str, v or [])) or "—"  # noqa: E731
    table = Table("Diverging collectives", [
        Column("pg_name", "group"), Column("seq", "seq", numeric=True), Column("op", "op"),
        Column("match_state", "state"), Column("culprit_ranks", "culprits", ranks),
        Column("missing_ranks", "missing", ranks), Column("arrived_ranks", "arrived", ranks),
        Column("detail", "detail")], bad, id="hang-instances",
        note="Matched by (process group, seq) across the ranks' dumps; the first in arrival order is the divergence point.")
    body = "".join(f'<p class="note">{html.escape(l)}.</p>' for l in lines)
    return [f'<section id="tk-sec-hang"><h2>When the job hangs: divergence point</h2>{body}'
            + (_table_html(table) if bad else "") + "</section>"]


def remedies_table(remedies: list[dict]):
    """The remedies (tracekit.report.remedies.reference_remedies) as a :class:`Table`, one row
    each: what is weak, rule, why, fix."""
    rows = [dict(r, fix_text="; ".join(r["fix"])) for r in remedies]
    return Table(
        "Weak references and their remedies",
        [Column("weak", "what is weak"), Column("rule", "rule"), Column("why", "why"), Column("fix_text", "fix")],
        rows, note="Rules: tracekit/model/fit.py (judge_fit) and the reference order of tracekit/analyses/fit.py; "
                   "each fix is a command that would give a stronger reference.", id="remedies",
    )
