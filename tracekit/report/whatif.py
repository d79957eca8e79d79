"""The what-if answer of a run (``tracekit whatif``, ``Run.whatif``): its graph replayed unchanged
and with edits (tracekit.analyses.replay, tracekit.model.whatif), as a JSON-ready dict and as text.
"""

from __future__ import annotations

from tracekit.errors import BadInputError

_PART_LABEL = {"compute_ns": "compute", "exposed_comm_ns": "exposed comm", "memory_ns": "memcpy/memset",
               "launch_cpu_ns": "launch/CPU", "sync_other_ns": "sync/other", "straggler_ns": "other ranks",
               "idle_ns": "idle"}


def whatif_answer(con, run_id: str, *, link: str | None = None, algo: str | None = None, scale: str | None = None,
                  no_stragglers: bool = False, chunk: str | None = None, move_off: str | None = None,
                  ops: str | None = None, delay: str | None = None, machine: str | None = None,
                  steps: list | None = None) -> dict:
    """The answer (tracekit.analyses.replay.whatif) for `run_id` on the analyses connection `con`,
    with the edits of tracekit.model.whatif.plan: `link` a preset name (tracekit.model.LINK_PRESETS)
    for the collectives' transfer times (`algo` an algorithm of predict_collective; `ops` limits it
    to matching collectives), `scale` 'NAME=FACTOR,...', `no_stragglers`, `chunk` 'PATTERN=N',
    `move_off` a pattern, `delay` 'RANK:MS@PATTERN', `machine` a preset or TOML file
    (tracekit.model.machine.resolve_machine: NCCL's model on it, not with `link`). Raises BadInputError for an unknown preset, a malformed edit or no edit
    at all."""
    from tracekit.analyses import replay
    from tracekit.model import whatif as wf
    from tracekit.model.links import link_from_preset

    from tracekit.model.machine import resolve_machine

    the_link = link_from_preset(link) if link else None
    the_machine = resolve_machine(machine) if machine else None
    edits = wf.plan(the_link, algo, scale, no_stragglers, chunk, move_off, ops=ops, delay_spec=delay,
                    machine=the_machine)
    if not edits:
        raise BadInputError("whatif: name an edit: --link, --scale, --no-stragglers, --chunk, --move-off or --delay")
    model = None
    if the_link is not None:
        model = (f"α–β, {the_link.name}: α {the_link.alpha_s * 1e6:g} µs, β {the_link.beta_Bps / 1e9:g} GB/s "
                 f"({the_link.efficiency:.0%} of {the_link.nominal_Bps / 1e9:g} GB/s nominal)"
                 + (f", algorithm {algo}" if algo else ", each op's default algorithm"))
    if the_machine is not None:
        model = f"NCCL's tuning model (what NCCL would pick), {the_machine.describe()}"
    return replay.whatif(con, run_id, edits, model=model, steps=steps)


def _ms(ns) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.3f} ms"


def _signed_ms(ns) -> str:
    return "—" if ns is None else f"{ns / 1e6:+,.3f} ms"


def whatif_text(ans: dict, top: int = 8) -> str:
    """The answer as terminal text: per step the edits and model, per rank measured / replayed /
    edited step time (a range with its reason where the trace cannot support one number), the
    slowest rank's critical path composition before and after, and the collectives whose transfer
    changed (top `top` by change) with how much of the change reached the step."""
    lines = [f"what if — run {ans['run_id']}", "edits: " + "; ".join(ans["edits"])]
    if ans.get("model"):
        lines.append(f"model: {ans['model']}")
    for st in ans["steps"]:
        lines.append("")
        lines.append(f"step {st['step'] if st['step'] is not None else '(whole trace)'}: "
                     f"unchanged replay within {st['replay_error']:.2%} of the measured step")
        for why in st["limits"]:
            lines.append(f"  limit: {why}; the edited time is given as a range")
        lines.append(f"  {'rank':>4}  {'measured':>14}  {'replayed':>14}  {'edited':>27}  {'change':>13}")
        for r in st["ranks"]:
            edited = (_ms(r["edited_ns"]) if r["edited_ns"] is not None
                      else f"{_ms(r['edited_range_ns'][0])} – {_ms(r['edited_range_ns'][1])}")
            lines.append(f"  {r['rank']:>4}  {_ms(r['measured_ns']):>14}  {_ms(r['replayed_ns']):>14}  "
                         f"{edited:>27}  {_signed_ms(r['change_ns']):>13}")
        slow = next(r for r in st["ranks"] if r["rank"] == st["slowest_rank"])
        lines.append(f"  critical path of rank {slow['rank']} (the slowest), replayed → edited:")
        for p, label in _PART_LABEL.items():
            a, b = slow["path_replayed"][p], slow["path_edited"][p]
            if a or b:
                lines.append(f"    {label:<14} {_ms(a):>14} → {_ms(b):>14}  ({_signed_ms(b - a)})")
        ch = st["collectives_changed"]
        if ch:
            ex = st["explain"]
            faster = sum(c["change_ns"] for c in ch if c["change_ns"] < 0)
            slower = sum(c["change_ns"] for c in ch if c["change_ns"] > 0)
            lines.append(f"  {len(ch)} collectives' transfer changed (one span each): {_signed_ms(faster)} where faster, "
                         f"{_signed_ms(slower)} where slower, {_signed_ms(ex['transfer_change_ns'])} in all; "
                         f"{_signed_ms(ex['transfer_change_on_path_ns'])} of it on rank {slow['rank']}'s replayed "
                         "critical path")
            if ex["step_change_ns"] is not None:
                lines.append(f"  the step changed by {_signed_ms(ex['step_change_ns'])}: the other "
                             f"{_signed_ms(ex['hidden_ns'])} of the transfer change was hidden (overlapped with "
                             "compute, or absorbed waiting on other work)")
            for c in sorted(ch, key=lambda c: c["change_ns"])[:top]:
                size = "—" if c["size_bytes"] is None else f"{c['size_bytes']:,} B"
                pick = f" ({c['model_pick']})" if c.get("model_pick") else ""
                lines.append(f"    {c['op'] or c['name']:<14} pg {c['pg']} seq {c['seq']} {size:>16} ×{c['group_size']}: "
                             f"{_ms(c['before_ns'])} → {_ms(c['after_ns'])}{pick}"
                             + ("  (on the critical path)" if c["on_critical_path"] else ""))
            if len(ch) > top:
                lines.append(f"    ... and {len(ch) - top} more (--json lists every one)")
        for note in st["notes"]:
            lines.append(f"  edit: {note}")
    return "\n".join(lines)


def whatif_html(ans: dict) -> str:
    """The answer as one self-contained HTML page: the edits and model, per step a plotly figure
    (per rank: measured, replayed, edited step in ms; the slowest rank's critical path composition
    replayed and edited, stacked) and the tables of :func:`whatif_text`. plotly's JavaScript is
    inlined once."""
    import html

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    esc = html.escape
    parts = [f"<h1>What if — run {esc(str(ans['run_id']))}</h1>",
             f"<p><b>edits:</b> {esc('; '.join(ans['edits']))}</p>"]
    if ans.get("model"):
        parts.append(f"<p><b>model:</b> {esc(ans['model'])}</p>")
    first = True
    for st in ans["steps"]:
        label = st["step"] if st["step"] is not None else "(whole trace)"
        parts.append(f"<h2>step {esc(str(label))}</h2>")
        for why in st["limits"]:
            parts.append(f"<p><b>limit:</b> {esc(why)}; the edited step is a range</p>")
        fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4],
                            subplot_titles=("step per rank (ms)", f"critical path of rank {st['slowest_rank']} (ms)"))
        ranks = [str(r["rank"]) for r in st["ranks"]]
        for key, name in (("measured_ns", "measured"), ("replayed_ns", "replayed"), ("edited_ns", "edited")):
            vals = [None if r[key] is None else r[key] / 1e6 for r in st["ranks"]]
            if key == "edited_ns" and all(v is None for v in vals):  # a range: its high end, with the low as error bar
                lo = [r["edited_range_ns"][0] / 1e6 for r in st["ranks"]]
                hi = [r["edited_range_ns"][1] / 1e6 for r in st["ranks"]]
                fig.add_trace(go.Bar(x=ranks, y=hi, name="edited (range)", error_y=dict(
                    type="data", symmetric=False, array=[0] * len(hi), arrayminus=[h - low for h, low in zip(hi, lo)])),
                    row=1, col=1)
            else:
                fig.add_trace(go.Bar(x=ranks, y=vals, name=name), row=1, col=1)
        slow = next(r for r in st["ranks"] if r["rank"] == st["slowest_rank"])
        base = [0.0, 0.0]  # the composition stacked by hand (barmode is the page's: group), one offset group
        for p, plabel in _PART_LABEL.items():
            a, b = slow["path_replayed"][p] / 1e6, slow["path_edited"][p] / 1e6
            if a or b:
                fig.add_trace(go.Bar(x=["replayed", "edited"], y=[a, b], base=list(base), name=plabel,
                                     offsetgroup="path"), row=1, col=2)
                base = [base[0] + a, base[1] + b]
        fig.update_layout(barmode="group", template="plotly_white", height=380, margin=dict(t=40, b=30))
        fig.update_xaxes(title_text="rank", row=1, col=1)
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if first else False))
        first = False
        parts.append("<pre>" + esc(whatif_text({**ans, "steps": [st]}).split("\n", 3)[-1]) + "</pre>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>tracekit what if</title>"
            "<style>body{font-family:sans-serif;margin:2em}pre{font-size:12px}</style></head><body>"
            + "\n".join(parts) + "</body></html>")
