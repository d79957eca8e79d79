"""Cross-table invariants of ``tracekit analyze --json`` over every fixture and every shared trace.

    PYTHONPATH=. python benchmarks/invariants.py [--max-mb 16] [NAME_SUBSTRING ...]

Each input (a fixture run folder, a folder of ../shared/traces, or one file of a folder that holds
unrelated runs) is ingested once into a temporary store; its report (tracekit.report.data.
build_report, the dict ``analyze --json`` prints, read back through its JSON) and a few rows of the
same connection are checked by :func:`check`. Prints one line per input (violations, or "ok") and
exits 1 when any input breaks an invariant. tests/analyses/test_invariants.py runs the same checks.

The invariants (a report that breaks one contradicts itself):
- breakdown: the GPU time parts of each window (compute only, comm exposed/hidden, memory, sync,
  other, idle) sum to the window, exactly (ns);
- counts: the per-op instance counts sum to the report's instances and to the process groups'
  instances, and each equals the matched (not mismatched) instances of that op in
  collective_instances;
- incomplete: the per-op, the run's and the process groups' incomplete counts agree;
- busbw: every instance's busbw is at most the device's physical cap, or flagged over_cap (and the
  report warns); every group size says where it came from (k_source), 'world' only for the world size;
- critical path: no path longer than its step unless the report says why (``longer_than_step``);
- no negative durations: collectives, sync times, skews, waits, overlap, GPU time parts, critical
  path parts; "which part to fix" never shows a negative part (the terminal clamps it);
- unsupported numbers: no skew, wait or straggler for an instance that fewer than two ranks of a
  group of more recorded; no bandwidth for a CPU enqueue of an asynchronous backend; no total wait
  where every wait is unknown.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"

FIXTURE_RUNS = ("tp_2rank", "tp_chunks_2rank", "ep_2rank", "pp_2rank", "pp_decode_2rank", "kv_bulk_2rank",
                "kv_layerwise_2rank", "sweep_2rank", "3d_2x2x2", "handmade/two_rank", "handmade/gpu_breakdown",
                "inputs/cpu_gloo_tp_2rank", "inputs/cpu_nccl_2rank", "nccl_tests/slurm-4242.out",
                "nccl_tests/mi300x_bench.log")
"""Our own recordings and hand-written runs (fixtures/, each a run as ingested by its tests)."""

PER_FILE = ("kineto_legacy_2021", "single_gpu_compute", "pipit_nsys_sqlite", "hta_cpu_only_gloo", "nccltests_h100_fleet")
"""Shared folders whose files are unrelated runs: each file (or subfolder) is one input."""

MAX_MB = 16.0
"""Inputs larger than this (MB on disk) are skipped, and said so (a CI budget)."""

TOLERANCE_NS = 0
"""The GPU breakdown's parts are integers that sum to the window exactly."""


def inputs(max_mb: float = MAX_MB) -> tuple[list[tuple[str, list[Path]]], list[str]]:
    """(name, paths to ingest as one run) for every input present, and the skipped ones with why."""
    out, skipped = [], []
    for rel in FIXTURE_RUNS:
        p = REPO / "fixtures" / rel
        if p.exists():
            out.append((f"fixtures/{rel}", [p]))
    if SHARED.is_dir():
        for d in sorted(x for x in SHARED.iterdir() if x.is_dir()):
            if d.name in PER_FILE:
                for f in sorted(x for x in d.iterdir()
                                if not x.name.startswith(".") and x.name not in ("LICENSE", "README.md")):
                    out.append((f"shared/{d.name}/{f.name}", [f]))
            else:
                out.append((f"shared/{d.name}", [d]))
    keep = []
    for name, paths in out:
        mb = sum(_size(p) for p in paths) / 1e6
        if mb > max_mb:
            skipped.append(f"{name}: {mb:,.1f} MB > {max_mb:g} MB")
        else:
            keep.append((name, paths))
    return keep, skipped


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def analyze(paths: list[Path], store_dir: Path) -> tuple[dict, dict]:
    """Ingest ``paths`` as one run into a new store at ``store_dir``; (the report as ``analyze --json``
    prints it, read back; rows of the same connection the checks need)."""
    from tracekit.ingest import ingest_paths
    from tracekit.report.data import build_report, report_connection, report_json
    from tracekit.store import Store

    st = Store(store_dir)
    rid = ingest_paths(paths, st, run_id="inv")
    rid, con = report_connection(st, rid, None)
    try:
        rep = json.loads(report_json(build_report(st, rid, None, con=con)))
        q = lambda sql: con.execute(sql).fetchall()  # noqa: E731
        rows = dict(
            instances_by_op=dict(q("SELECT op, count(*) FROM collective_instances WHERE NOT mismatched GROUP BY op")),
            negative=q("""SELECT 'collectives.dur_ns', count(*) FROM collectives WHERE dur_ns < 0
                          UNION ALL SELECT 'sync_time_ns', count(*) FROM collective_instances WHERE sync_time_ns < 0
                          UNION ALL SELECT 'skew_ns', count(*) FROM collective_instances WHERE skew_ns < 0
                          UNION ALL SELECT 'wait_ns', count(*) FROM collective_waits WHERE wait_ns < 0"""),
            unsupported=q("""SELECT 'skew or straggler of one rank', count(*) FROM collective_instances
                             WHERE ranks_seen < 2 AND group_size > 1 AND skew_ns IS NOT NULL
                             UNION ALL SELECT 'bandwidth of an async CPU enqueue', count(*)
                             FROM collective_instances WHERE async_cpu AND sync_time_ns IS NOT NULL
                             UNION ALL SELECT 'wait of one rank', count(*) FROM collective_waits w
                             JOIN collective_instances i USING (run_id, pg_name, win, seq)
                             WHERE i.ranks_seen < 2 AND i.group_size > 1 AND w.wait_ns IS NOT NULL"""),
            over_cap=q("SELECT count(*) FILTER (WHERE busbw_gbps > cap_gbps AND NOT over_cap) FROM collective_bandwidth"),
            k_source=q("""SELECT count(*) FILTER (WHERE c.group_size IS NOT NULL AND c.k_source IS NULL),
                                 count(*) FILTER (WHERE c.k_source = 'world' AND c.group_size <> r.world_size),
                                 count(*) FILTER (WHERE c.group_size < 1)
                          FROM collectives c JOIN runs r USING (run_id) WHERE r.source <> 'nccl_tests'"""),
        )
    finally:
        con.close()
    return rep, rows


def check(rep: dict, rows: dict) -> list[str]:
    """The invariants (module docstring) of one report; each violation as one line."""
    from tracekit.report.data import GPU_PARTS, PATH_PARTS

    bad: list[str] = []
    # breakdown classes sum to their window
    gb = rep.get("gpu_time_breakdown") or {}
    for r in (gb.get("by_rank") or []) + (gb.get("by_step") or []):
        parts = [r[k] for k in GPU_PARTS]
        if any(p is not None and p < 0 for p in parts):
            bad.append(f"GPU breakdown rank {r['rank']}: a negative part {parts}")
        if r["window_ns"] is not None and abs(sum(p or 0 for p in parts) - r["window_ns"]) > TOLERANCE_NS:
            bad.append(f"GPU breakdown rank {r['rank']} step {r.get('step')}: parts sum to "
                       f"{sum(p or 0 for p in parts)} ns, window {r['window_ns']} ns")
    # per-op counts equal the matched instances; the totals agree
    by_op = {r["op"]: r for r in rep.get("collectives") or []}
    for op, n in rows["instances_by_op"].items():
        if op is not None and by_op.get(op, {}).get("count", 0) != n:
            bad.append(f"{op}: by-op count {by_op.get(op, {}).get('count')} != {n} matched instances")
    inst = rep.get("instances") or {}
    if sum(r["count"] for r in by_op.values()) != inst.get("instances", 0):
        bad.append(f"by-op counts sum to {sum(r['count'] for r in by_op.values())}, instances {inst.get('instances')}")
    is_log = (rep.get("run") or {}).get("source") == "nccl_tests"
    pgs = rep.get("process_groups") or []
    if pgs and sum(g["instances"] for g in pgs) != inst.get("instances", 0):
        bad.append(f"process groups hold {sum(g['instances'] for g in pgs)} instances, the run {inst.get('instances')}")
    # incomplete counts agree everywhere
    inc = {"by op": sum(r["incomplete"] for r in by_op.values()), "run": inst.get("incomplete", 0)}
    if pgs:
        inc["process groups"] = sum(g["incomplete"] for g in pgs)
        inc["process groups by size"] = sum(b["incomplete"] for g in pgs for b in g.get("by_size") or [])
    if len(set(inc.values())) > 1:
        bad.append(f"incomplete counts disagree: {inc}")
    if is_log and inc["run"]:
        bad.append(f"a nccl-tests log with {inc['run']} incomplete instances")
    # busbw within the physical cap, or flagged
    if rows["over_cap"][0][0]:
        bad.append(f"{rows['over_cap'][0][0]} instance(s) over the device cap without over_cap")
    for r in by_op.values():
        if r.get("over_cap") and not any("physical cap" in w and w.startswith(r["op"]) for w in rep.get("warnings") or []):
            bad.append(f"{r['op']}: over_cap instances without a warning")
    # every group size says where it came from; 'world' is the world size; never below 1
    no_source, not_world, below_one = rows["k_source"][0]
    if no_source:
        bad.append(f"{no_source} collective(s) with a group size and no k_source")
    if not_world:
        bad.append(f"{not_world} collective(s) with k_source 'world' whose group size is not the world size")
    if below_one:
        bad.append(f"{below_one} collective(s) with a group size below 1")
    # critical path no longer than its step (or the report says why); no negative part
    for r in (rep.get("critical_path") or {}).get("summary") or []:
        if r["length_ns"] is not None and r["window_ns"] is not None and r["length_ns"] > r["window_ns"] \
                and not r.get("longer_than_step"):
            bad.append(f"critical path rank {r['rank']} step {r['step']}: {r['length_ns']} ns > step {r['window_ns']} ns, "
                       "no reason given")
        if any((r.get(k) or 0) < 0 for k in PATH_PARTS):
            bad.append(f"critical path rank {r['rank']} step {r['step']}: a negative part")
    # no negative durations
    for what, n in rows["negative"]:
        if n:
            bad.append(f"{n} negative {what}")
    for r in rep.get("overlap_by_rank") or []:
        for k in ("comm_ns", "compute_ns", "overlap_ns", "exposed_comm_ns"):
            if r.get(k) is not None and r[k] < 0:
                bad.append(f"overlap rank {r['rank']}: {k} {r[k]} < 0")
    # no number where the input cannot support it
    for what, n in rows["unsupported"]:
        if n:
            bad.append(f"{n} instance(s) with a {what}")
    for s in rep.get("stragglers") or []:
        if s.get("skew_ns") is None:
            bad.append(f"straggler row without a skew: {s}")
    for r in by_op.values():
        if r.get("total_wait_ns") is not None and r["total_wait_ns"] < 0:
            bad.append(f"{r['op']}: negative total wait")
    for m in rep.get("measured_vs_model") or []:
        if m.get("wait_ns") is None and (m.get("gap_skew_ns") is not None or m.get("gap_transfer_ns") is not None):
            bad.append(f"rank {m['rank']}: gap parts from an unknown wait")
    return bad


def main(argv: list[str]) -> int:
    max_mb = MAX_MB
    if "--max-mb" in argv:
        i = argv.index("--max-mb")
        max_mb = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    todo, skipped = inputs(max_mb)
    if argv:
        todo = [(n, p) for n, p in todo if any(a in n for a in argv)]
    failed = 0
    for s in skipped:
        print(f"skipped {s}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, paths) in enumerate(todo):
            t0 = time.perf_counter()
            try:
                rep, rows = analyze(paths, Path(tmp) / str(i))
            except Exception as exc:  # noqa: BLE001 - a refused input is reported, not a crash of the script
                print(f"{name}: not analyzed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})")
                continue
            bad = check(rep, rows)
            failed += bool(bad)
            print(f"{name}: {'ok' if not bad else '; '.join(bad)} ({time.perf_counter() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
