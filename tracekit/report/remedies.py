"""Every weak reference with its remedy: why an α–β fit was rejected (which rule of
tracekit.model.fit.judge_fit, on which sizes), why no calibration run (``collect sweep``, nccl-tests
log) of the store judged a collective, and the command that would give a stronger reference.

:func:`reference_remedies` returns plain data for the report (``report['remedies']``, also in
``--json``); :func:`print_remedies` words it in the terminal. A remedy is a dict::

    topic     'fit' (a rejected fit of this run) or 'reference' (what the verdicts were judged against)
    op, group_size   the collective and k
    weak      what is weak, in words
    rule      the rule that rejected it: min_sizes, alpha_term_unmeasured, beta_term_unmeasured,
              alpha_undetermined, beta_undetermined, spread, outliers, no_model (fits);
              preset, no_reference, own_fit, incomplete, no_sync_time, size_unknown (references)
    why       the rule's reason with the sizes it saw (bytes; D* the fit's crossover size)
    fix       commands that would fix it, in order of preference

Rules and bounds are judge_fit's (tracekit/model/fit.py: >= 3 distinct sizes spanning D*, per-size
spread <= 15 %, <= 25 % of the samples dropped as outliers); the sweep's sizes are its options
(tracekit/cli/collect_sweep.py: 1 KiB to 64 MiB, ×4, 5 calls by default).
"""

from __future__ import annotations

from typing import Any

from tracekit.report.textfmt import fmt_size

SWEEP_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
             "all_to_all": "all_to_all", "send": "send_recv", "recv": "send_recv"}
"""Ops ``tracekit collect sweep --ops`` measures (send and recv as its send_recv)."""

SWEEP_MAX_RANKS = 8
"""``collect sweep --ranks`` takes 2..8 ranks."""

_RULES = (  # (words in judge_fit's reason, rule)
    ("distinct sizes: need", "min_sizes"),
    ("need at least 2 distinct sizes", "min_sizes"),
    ("α term was never measured", "alpha_term_unmeasured"),
    ("β term was never measured", "beta_term_unmeasured"),
    ("α not determined", "alpha_undetermined"),
    ("β not determined", "beta_undetermined"),
    ("residual spread", "spread"),
    ("dropped as outliers", "outliers"),
    ("no model for", "no_model"),
)

LINK_HINT = "--link PRESET (tracekit predict links lists them) or --alpha TIME --beta RATE"
"""The user's own reference for `tracekit analyze`."""


def fit_rule(status: str | None, reason: str | None) -> str | None:
    """The judge_fit rule behind a fit's (status, status_reason); None for an ok fit, 'other' when
    the reason is not one of judge_fit's."""
    if status == "ok":
        return None
    for words, rule in _RULES:
        if words in (reason or ""):
            return rule
    return "other"


def _pow2_at_most(x: float) -> int:
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def _size_arg(n: float) -> str:
    """A size for --min-bytes/--max-bytes and nccl-tests' -b/-e: 65536 → '64K' (binary letters, as
    both read them: tracekit.model.units.parse_size)."""
    n = int(n)
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


NCCL_TESTS_BINARY = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
                     "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf",
                     "broadcast": "broadcast_perf", "send": "sendrecv_perf", "recv": "sendrecv_perf"}
"""nccl-tests' benchmark per op (github.com/NVIDIA/nccl-tests, src/*.cu)."""


def _nccl_tests_cmd(op: str | None, k: int | None, lo: float | None = None, hi: float | None = None,
                    multi_node: bool = False) -> str | None:
    """The nccl-tests command that measures ``op`` on a group of ``k`` GPUs from ``lo`` to ``hi``
    bytes (default 8 B to 8 GiB), sizes ×2, 20 iterations: one process driving the k GPUs of one
    node (``-g k``), or for a group over several nodes (``multi_node``) k MPI processes of one GPU
    each (``mpirun -np k … -g 1``: nccl-tests built with MPI=1). None for an op nccl-tests lacks."""
    if op not in NCCL_TESTS_BINARY:
        return None
    b = _size_arg(lo) if lo else "8"
    e = _size_arg(hi) if hi else "8G"
    if multi_node:
        return (f"mpirun -np {k or 1} {NCCL_TESTS_BINARY[op]} -b {b} -e {e} -f 2 -n 20 -g 1"
                f"   (nccl-tests built with MPI=1, one GPU per process on the group's nodes, sizes ×2; "
                f"then tracekit ingest the log)")
    return (f"{NCCL_TESTS_BINARY[op]} -b {b} -e {e} -f 2 -n 20 -g {k or 1}"
            f"   (nccl-tests, sizes ×2; then tracekit ingest the log)")


def _sweep_cmd(op: str | None, k: int | None, extra: str = "") -> str:
    parts = ["tracekit collect sweep"]
    if op in SWEEP_OPS:
        parts.append(f"--ops {SWEEP_OPS[op]}")
    if k and 2 <= k <= SWEEP_MAX_RANKS:
        parts.append(f"--ranks {k}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def _fit_fix(rule: str, f: dict, run: dict) -> list[str]:
    """Commands that would turn this fit ok: a ``collect sweep``, or for a nccl-tests log the
    nccl-tests command, with the sizes the rule asks for."""
    op, k = f.get("op"), f.get("group_size")
    d = f.get("crossover_bytes")
    new_lo = new_hi = None
    extra, why = "", ""
    if rule == "min_sizes":
        why = "   (9 sizes, 1 KiB to 64 MiB ×4)"
    elif rule == "alpha_term_unmeasured" and d:
        new_lo = max(8, _pow2_at_most(d / 8))
        extra, why = f"--min-bytes {_size_arg(new_lo)}", "   (sizes below D*)"
    elif rule == "beta_term_unmeasured" and d:
        new_hi = _pow2_at_most(d * 32)
        extra, why = f"--max-bytes {_size_arg(new_hi)}", "   (sizes above D*)"
    elif rule in ("alpha_undetermined", "beta_undetermined"):
        extra, why = "--factor 2 --iters 20", "   (more sizes and repeats around D*)"
    elif rule == "outliers":
        extra, why = "--iters 20", "   on a quiet machine (no other jobs on its CPUs, GPUs, links)"
    elif rule == "spread":
        return [f"tracekit analyze {LINK_HINT}   (judge against the link: one α–β line does not fit these sizes)"] + (
            [_sweep_cmd(op, k) + "   on a quiet machine (a protocol or algorithm switch is real; noise is not)"]
            if op in SWEEP_OPS else [])
    else:
        return [f"tracekit analyze {LINK_HINT}"]
    sweep = _sweep_cmd(op, k, extra) + why if op in SWEEP_OPS else None  # collect sweep measures SWEEP_OPS only
    if run.get("source") == "nccl_tests":
        nt = _nccl_tests_cmd(op, k, new_lo if rule == "alpha_term_unmeasured" else None,
                             new_hi if rule == "beta_term_unmeasured" else None,
                             multi_node=f.get("locality") in ("inter_node", "mixed"))
        lo, hi = f.get("min_size_bytes"), f.get("max_size_bytes")
        if rule == "outliers" and nt and lo is not None and hi is not None and lo <= 1 << 10 and hi >= 1 << 30:
            # the log already spans the latency and the bandwidth ends (<= 1 KiB, >= 1 GiB): the same
            # command again helps only if its machine was busy
            return [f"tracekit analyze {LINK_HINT}   (the log already measured {fmt_size(lo)}–{fmt_size(hi)}; "
                    "run it again only if its machine was busy)"] + ([sweep] if sweep else [])
        if rule == "outliers" and nt:
            nt += " on a quiet machine"
        return [c for c in (nt, sweep) if c]
    return [sweep] if sweep else [f"tracekit analyze {LINK_HINT}   (tracekit collect sweep does not measure {op})"]


def _fit_why(rule: str, f: dict) -> str:
    sizes = "no usable sample" if not f.get("n_sizes") else (
        f"{f['n_sizes']} distinct size(s), {fmt_size(f.get('min_size_bytes'))}–{fmt_size(f.get('max_size_bytes'))}")
    used = f"{f.get('n_used')}/{f.get('n_samples')} samples kept"
    extra = ""
    if rule == "outliers" and f.get("size_spread") is not None:
        # a small spread of the kept samples with many dropped is as often the curve's shape (a protocol or
        # algorithm switch, a small-size floor) as noise: the data alone does not say which
        extra = (f"; the per-size spread of the kept samples is {f['size_spread']:.1%}: rejected by the outlier rule, "
                 "not the spread (the dropped sizes are noisy timings, or a shape one α–β line does not follow: "
                 "a protocol or algorithm switch, a small-size floor)")
    return f"{f.get('status_reason') or f.get('status')} — on {sizes}; {used}{extra}"


def reference_remedies(con, run: dict, fits: list[dict], references: list[dict]) -> list[dict[str, Any]]:
    """The remedies (module docstring) for a report: one per rejected fit of the run (group and
    pooled-class fits; groups with the same op, k and rule in one entry, ``groups`` counting them),
    and one per (op, k) whose verdicts rest on an assumed preset, the group's own fit or nothing.

    con: the report's connection (tracekit.report.data.report_connection: the run and the store's
    calibration runs); run: the report's run row; fits, references: the report's ``fit`` and
    ``references`` lists."""
    calibration = run.get("workload") == "sweep" or run.get("source") == "nccl_tests"
    out: list[dict] = []
    seen: dict[tuple, dict] = {}
    strong = {(r["op"], r["group_size"]): r["reference"] for r in references or []
              if r.get("kind") in ("sweep", "nccl_tests", "link", "user")}
    for f in fits or []:
        rule = fit_rule(f.get("status"), f.get("status_reason"))
        if rule is None:
            continue
        key = (f["op"], f["group_size"], rule)
        if key in seen:
            seen[key]["groups"] += 1
            continue
        where = f"group {f['pg_name']}" if f.get("scope") == "group" else f"all {f.get('locality')} groups pooled"
        fix = _fit_fix(rule, f, run)
        judged = strong.get((f["op"], f["group_size"]))
        if judged and not calibration:  # the verdicts stand on a measured or given reference anyway
            fix = [f"none needed: its verdicts use {judged}"]
        r = dict(topic="fit", op=f["op"], group_size=f["group_size"], rule=rule, groups=1,
                 weak=f"α–β fit of {f['op']} on {f['group_size']} ranks ({where}) rejected as {f['status']}",
                 why=_fit_why(rule, f), fix=fix)
        seen[key] = r
        out.append(r)
    calib_runs = _calibration(con, run.get("run_id"))
    done: set = set()
    for ref in references or []:
        kind, op, k = ref.get("kind"), ref.get("op"), ref.get("group_size")
        if kind not in ("preset", None, "own_fit") or (op, k, kind) in done:
            continue
        if kind is None and (ref.get("no_model_reason") or "").startswith("the model has no algorithm"):
            continue  # barrier and the like: no α–β model exists, no command gives one
        done.add((op, k, kind))
        if kind == "own_fit":
            r = dict(topic="reference", op=op, group_size=k, rule="own_fit", groups=ref.get("groups"),
                     weak=f"{op} on {k} ranks judged against its own group's fit",
                     why="its efficiency measures the calls' scatter about their own line, not the hardware; "
                         + _why_no_sweep(calib_runs, run, op, k),
                     fix=_sweep_fixes(calib_runs, run, op, k, "   on this machine, then tracekit analyze")
                     + [f"tracekit analyze {LINK_HINT}"])
        elif kind == "preset":
            r = dict(topic="reference", op=op, group_size=k, rule="preset", groups=ref.get("groups"),
                     weak=f"{op} on {k} ranks judged against an assumed preset, {ref.get('reference')}",
                     why=(f"{ref.get('note')}; " if ref.get("note") else "")
                     + (f"this calibration run's own {op} fit on {k} ranks was rejected (see its rule above)"
                        if calibration else _why_no_sweep(calib_runs, run, op, k)),
                     fix=_sweep_fixes(calib_runs, run, op, k, "   on this machine (a quiet one), then tracekit analyze")
                     + [f"tracekit analyze {LINK_HINT}   (the link you know it has)"])
        elif (ref.get("no_model_reason") or "").startswith(("incomplete", "no sync time", "size unknown")):
            reason = ref["no_model_reason"]
            rule, fix = {
                "i": ("incomplete", ["tracekit ingest FOLDER_OF_EVERY_RANK_FILE --replace   (the profiler on every "
                                     "rank of the group: tracekit profile does that)"]),
                "n": ("no_sync_time", ["tracekit ingest ... --replace --align collectives   (align the ranks' clocks "
                                       "on the collectives; the default only when hosts differ)"]),
                "s": ("size_unknown", ["tracekit profile -- CMD   (a trace whose collectives carry their metadata: "
                                       "op, sizes, group, seq)"]),
            }[reason[0]]
            r = dict(topic="reference", op=op, group_size=k, rule=rule, groups=ref.get("groups"),
                     weak=f"{op} on {k} ranks not judged: no verdict", why=reason, fix=fix)
        else:
            r = dict(topic="reference", op=op, group_size=k, rule="no_reference", groups=ref.get("groups"),
                     weak=f"{op} on {k} ranks has no reference: no verdict",
                     why=(ref.get("no_model_reason") or "no reference") + "; " + _why_no_sweep(calib_runs, run, op, k),
                     fix=[f"tracekit analyze {LINK_HINT}"]
                     + _sweep_fixes(calib_runs, run, op, k, "   on this machine, then tracekit analyze"))
        out.append(r)
    return out


def _calibration(con, run_id: str | None) -> list[dict]:
    """The store's calibration runs in the connection (newest first) with their fits' statuses."""
    runs = con.execute(
        "SELECT run_id, source, workload, backend, device_name FROM runs "
        "WHERE (workload = 'sweep' OR source = 'nccl_tests') AND run_id <> ? ORDER BY created_at DESC",
        [run_id or ""]).fetchall()
    out = []
    for rid, source, workload, backend, device in runs:
        fits = con.execute(
            "SELECT op, group_size, status, status_reason FROM alpha_beta_fit WHERE run_id = ? AND scope = 'group'",
            [rid]).fetchall()
        out.append(dict(run_id=rid, source=source, backend=backend, device=device, fits=fits))
    return out


def _rejected_here(calib: list[dict], run: dict, op: str) -> str | None:
    """The newest calibration run of this machine (backend and device) that measured ``op`` and had
    every fit of it rejected, as "sweep run ID (rules)"; None when there is none."""
    mop = "send" if op == "recv" else op
    for c in calib:
        if c["backend"] != run.get("backend") or c["device"] != run.get("device_name"):
            continue
        mine = [f for f in c["fits"] if f[0] == mop]
        if mine and not any(f[2] == "ok" for f in mine):
            name = ("nccl-tests log " if c["source"] == "nccl_tests" else "sweep run ") + c["run_id"]
            return f"{name} ({', '.join(sorted({fit_rule(f[2], f[3]) for f in mine}))})"
    return None


def _sweep_fixes(calib: list[dict], run: dict, op: str, k: int | None, tail: str) -> list[str]:
    """The ``collect sweep`` fix for a reference remedy: none for an op the sweep does not measure;
    after a sweep of this machine whose fits of ``op`` were all rejected, the same sweep with more
    repeats on a quiet machine, saying which run failed (the plain command again would loop)."""
    if op not in SWEEP_OPS:
        return []
    failed = _rejected_here(calib, run, op)
    if failed:
        return [_sweep_cmd(op, k, "--iters 50") + f"   on a quiet machine: {failed} was rejected, and a sweep "
                "on a busy one fails the same way"]
    return [_sweep_cmd(op, k) + tail]


def _why_no_sweep(calib: list[dict], run: dict, op: str, k: int | None) -> str:
    """Why no calibration run of the store judged ``op`` on k ranks, in words."""
    if not calib:
        return "the store holds no `tracekit collect sweep` run or nccl-tests log to judge against"
    mop = "send" if op == "recv" else op
    why = []
    for c in calib[:3]:
        name = ("nccl-tests log " if c["source"] == "nccl_tests" else "sweep run ") + c["run_id"]
        if c["backend"] != run.get("backend") or c["device"] != run.get("device_name"):
            why.append(f"{name} is another machine ({c['backend']} on {c['device'] or 'no device'}, this run "
                       f"{run.get('backend')} on {run.get('device_name') or 'no device'})")
            continue
        mine = [f for f in c["fits"] if f[0] == mop]
        ok = [f for f in mine if f[2] == "ok"]
        if not mine:
            why.append(f"{name} did not measure {op}")
        elif not ok:
            rules = sorted({fit_rule(f[2], f[3]) for f in mine})
            why.append(f"{name}'s {op} fits were all rejected ({', '.join(rules)})")
        else:
            why.append(f"{name} has an ok {op} fit but its hosts are not this group's")
    more = f" (and {len(calib) - 3} more)" if len(calib) > 3 else ""
    return "no sweep used: " + "; ".join(why) + more


def print_remedies(report: dict, console) -> None:
    """The report's ``remedies`` as a short section: what is weak, why, and the command to fix it."""
    rem = report.get("remedies") or []
    if not rem:
        return
    from rich.text import Text

    console.print()
    console.print(Text("Weak references and their remedies", style="bold"))  # the console prints markup as text
    for r in rem:  # markup off: rules and commands hold brackets
        n = f" ({r['groups']} groups)" if (r.get("groups") or 1) > 1 else ""
        console.print(f"• {r['weak']}{n}", markup=False, highlight=False)
        console.print(f"  rule {r['rule']}: {r['why']}", markup=False, highlight=False)
        for cmd in r["fix"]:
            console.print(f"  fix: {cmd}", markup=False, highlight=False)
