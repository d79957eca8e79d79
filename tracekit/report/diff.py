"""Run-to-run diff: two runs side by side per collective op and message-size bucket.

:func:`diff_runs` returns plain JSON-ready data (times in ns, bandwidths in GB/s with
GB = 1e9); ``tracekit diff RUN_A RUN_B`` renders it (``--json`` prints it as is).

Rows: one per (op, size bucket) present in either run. A bucket is the power-of-two range
``[2^k, 2^(k+1))`` bytes holding the instance's nccl-tests size (``tracekit.model.size_bucket``, the
one definition the report and HTML use too; size 0 is its own bucket, unknown sizes are ``unknown``).
Nothing is a median across sizes. Per run and row (the view ``collective_sizes_by_op``,
analyses/collective_sizes_by_op.sql, computes them; this module selects and renders):

- ``count``: matched collective instances (collective_bandwidth);
- ``median_sync_time_ns``, ``median_busbw_gbps``: medians over those instances; ``peak_busbw_gbps``:
  their largest busbw (GB/s);
- ``wait_ns``: total time ranks waited for the last arrival (collective_waits, summed over
  ranks and instances);
- ``comm_ns``: the ranks' communication spans of those instances (wait + transfer), summed;
  ``overlap_ns``: the part of them covered by compute (collective_overlap); ``exposed_comm_ns``
  = comm − overlap; ``overlap_ratio`` = overlap / comm (None when comm is 0). Spans of different
  instances on one rank may overlap each other, and the run's totals also hold unattributed
  communication, so per-row times need not add up to the totals.

``groups``: the process groups (for an nccl-tests log, its benchmark runs) the row's instances come
from; more than one means the medians pool them (the terminal says so under the table).

A run without a timeline (an nccl-tests log: no events, only each size's measured time) has no
wait, comm, compute or overlap: those are None for it (and its deltas), never 0.

``totals`` per run come from overlap_by_rank (sums over ranks of the whole-trace unions:
comm, compute, overlap, exposed comm; overlap_ratio = overlap / comm), with the change B − A.
Rows are ordered by the absolute change in ``comm_ns`` (the time the bucket costs), largest
first, then by the relative change of the median sync time.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tracekit.store import Store
from tracekit.report.textfmt import fmt_ms, fmt_num, fmt_pct, fmt_pp, fmt_us

_TIMELINE = ("wait_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "overlap_ratio")
"""Metrics only a run with a timeline has (None for a benchmark log)."""
_METRICS = ("count", "groups", "median_sync_time_ns", "median_busbw_gbps", "peak_busbw_gbps", "wait_ns", "comm_ns", "overlap_ns",
            "exposed_comm_ns", "overlap_ratio")
_TOTALS = ("ranks", "comm_ns", "compute_ns", "overlap_ns", "exposed_comm_ns", "overlap_ratio")


def size_bucket(size_bytes: int | None) -> dict[str, Any]:
    """The power-of-two bucket of a size (tracekit.model.size_bucket): {'lo_bytes', 'hi_bytes', 'label'},
    hi exclusive. ``size_bucket(131072)`` → lo 131072, hi 262144, label ``'128 KiB–256 KiB'``; 0 → the
    bucket ``'0 B'``; None → ``'unknown'``."""
    from tracekit.model import size_bucket as lo_of

    return _bucket(lo_of(size_bytes))


def _bucket(lo: int | None) -> dict[str, Any]:
    from tracekit.model import size_bucket_label

    hi = None if lo is None else (1 if lo == 0 else 2 * lo)
    return {"lo_bytes": lo, "hi_bytes": hi, "label": size_bucket_label(lo)}


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _rows(con, run_id: str, timeline: bool) -> dict[tuple, dict]:
    """(op, bucket) → the row of collective_sizes_by_op (analyses/collective_sizes_by_op.sql) for
    ``run_id``, the timeline's metrics None when the run has no timeline."""
    cur = con.execute("SELECT * EXCLUDE (run_id) FROM collective_sizes_by_op WHERE run_id = ?", [run_id])
    cols = [d[0] for d in cur.description]
    out = {}
    for rec in cur.fetchall():
        r = {c: _finite(v) for c, v in zip(cols, rec)}
        if not timeline:
            r.update(dict.fromkeys(_TIMELINE))
        out[(r["op"], r["bucket_bytes"])] = r
    return out


def _totals(con, run_id: str, timeline: bool) -> dict[str, Any]:
    if not timeline:
        ranks = con.execute("SELECT count(*) FROM ranks WHERE run_id = ?", [run_id]).fetchone()[0]
        return dict(ranks=int(ranks), **dict.fromkeys(_TOTALS[1:]))
    cur = con.execute("SELECT * EXCLUDE (run_id) FROM run_comm_totals WHERE run_id = ?", [run_id])
    return dict(zip([d[0] for d in cur.description], cur.fetchone()))  # analyses/collective_sizes_by_op.sql


def _delta(a, b):
    if a is None or b is None:
        return None
    return b - a


def _rel(a, b):
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a


def diff_runs(store: Store | str | None, run_a: str, run_b: str) -> dict[str, Any]:
    """Compare run ``run_a`` (before) with ``run_b`` (after); both in ``store``.

    Returns ``{'run_a': {...}, 'run_b': {...}, 'totals': {'a', 'b', 'delta'}, 'rows': [...]}``;
    each row has ``op``, ``bucket`` (lo_bytes, hi_bytes, label), ``a`` and ``b`` (the metrics of
    the module docstring, None where the run has no such collective), ``delta`` (B − A per
    metric) and ``sync_time_change`` (relative change of the median sync time).
    Raises StoreError when a run is not in the store.
    """
    st = store if isinstance(store, Store) else Store(store)
    for rid in (run_a, run_b):
        if not st.has_run(rid):
            raise st.missing_run(rid)
    from tracekit import analyses

    con = analyses.connect(st, run_ids=sorted({run_a, run_b}))
    try:
        meta = {}
        for rid in (run_a, run_b):
            rec = con.execute(
                "SELECT run_id, workload, backend, world_size, device_name, config, source FROM runs WHERE run_id = ?", [rid]
            ).fetchone()
            meta[rid] = dict(zip(("run_id", "workload", "backend", "world_size", "device_name"), rec[:5]))
            meta[rid]["source"] = rec[6]
            meta[rid]["ranks_ingested"] = [r for (r,) in con.execute(
                "SELECT DISTINCT rank FROM ranks WHERE run_id = ? AND rank IS NOT NULL ORDER BY rank", [rid]).fetchall()]
            meta[rid]["timeline"] = bool(con.execute(
                "SELECT coalesce(sum(events), 0) > 0 FROM ranks WHERE run_id = ?", [rid]).fetchone()[0])
        ra, rb = _rows(con, run_a, meta[run_a]["timeline"]), _rows(con, run_b, meta[run_b]["timeline"])
        ta, tb = _totals(con, run_a, meta[run_a]["timeline"]), _totals(con, run_b, meta[run_b]["timeline"])
    finally:
        con.close()
    rows = []
    for key in set(ra) | set(rb):
        a, b = ra.get(key), rb.get(key)
        pick = lambda r: None if r is None else {m: r[m] for m in _METRICS}  # noqa: E731
        pa_, pb = pick(a), pick(b)
        absent = lambda rid: {"count": 0, **{m: 0 if meta[rid]["timeline"] else None  # noqa: E731
                                             for m in ("wait_ns", "comm_ns", "overlap_ns", "exposed_comm_ns")}}
        za, zb = pa_ or absent(run_a), pb or absent(run_b)
        delta = {m: _delta(za.get(m), zb.get(m)) for m in _METRICS if m != "groups"}
        rows.append(
            dict(
                op=key[0], bucket=_bucket(key[1]), a=pa_, b=pb, delta=delta,
                sync_time_change=_rel(za.get("median_sync_time_ns"), zb.get("median_sync_time_ns")),
            )
        )

    def rank_key(r):
        return (
            -abs(r["delta"]["comm_ns"] or 0),
            -abs(r["sync_time_change"] or 0),
            r["op"],
            r["bucket"]["lo_bytes"] if r["bucket"]["lo_bytes"] is not None else -1,
        )

    rows.sort(key=rank_key)
    return dict(
        warnings=comparability_warnings(meta[run_a], meta[run_b]),
        run_a=meta[run_a],
        run_b=meta[run_b],
        totals=dict(a=ta, b=tb, delta={k: _delta(ta[k], tb[k]) for k in _TOTALS}),
        rows=rows,
    )


def _rank_list(ranks: list[int]) -> str:
    """``[1, 2, 3, 5]`` → ``'1–3, 5'``: runs of consecutive ranks as ranges."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}–{ranks[j]}")
        i = j + 1
    return ", ".join(out)


def completeness(meta: dict) -> tuple[int, int | None, list[int]]:
    """A run's (ranks ingested, world size, ranks missing) from :func:`diff_runs`' run meta. A
    benchmark log (source ``nccl_tests``) is one file for every rank: never incomplete."""
    got, ws = meta.get("ranks_ingested") or [], meta.get("world_size")
    if meta.get("source") == "nccl_tests" or not ws:
        return len(got), ws, []
    return len(got), ws, sorted(set(range(int(ws))) - set(got))


def comparability_warnings(a: dict, b: dict) -> list[str]:
    """One line per way runs A and B (:func:`diff_runs`' run meta) are not alike, so that a
    difference in their numbers may not be the change under test: the hardware (device name), the
    rank count (world size), the completeness (ranks ingested out of the world size; a missing rank
    takes its time out of the totals and hides the waits it caused). An unknown value on one side
    only is a warning too (it cannot be compared). Empty when the runs are alike."""
    out = []
    da, db = a.get("device_name"), b.get("device_name")
    if da != db:
        out.append(f"hardware differs: A ({a['run_id']}) ran on {da or 'an unrecorded device'}, "
                   f"B ({b['run_id']}) on {db or 'an unrecorded device'}: a change may be the hardware's")
    wa, wb = a.get("world_size"), b.get("world_size")
    if wa != wb:
        out.append(f"rank count differs: A has {wa if wa else 'an unrecorded number of'} ranks, "
                   f"B {wb if wb else 'an unrecorded number of'}: collectives over more ranks cost more")
    (na, _, ma), (nb, _, mb) = completeness(a), completeness(b)
    if bool(ma) != bool(mb) or (ma and mb and (na, ma) != (nb, mb)):
        def says(side, meta, n, missing):
            if not missing:
                return f"{side} has all its {n} ranks"
            return (f"{side} has {n} of {meta['world_size']} ranks (missing {_rank_list(missing)})")
        out.append(f"completeness differs: {says('A', a, na, ma)}, {says('B', b, nb, mb)}: totals sum different "
                   "ranks, and the waits a missing rank caused are not seen")
    return out


def print_diff(diff: dict, console=None) -> None:
    """Render a :func:`diff_runs` result as rich tables (A → B side by side, Δ after)."""
    from rich.table import Table

    from rich.text import Text

    from tracekit.report.textfmt import fit_table, literal, output_console

    console = console or output_console(160)
    a_id, b_id = diff["run_a"]["run_id"], diff["run_b"]["run_id"]
    console.print(Text.assemble(("diff", "bold"), literal(
        f" A = {a_id} ({diff['run_a'].get('workload')}, {diff['run_a'].get('world_size')} ranks)"
        f"  →  B = {b_id} ({diff['run_b'].get('workload')}, {diff['run_b'].get('world_size')} ranks)")))
    for w in diff.get("warnings") or []:
        console.print(Text("warning: " + w))
    for side, meta in (("A", diff["run_a"]), ("B", diff["run_b"])):
        if meta.get("timeline") is False:
            console.print(f"{side} ({meta['run_id']}) has no timeline (a benchmark log: each size's measured time only): "
                          "its comm, compute, overlap and wait are — (unknown, not 0)")
    t = Table(title="Run totals (sums over ranks of the whole-trace overlap, overlap_by_rank)")
    for col in ("", "A", "B", "Δ (B − A)"):
        t.add_column(col, justify="left" if not col else "right")
    ta, tb, td = diff["totals"]["a"], diff["totals"]["b"], diff["totals"]["delta"]
    for key, label in (("comm_ns", "comm ms"), ("compute_ns", "compute ms"), ("overlap_ns", "overlap ms"),
                       ("exposed_comm_ns", "exposed comm ms")):
        t.add_row(label, fmt_ms(ta[key]), fmt_ms(tb[key]), fmt_ms(td[key], signed=True))
    t.add_row("overlap ratio", fmt_pct(ta["overlap_ratio"]), fmt_pct(tb["overlap_ratio"]),
              fmt_pp(td["overlap_ratio"]))
    fit_table(t, console.width)
    console.print(t)
    t = Table(title="Per op and size bucket (largest change in time spent first)")
    for col in ("op", "size", "count A→B", "median sync µs A→B", "Δ sync", "busbw GB/s A→B", "wait ms A→B",
                "overlap A→B", "exposed ms A→B", "Δ comm ms"):
        t.add_column(col, justify="left" if col in ("op", "size") else "right", no_wrap=col == "op")
    for r in diff["rows"]:
        a, b = r["a"] or {}, r["b"] or {}
        t.add_row(
            r["op"], r["bucket"]["label"],
            f"{a.get('count', 0)} → {b.get('count', 0)}",
            f"{fmt_us(a.get('median_sync_time_ns'))} → {fmt_us(b.get('median_sync_time_ns'))}",
            fmt_pct(r["sync_time_change"], signed=True),
            f"{fmt_num(a.get('median_busbw_gbps'))} → {fmt_num(b.get('median_busbw_gbps'))}",
            f"{fmt_ms(a.get('wait_ns'))} → {fmt_ms(b.get('wait_ns'))}",
            f"{fmt_pct(a.get('overlap_ratio'))} → {fmt_pct(b.get('overlap_ratio'))}",
            f"{fmt_ms(a.get('exposed_comm_ns'))} → {fmt_ms(b.get('exposed_comm_ns'))}",
            fmt_ms(r["delta"]["comm_ns"], signed=True),
        )
    fit_table(t, console.width)
    console.print(t)
    console.print("comm and exposed per row sum each call's span: calls that run at once (two streams, two groups) "
                  "count once each, so rows can add up to more than the run totals, which are unions")
    pooled = [f"{side} {r['op']} {r['bucket']['label']}: {r[k]['groups']}" for r in diff["rows"]
              for side, k in (("A", "a"), ("B", "b")) if r[k] and (r[k].get("groups") or 0) > 1]
    if pooled:
        console.print("Rows whose medians pool several process groups / benchmark runs (count): " + "; ".join(pooled))


# ---------------------------------------------------------------------------------------------
# CI gate: `tracekit diff BASE NEW --fail-on EXPR ...`
# ---------------------------------------------------------------------------------------------

GATE_METRICS: dict[str, tuple[str, str, str]] = {
    # name: (where, key in the diff, kind of absolute threshold)
    "exposed_comm": ("totals", "exposed_comm_ns", "time"),
    "comm": ("totals", "comm_ns", "time"),
    "compute": ("totals", "compute_ns", "time"),
    "overlap": ("totals", "overlap_ns", "time"),
    "overlap_ratio": ("totals", "overlap_ratio", "ratio"),
    "busbw": ("rows", "median_busbw_gbps", "rate"),
    "peak_busbw": ("rows", "peak_busbw_gbps", "rate"),
    "sync_time": ("rows", "median_sync_time_ns", "time"),
    "wait": ("rows", "wait_ns", "time"),
    "row_exposed_comm": ("rows", "exposed_comm_ns", "time"),
}
"""The metrics a ``--fail-on`` rule may name, over :func:`diff_runs`'s result.

``totals`` metrics are one number per run (sums over ranks of overlap_by_rank; ns, overlap_ratio a
fraction); ``rows`` metrics are judged on every (op, size bucket) row present in both runs (medians
of collective_bandwidth in ns or GB/s with GB = 1e9, sums of collective_waits / the ranks' spans in
ns), and the rule fails when any row breaks it."""

GATE_GRAMMAR = (
    "METRIC>CHANGE or METRIC<CHANGE, CHANGE a signed number with a unit: % (relative to the base run: "
    "'exposed_comm>+5%', 'busbw<-10%'), a time for time metrics ('comm>+2ms': ns, us, ms, s), GB/s for "
    "busbw and peak_busbw ('busbw<-5GB/s'), pp for overlap_ratio ('overlap_ratio<-10pp'); metrics: "
    + ", ".join(GATE_METRICS)
)
"""The ``--fail-on`` grammar, as the CLI's help and its errors state it."""

_RULE_RE = re.compile(r"^\s*([a-z_]+)\s*([<>])\s*([+-]?)\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(\S*)\s*$")
"""A rule: METRIC, < or >, sign, number, unit (checked against the metric in :func:`parse_fail_on`)."""


def parse_fail_on(expr: str) -> dict[str, Any]:
    """One ``--fail-on`` rule → ``{'expr', 'metric', 'op' ('>'|'<'), 'relative' (bool), 'threshold',
    'unit'}``. ``threshold`` is a fraction for ``%`` (+5% → 0.05), ns for times, GB/s for rates and a
    fraction for ``pp`` (−10pp → −0.10). Raises BadInputError (one line, naming the rule and
    :data:`GATE_GRAMMAR`) for anything else."""
    from tracekit.errors import BadInputError
    from tracekit.model.units import parse_bandwidth, parse_time

    m = _RULE_RE.match(expr or "")

    def bad(why: str):
        return BadInputError(f"--fail-on {expr!r}: {why} (grammar: {GATE_GRAMMAR})")

    if not m:
        raise bad("not METRIC>CHANGE or METRIC<CHANGE")
    metric, op, sign, number, unit = m.groups()
    if metric not in GATE_METRICS:
        raise bad(f"unknown metric {metric!r}")
    kind = GATE_METRICS[metric][2]
    mag = float(number)
    neg = sign == "-"
    if unit == "%":
        value, relative = mag / 100.0, True
    elif unit == "pp":
        if kind != "ratio":
            raise bad(f"pp (percentage points) applies to overlap_ratio only, not {metric}")
        value, relative = mag / 100.0, False
    elif kind == "time" and unit:
        value, relative = parse_time(f"{number}{unit}") * 1e9, False
    elif kind == "rate" and unit:
        value, relative = parse_bandwidth(f"{number}{unit}") / 1e9, False
    else:
        want = {"time": "% or a time unit (ns, us, ms, s)", "rate": "% or GB/s", "ratio": "% or pp"}[kind]
        raise bad(f"{metric} needs a unit: {want}" if not unit else f"unit {unit!r} does not fit {metric}: {want}")
    return dict(expr=expr.strip(), metric=metric, op=op, relative=relative,
                threshold=-value if neg else value, unit=unit)


def _change(a, b, relative: bool):
    """(change, from_zero): B − A, or (B − A) / A for a relative rule; a relative change from A = 0
    is ±inf when B ≠ 0 (from_zero True), 0 when B = 0."""
    if a is None or b is None:
        return None, False
    if not relative:
        return b - a, False
    if a == 0:
        return (0.0, False) if b == 0 else (math.copysign(math.inf, b), True)
    return (b - a) / a, False


def evaluate_gate(diff: dict, rules: list[dict]) -> dict[str, Any]:
    """Judge :func:`diff_runs`'s result against parsed rules (:func:`parse_fail_on`).

    A rule ``METRIC>X`` fails where the change B − A (relative: (B − A) / A) is greater than X;
    ``METRIC<X`` where it is less. Totals metrics give one check, rows metrics one per (op, size
    bucket) row present in both runs. Returns ``{'passed': bool, 'rules': [{'expr', 'metric',
    'checked' (int), 'failed' (int), 'not_judged' (reason or None)}], 'failures': [{'expr',
    'metric', 'op', 'bucket' (label; None for totals), 'a', 'b', 'change' (fraction or absolute in
    the rule's unit; None when relative from 0), 'from_zero', 'threshold'}]}``. A rule with nothing
    to judge (a benchmark log has no exposed comm; no row in both runs) fails nothing and says why
    in ``not_judged``."""
    out_rules, failures = [], []
    for rule in rules:
        where, key, _kind = GATE_METRICS[rule["metric"]]
        if where == "totals":
            cand = [(None, None, diff["totals"]["a"].get(key), diff["totals"]["b"].get(key))]
        else:
            cand = [(r["op"], r["bucket"]["label"], (r["a"] or {}).get(key), (r["b"] or {}).get(key))
                    for r in diff["rows"] if r["a"] is not None and r["b"] is not None]
        checked = failed = 0
        for op, label, a, b in cand:
            ch, from_zero = _change(a, b, rule["relative"])
            if ch is None:
                continue
            checked += 1
            broken = ch > rule["threshold"] if rule["op"] == ">" else ch < rule["threshold"]
            if broken:
                failed += 1
                failures.append(dict(expr=rule["expr"], metric=rule["metric"], op=op, bucket=label, a=a, b=b,
                                     change=None if from_zero else ch, from_zero=from_zero,
                                     relative=rule["relative"], threshold=rule["threshold"]))
        why = None
        if checked == 0:
            if where == "totals":
                why = "a run has no timeline (a benchmark log): no comm, compute or overlap to compare"
            else:
                why = "no (op, size bucket) row is in both runs with this metric"
        out_rules.append(dict(expr=rule["expr"], metric=rule["metric"], checked=checked, failed=failed,
                              not_judged=why))
    return dict(passed=not failures, rules=out_rules, failures=failures)


def _gate_value(metric: str, v) -> str:
    kind = GATE_METRICS[metric][2]
    if v is None:
        return "—"
    if kind == "time":
        return fmt_ms(v) + " ms"
    if kind == "rate":
        return fmt_num(v) + " GB/s"
    return fmt_pct(v)


def print_gate(gate: dict, console=None) -> None:
    """Render :func:`evaluate_gate`'s result: one line per rule, then the offending rows."""
    from rich.table import Table

    from tracekit.report.textfmt import fit_table, output_console

    con = console or output_console(160)
    for r in gate["rules"]:
        if r["not_judged"]:
            con.print(f"gate {r['expr']}: not judged — {r['not_judged']}")
        else:
            state = "FAIL" if r["failed"] else "ok"
            con.print(f"gate {r['expr']}: {state} ({r['failed']} of {r['checked']} checks broke it)")
    if gate["failures"]:
        t = Table(title="Regressions (rules broken: base A → new B)")
        for col in ("rule", "op", "size", "A", "B", "change"):
            t.add_column(col, justify="right" if col in ("A", "B", "change") else "left")
        for f in gate["failures"]:
            if f["from_zero"]:
                ch = "from 0"
            elif f["relative"]:
                ch = fmt_pct(f["change"], signed=True)
            elif GATE_METRICS[f["metric"]][2] == "ratio":
                ch = fmt_pp(f["change"])
            elif GATE_METRICS[f["metric"]][2] == "time":
                ch = fmt_ms(f["change"], signed=True) + " ms"
            else:
                ch = f"{f['change']:+.2f} GB/s"
            t.add_row(f["expr"], f["op"] or "(run total)", f["bucket"] or "", _gate_value(f["metric"], f["a"]),
                      _gate_value(f["metric"], f["b"]), ch)
        fit_table(t, con.width)
        con.print(t)
    con.print("gate: " + ("passed" if gate["passed"] else f"FAILED ({len(gate['failures'])} regressions)"))
