"""The report's "At a glance": the short answer that opens the terminal report, ``--json``'s
``summary`` and the HTML page. Built once per report (:func:`glance_summary`, called by
``tracekit.report.data.build_report``), rendered as sentences by :func:`glance_lines`.

Times in ns, fractions 0..1. Every value the input cannot support is None, with the reason in
``not_judged``.
"""

from __future__ import annotations

import math
from typing import Any

from tracekit.report.textfmt import fmt_ms, fmt_pct, fmt_size, fmt_us

WORST = 3
"""Collectives listed at a glance."""


def _mean(rows: list[dict], key: str):
    """Mean of ``key`` over ``rows``; None when any row lacks it (a partial mean would mislead)."""
    vals = [r.get(key) for r in rows]
    if not vals or any(v is None for v in vals):
        return None
    return sum(vals) / len(vals)


def step_summary(report: dict) -> tuple[dict | None, str | None]:
    """(step, reason): the mean step over ranks and profiled steps, or (None, why not).

    From ``gpu_time_breakdown.by_step`` (analyses/gpu_time_breakdown.py; its parts sum to the
    step's GPU window): ``step_ns`` (the window), ``compute_ns`` (compute only), ``comm_exposed_ns``,
    ``comm_hidden_ns`` (communication under compute), ``memory_ns``, ``sync_other_ns`` (sync + other), ``idle_ns``, and ``steps``,
    ``ranks``. Without GPU steps but with ``measured_vs_model`` rows (CPU-only ranks), the step's
    wall time is unknown: ``step_ns`` None and ``compute_ns``/``comm_exposed_ns`` from those rows."""
    if report["run"].get("source") == "nccl_tests":
        return None, "a nccl-tests log holds per-size averages: no training step, no timeline"
    by_step = (report.get("gpu_time_breakdown") or {}).get("by_step") or []
    if by_step:
        out = dict(steps=len({r["step"] for r in by_step}), ranks=len({r["rank"] for r in by_step}),
                   basis="GPU window per rank and profiled step (analyses/gpu_time_breakdown.py)")
        out["step_ns"] = _mean(by_step, "window_ns")
        for key, src in (("compute_ns", "compute_only_ns"), ("comm_exposed_ns", "comm_exposed_ns"),
                         ("comm_hidden_ns", "comm_hidden_ns"), ("memory_ns", "memory_ns"), ("idle_ns", "idle_ns")):
            out[key] = _mean(by_step, src)
        so = [(r.get("sync_ns") or 0) + (r.get("other_ns") or 0) for r in by_step]
        out["sync_other_ns"] = sum(so) / len(so)
        return out, None
    mvm = [r for r in report.get("measured_vs_model") or [] if r.get("steps")]
    if mvm:
        return dict(steps=max(r["steps"] for r in mvm), ranks=len(mvm), step_ns=None,
                    compute_ns=_mean(mvm, "compute_ns"), comm_exposed_ns=_mean(mvm, "exposed_ns"),
                    comm_hidden_ns=_mean(mvm, "overlap_ns"), memory_ns=None, sync_other_ns=None, idle_ns=None,
                    basis="per-step means of measured_vs_model (no GPU timeline: the step's wall time is unknown)"), \
            "no GPU timeline (CPU-only ranks): the step's wall time and idle time are not measured"
    return None, "no profiler steps holding communication in the traces"


def exposed_summary(report: dict) -> tuple[dict | None, str | None]:
    """(exposed, reason): exposed communication per step, mean over ranks, and its parts.

    From ``measured_vs_model`` (analyses/measured_vs_model.py): exposed = predicted exposed + gap,
    gap = skew + transfer + exposure (its decomposition). Parts (ns, they sum to ``exposed_ns``):
    ``straggler_wait_ns`` = the gap's skew part (waiting for the last rank to arrive);
    ``transfer_ns`` = the model's predicted exposed time + the gap's transfer part (moving the data,
    as the α–β model predicts it plus what the measurement takes beyond it); ``not_hidden_ns`` = the
    gap's exposure part (what the run's overlap model would hide but was not; negative when more was
    hidden than it assumes). ``*_share`` = part / exposed. The skew part is None when waits cannot be
    measured (one rank of a group recorded). Also ``comm_ns``, ``predicted_exposed_ns``, ``ranks``,
    ``model`` (the overlap model) and ``reference`` (where the first rank's α/β came from, ab_source)."""
    rows = [r for r in report.get("measured_vs_model") or [] if r.get("steps")]
    if not rows:
        if report["run"].get("source") == "nccl_tests":
            return None, "a nccl-tests log has no timeline: nothing is hidden or exposed"
        return None, "no profiled step holds communication"
    exposed = _mean(rows, "exposed_ns")
    out = dict(exposed_ns=exposed, comm_ns=_mean(rows, "comm_ns"), ranks=len(rows),
               predicted_exposed_ns=_mean(rows, "predicted_exposed_ns"), model=rows[0].get("model"),
               reference=rows[0].get("ab_source"))
    skew, transfer, exposure = (_mean(rows, k) for k in ("gap_skew_ns", "gap_transfer_ns", "gap_exposure_ns"))
    out["straggler_wait_ns"] = skew
    pred = out["predicted_exposed_ns"]
    out["transfer_ns"] = None if pred is None or transfer is None else pred + transfer
    out["not_hidden_ns"] = exposure
    for k in ("straggler_wait_ns", "transfer_ns", "not_hidden_ns"):
        v = out[k]
        out[k.replace("_ns", "_share")] = v / exposed if v is not None and exposed else None
    reason = None
    if skew is None:
        reason = ("waiting for stragglers: not measurable (fewer than two ranks of a group recorded its calls), "
                  "so transfer and not-hidden are not split either")
    return out, reason


def _worst_rows(con, report: dict, steps: int | None) -> tuple[list[dict], str]:
    """(rows, basis): the WORST collectives per (op, group size, size bucket) of the report's
    verdicts (the temp table ``__report_verdicts`` of build_report). A run with a timeline: by cost
    to the step, Σ sync time / steps (sync time includes waiting; over the whole trace when steps are
    unknown) plus Σ of each instance's mean wait over its ranks (collective_waits), ``cost_ns``. A
    log: by distance from the reference, −ln(efficiency) (predicted / measured) over the sizes slower
    than it, the worst bucket of each op. Each row: op, group_size, bucket_bytes, count, sync_ns and
    wait_ns (Σ per step, per trace or, for a log, the per-call time; ``per`` says which; wait None
    when not measurable), predicted_ns (likewise; None when no reference), median efficiency,
    verdict (most frequent; ties: the first by name), reference, basis (verdict_basis)."""
    is_log = report["run"].get("source") == "nccl_tests"
    rows = [dict(zip(("op", "group_size", "bucket_bytes", "count", "sync_ns", "wait_ns", "predicted_ns", "efficiency",
                      "verdict", "reference", "basis"), r)) for r in con.execute(
        # float sums in one fixed order (an instance's key), so that the last digit is the same in every run
        """WITH w AS (SELECT pg_name, win, seq, avg(wait_ns) AS wait_ns FROM collective_waits WHERE run_id = ?
                     GROUP BY ALL)
           SELECT v.op, v.group_size, v.bucket_bytes, count(*), sum(v.sync_time_ns ORDER BY v.pg_name, v.win, v.seq),
                  sum(w.wait_ns ORDER BY v.pg_name, v.win, v.seq),
                  CASE WHEN count(v.predicted_ns) = count(*) THEN sum(v.predicted_ns ORDER BY v.pg_name, v.win, v.seq)
                  END, median(v.efficiency),
                  _most_common(list(v.verdict)), _most_common(list(v.reference)), _most_common(list(v.verdict_basis))
           FROM __report_verdicts v LEFT JOIN w USING (pg_name, win, seq)
           WHERE v.op IS NOT NULL AND v.sync_time_ns IS NOT NULL GROUP BY ALL""",
        [report["run"]["run_id"]]).fetchall()]
    if is_log:
        # slower than the reference only: an efficiency above 1 is a pessimistic reference, not a slow call
        rows = [r for r in rows if r["efficiency"] and 0 < r["efficiency"] < 1 and r["bucket_bytes"]]
        for r in rows:
            r["distance"] = -math.log(r["efficiency"])
            r["wait_ns"] = None
        best: dict[str, dict] = {}
        for r in sorted(rows, key=lambda r: (-r["distance"], r["op"], r["bucket_bytes"])):
            best.setdefault(r["op"], r)
        worst = sorted(best.values(), key=lambda r: (-r["distance"], r["op"]))[:WORST]
        for r in worst:
            r["sync_ns"] = r["sync_ns"] / r["count"]  # the log's per-size average time
            r["predicted_ns"] = None if r["predicted_ns"] is None else r["predicted_ns"] / r["count"]
            r["per"] = "call"
        return worst, "distance from the reference (−ln efficiency, slower sizes only), the worst size of each op"
    div = steps or 1
    for r in rows:
        # a rank's time in the call: the mean wait for the last arrival, then the sync time
        r["sync_ns"] /= div
        r["wait_ns"] = None if r["wait_ns"] is None else r["wait_ns"] / div
        r["cost_ns"] = r["sync_ns"] + (r["wait_ns"] or 0)
        r["predicted_ns"] = None if r["predicted_ns"] is None else r["predicted_ns"] / div
        r["per"] = "step" if steps else "trace"
    worst = sorted(rows, key=lambda r: (-r["cost_ns"], r["op"], r["bucket_bytes"] or 0))[:WORST]
    return worst, "cost to the step: Σ (mean wait + sync time) " + ("per step" if steps else "over the trace")


def _recommendation(report: dict, exposed: dict | None) -> dict | None:
    """The top recommendation the data supports: the largest positive part of the exposed
    communication's gap to the model (measured_vs_model's decomposition), with that part as the
    saving the model predicts (ns per step); else the most degraded group (group_plateau), without a
    saving; else the first remedy of a weak reference (tracekit.report.remedies), without a saving."""
    if exposed:
        parts = [(exposed.get("straggler_wait_ns"), "straggler"), (None if exposed.get("transfer_ns") is None else
                 exposed["transfer_ns"] - (exposed.get("predicted_exposed_ns") or 0), "transfer"),
                 (exposed.get("not_hidden_ns"), "exposure")]
        parts = [(v, k) for v, k in parts if v is not None and v > 0]
        if parts:
            v, k = max(parts)
            if k == "straggler":
                top = (report.get("straggler_ranks") or [{}])[0]
                who = (f"rank {top['rank']} arrives last {top['times_last']} time(s) and imposes "
                       f"{fmt_ms(top['wait_caused_ns'])} ms of waiting on the others" if top.get("rank") is not None
                       else "the last rank to arrive")
                return dict(kind="straggler", saving_ns=v, text=(
                    f"balance the work before the collectives: {who} (see Stragglers by rank)"))
            if k == "transfer":
                weak = (f" (the reference, {exposed.get('reference')}, is weak: see the remedies)"
                        if report.get("remedies") and exposed.get("reference") else "")
                return dict(kind="transfer", saving_ns=v, text=(
                    f"the collectives take longer than the α–β reference predicts{weak}: check the link (tracekit "
                    "analyze --link PRESET), the algorithm (tracekit predict), and calibrate (tracekit collect sweep)"))
            return dict(kind="exposure", saving_ns=v, text=(
                f"overlap communication with compute: the run's overlap model ({exposed.get('model')}) would hide "
                "this much more (e.g. DDP bucketing, async_op=True with the wait after independent compute)"))
    degraded = _worst_degraded(report.get("degraded_links") or [])
    if degraded:
        return degraded
    for r in report.get("remedies") or []:
        fix = (r.get("fix") or [None])[0]
        return dict(kind="reference", saving_ns=None, text=f"{r['weak']}: {fix}" if fix else r["weak"])
    return None


def _worst_degraded(rows: list[dict]) -> dict | None:
    """The recommendation for the most degraded group of group_plateau's flagged rows (the lowest of
    its ratios on its bases: peers, node pairs, model), without a saving; None when none is flagged."""
    best = None
    for d in rows:
        basis = (d.get("degraded_basis") or "").split(",")
        for b, ratio, what in (("peers", d.get("peer_ratio"), f"its peers' {d.get('peer_busbw_gbps') or 0:.1f} GB/s"),
                               ("pairs", d.get("pair_ratio"), f"its node pairs' {d.get('pair_busbw_gbps') or 0:.1f} GB/s"),
                               ("model", d.get("model_ratio"), f"{d.get('model')} ({d.get('model_busbw_gbps') or 0:.1f} GB/s)")):
            if b in basis and ratio is not None and (best is None or ratio < best[0]):
                best = (ratio, what, b, d)
    if best is None:
        return None
    ratio, what, b, d = best
    ask = ("the fabric under the whole group's traffic: compare its routing and oversubscription with the pairs'"
           if b == "pairs" else "a link degraded or misconfigured: check the group's NICs and NVLink")
    return dict(kind="degraded", saving_ns=None, text=(
        f"{d['op']} on {d['group_size']} ranks over {d['nodes'] or '?'} host(s) reaches {ratio:.0%} of {what} "
        f"at large messages: {ask} (see the warnings)"))


def glance_summary(con, report: dict) -> dict[str, Any]:
    """The report's ``summary`` key (JSON), from the report's other keys and the verdicts table.

    Keys: ``step`` (:func:`step_summary`, or None), ``exposed`` (:func:`exposed_summary`, or None),
    ``worst`` (up to WORST rows, :func:`_worst_rows`) and ``worst_basis`` (how they were ranked),
    ``recommendation`` (kind, text, saving_ns per step or None), ``not_judged`` (one sentence
    each: what could not be judged and why)."""
    not_judged: list[str] = []
    step, why = step_summary(report)
    if why:
        not_judged.append(f"step time: {why}")
    exposed, why = exposed_summary(report)
    if why:
        not_judged.append(f"exposed communication: {why}")
    worst, basis = _worst_rows(con, report, step["steps"] if step else None)
    for r in report.get("references") or []:
        if r.get("kind") is None:
            not_judged.append(f"{r['op']} on {r['group_size']} ranks ({r['instances']} instance(s)): no verdict, "
                              f"{r.get('no_model_reason') or 'no reference'}")
    weak = report.get("remedies") or []
    if weak:
        not_judged.append(f"{len(weak)} weak reference(s) (rejected fits, assumed presets): their verdicts are "
                          "against a weaker reference — see 'Weak references and their remedies'")
    run = report["run"]
    if run.get("source") != "nccl_tests" and run.get("world_size") and len(report["ranks"]) < run["world_size"]:
        not_judged.append(f"only {len(report['ranks'])} of {run['world_size']} ranks ingested: waits, skew and "
                          "stragglers of the others are unknown")
    for key, reason in (report.get("null_reasons") or {}).items():
        if key != "collectives.total_wait_ns" or run.get("source") != "nccl_tests":
            not_judged.append(f"{key}: {reason}")
    return dict(step=step, exposed=exposed, worst=worst, worst_basis=basis,
                recommendation=_recommendation(report, exposed), not_judged=not_judged)


def worst_line(r: dict) -> str:
    """One row of ``summary['worst']`` as a sentence fragment."""
    ref = r.get("reference") or "no reference"
    eff = "—" if r.get("efficiency") is None else f"{r['efficiency']:.2f}"
    per = {"call": "per call", "step": "per step", "trace": "over the trace"}[r["per"]]
    model = "" if r.get("predicted_ns") is None else f"model {fmt_us(r['predicted_ns'])} µs"
    if r["per"] == "call":
        cost = f"{fmt_us(r['sync_ns'])} µs {per} ({model or 'no model'})"
    else:
        cost = (f"{fmt_us(r['cost_ns'])} µs {per} = wait {fmt_us(r.get('wait_ns'))} + sync {fmt_us(r['sync_ns'])} "
                f"({model or 'no model'})")
    return (f"{r['op']} k={r['group_size'] if r['group_size'] is not None else '—'} size ≥ {fmt_size(r['bucket_bytes'])}: "
            f"{cost}, efficiency {eff}, {r.get('verdict') or 'no verdict'} "
            f"against {ref}" + (f" [{r['basis']}]" if r.get("basis") else ""))


def glance_lines(summary: dict) -> list[str]:
    """``summary`` as short lines (the terminal prints them, the HTML page lists them): the step,
    the exposed communication and its parts, the worst collectives, the recommendation, and what
    could not be judged."""
    out = []
    s = summary.get("step")
    if s and s.get("step_ns") is not None:
        out.append(f"step: {fmt_ms(s['step_ns'])} ms (mean of {s['ranks']} rank(s) × {s['steps']} step(s)) = "
                   f"compute only {fmt_ms(s['compute_ns'])} + comm hidden under compute {fmt_ms(s['comm_hidden_ns'])} "
                   f"+ exposed comm {fmt_ms(s['comm_exposed_ns'])} + memcpy {fmt_ms(s['memory_ns'])} + sync/other "
                   f"{fmt_ms(s['sync_other_ns'])} + idle {fmt_ms(s['idle_ns'])} ms")
    elif s:
        out.append(f"step: — (wall time not measured); per step compute {fmt_ms(s['compute_ns'])} ms, exposed comm "
                   f"{fmt_ms(s['comm_exposed_ns'])} ms, hidden comm {fmt_ms(s['comm_hidden_ns'])} ms")
    else:
        out.append("step: — (see below)")
    e = summary.get("exposed")
    if e:
        out.append(f"exposed communication: {fmt_ms(e['exposed_ns'])} ms per step of {fmt_ms(e['comm_ns'])} ms "
                   f"(rank mean) = waiting for stragglers {fmt_ms(e['straggler_wait_ns'])} "
                   f"({fmt_pct(e['straggler_wait_share'])}) + transfer {fmt_ms(e['transfer_ns'])} "
                   f"({fmt_pct(e['transfer_share'])}) + not hidden {fmt_ms(e['not_hidden_ns'], signed=True)} "
                   f"({fmt_pct(e['not_hidden_share'])}) ms")
    else:
        out.append("exposed communication: — (see below)")
    out.append(f"worst collectives, by {summary['worst_basis']}:" if summary.get("worst")
               else "worst collectives: — (no collective with a sync time)")
    for i, r in enumerate(summary.get("worst") or [], 1):
        out.append(f"  {i}. {worst_line(r)}")
    rec = summary.get("recommendation")
    if rec:
        saving = "" if rec.get("saving_ns") is None else f" — predicted saving ≤ {fmt_ms(rec['saving_ns'])} ms per step"
        out.append(f"do next: {rec['text']}{saving}")
    else:
        out.append("do next: — (nothing the data supports)")
    nj = summary.get("not_judged") or []
    if nj:
        out.append("not judged:")
        out += [f"  - {n}" for n in nj]
    return out


def print_glance(report: dict, console) -> None:
    """The "At a glance" block (:func:`glance_lines`) under a bold title."""
    from rich.text import Text

    summary = report.get("summary")
    if not summary:
        return
    console.print()
    console.print(Text("At a glance", style="bold"))
    for line in glance_lines(summary):
        console.print(Text(line))


__all__ = ["glance_summary", "glance_lines", "print_glance", "step_summary", "exposed_summary", "worst_line"]
