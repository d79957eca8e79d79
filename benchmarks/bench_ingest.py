"""Benchmark: tracekit vs HTA vs the raw parse floor, on the same traces, as whole processes.

    python benchmarks/bench_ingest.py [--k 1 4 16] [--base TRACE] [--skip-hta] [--out results.json]

For every input set it runs, each as its own process (so time and peak memory
are per process, start-up included):

  floor        gunzip + orjson.loads of every file (what any whole-document
               parser pays at least); also the same with gc.disable() ("floor, no GC")
  limit        the one-core limit: ISA-L gunzip (isal.igzip) + simdjson's DOM parse
               (pysimdjson) of every file, one thread; skipped with a note when either
               module is missing (pip install isal pysimdjson, or tracekit[bench])
  tracekit     `tracekit ingest FILES --store TMP`, then
               `tracekit analyze --store TMP --json > FILE` (kept only for its
               per-rank overlap, set beside HTA's in --out); and, as one
               process, `tracekit ingest FILES --store TMP --analyze`
  HTA          TraceAnalysis(trace_dir=DIR) + get_comm_comp_overlap(visualize=False)
               (benchmarks/hta_overlap.py in the HTA environment, see setup_hta.sh)

and prints wall time and peak memory of each, with the ratios HTA / tracekit
and tracekit / floor. Input sets: the shared multi-rank set
param_dlrm_8rank_v100 and a real trace (--base, default
../shared/traces/hta_ddp_v100_r1of2) replicated k times. A replica is written
as a stream, one copy at a time: copy i has every timestamp shifted by i trace
spans, every id that links events (correlation, External id, flow id, Ev Idx,
Seq, Python ids) offset by i × (largest id + 1), and ProfilerStep#N renumbered
so that the copies read as consecutive steps. Replicas are written gzip level 1
into a temporary directory (--workdir to keep and reuse them), never into the
repository.

Times are wall seconds (the fastest of --repeat runs); CPU seconds (user +
system) are recorded too, as is the 1-minute load average after each run: on a
shared machine, read wall times with the load beside them.

Peak memory is the larger of (a) the peak RSS of the largest single process
(wait4's ru_maxrss) and (b) the peak of the summed RSS of the process tree,
sampled every 50 ms, so worker processes count.

Needs: orjson (the `bench` extra) in this interpreter, tracekit installed in
it, and for the HTA columns the HTA environment (bash benchmarks/setup_hta.sh).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACES = REPO.parent / "shared" / "traces"
DEFAULT_BASE = TRACES / "hta_ddp_v100_r1of2" / "df_index_resolver.json.gz"
DEFAULT_SHARED = ["param_dlrm_8rank_v100"]
HTA_PY = REPO / ".venv-hta" / "bin" / "python"
PAGE = os.sysconf("SC_PAGE_SIZE")

# ids that link events to each other; offset per copy so links stay unique
ID_ARGS = ("correlation", "External id", "external id", "Ev Idx", "Seq", "Python id", "Python parent id")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")

FLOOR_CODE = r"""
import gc, gzip, json, sys, orjson
if sys.argv[1] == "nogc":
    gc.disable()
events = nbytes = 0
for p in sys.argv[2:]:
    with (gzip.open if p.endswith(".gz") else open)(p, "rb") as fh:
        data = fh.read()
    nbytes += len(data)
    doc = orjson.loads(data)
    events += len(doc["traceEvents"])
    del doc, data
print(json.dumps({"events": events, "json_bytes": nbytes}))
"""


LIMIT_CODE = r"""
import json, sys
from isal import igzip
import simdjson
parser = simdjson.Parser()
events = 0
for p in sys.argv[1:]:
    with (igzip.open if p.endswith(".gz") else open)(p, "rb") as fh:
        data = fh.read()
    doc = parser.parse(data)
    events += len(doc["traceEvents"])
    del doc, data
print(json.dumps({"limit_events": events}))
"""


def _have_limit_modules() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("isal", "simdjson"))


# -- measuring a process ---------------------------------------------------------


def _tree_rss(pid: int) -> int:
    """Summed RSS (bytes) of pid and all its descendants, from /proc."""
    total = 0
    stack = [pid]
    seen = set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    stack.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


def measure(cmd: list[str], *, stdout=None, timeout: float | None = None, env=None) -> dict:
    """Run cmd as a fresh process; wall seconds, peak memory (MiB), exit code, stdout path."""
    out_fh = open(stdout, "wb") if stdout else subprocess.DEVNULL
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out_fh, stderr=err, env=env)
    peak_tree = 0
    done = threading.Event()

    def sample():
        nonlocal peak_tree
        while not done.is_set():
            peak_tree = max(peak_tree, _tree_rss(proc.pid))
            done.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    timed_out = False
    if timeout is not None:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if timeout is not None:
        timed_out = not timer.is_alive() and wall >= timeout
        timer.cancel()
    done.set()
    th.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if stdout:
        out_fh.close()
    err.seek(0)
    tail = err.read()[-2000:].decode("utf-8", "replace")
    err.close()
    maxrss = ru.ru_maxrss * 1024  # KiB on Linux
    return dict(
        cmd=cmd,
        wall_s=round(wall, 3),
        cpu_s=round(ru.ru_utime + ru.ru_stime, 3),  # user + system, the process and its waited-for children
        loadavg_1m=round(os.getloadavg()[0], 2),
        peak_mib=round(max(maxrss, peak_tree) / 2**20, 1),
        maxrss_mib=round(maxrss / 2**20, 1),
        tree_peak_mib=round(peak_tree / 2**20, 1),
        rc=proc.returncode,
        timed_out=timed_out,
        stderr_tail=tail if proc.returncode else "",
    )


# -- replicated inputs -------------------------------------------------------------


def _load(path: Path) -> dict:
    import orjson

    with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as fh:
        return orjson.loads(fh.read())


def replicate(base: Path, k: int, out: Path) -> dict:
    """Write ``base`` replicated k times to ``out`` (.json.gz), one copy in memory at a time."""
    doc = _load(base)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = t1 - t0
    floats = any(isinstance(e["ts"], float) for e in timed)
    max_id = 0
    steps = []
    for e in events:
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
        a = e.get("args")
        if isinstance(a, dict):
            for key in ID_ARGS:
                v = a.get(key)
                if isinstance(v, int):
                    max_id = max(max_id, v)
        m = _STEP.match(str(e.get("name", "")))
        if m:
            steps.append(int(m.group(1)))
    id_span = max_id + 1
    step_span = (max(steps) - min(steps) + 1) if steps else 0

    tmp = out.with_name(out.name + ".part")
    n_written = n_complete = 0
    with gzip.open(tmp, "wb", compresslevel=1) as fh:
        # Kineto's spacing ("key": value, ...): some readers depend on it (HTA finds a file's
        # rank with a regex that wants a space after '"rank":'), and it keeps sizes realistic
        head = json.dumps(doc, indent=2, ensure_ascii=False).encode()
        fh.write(head[:-1].rstrip() + (b"," if doc else b"") + b'\n  "traceEvents": [\n')
        first = True
        for i in range(k):
            shift = span * i
            parts = []
            for e in events:
                if e.get("ph") == "M" and i > 0:
                    continue  # process/thread names once
                if i:
                    e = dict(e)
                    if "ts" in e and isinstance(e["ts"], (int, float)):
                        e["ts"] = round(e["ts"] + shift, 3) if floats else e["ts"] + shift
                    if isinstance(e.get("id"), int):
                        e["id"] += id_span * i
                    a = e.get("args")
                    if isinstance(a, dict) and any(key in a for key in ID_ARGS):
                        a = dict(a)
                        for key in ID_ARGS:
                            if isinstance(a.get(key), int):
                                a[key] += id_span * i
                        e["args"] = a
                    m = _STEP.match(str(e.get("name", "")))
                    if m:
                        e["name"] = f"ProfilerStep#{int(m.group(1)) + step_span * i}"
                parts.append(_dumps(e).encode())
                n_complete += e.get("ph") == "X"
            if parts:
                fh.write((b"" if first else b",\n") + b",\n".join(parts))
                first = False
            n_written += len(parts)
            del parts
        fh.write(b"\n  ]\n}\n")
        json_bytes = fh.tell()  # uncompressed bytes written
    os.replace(tmp, out)
    return dict(events=n_written, complete_events=n_complete, copies=k, span_us=span, json_bytes=json_bytes)


_dumps = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=False).encode


# -- one input set ---------------------------------------------------------------


def run_set(name: str, files: list[Path], trace_dir: Path, work: Path, args) -> dict:
    print(f"[{name}] {len(files)} file(s)", file=sys.stderr, flush=True)
    res: dict = dict(name=name, files=[str(f) for f in files])
    sfiles = [str(f) for f in files]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    store = work / f"{slug}.store"
    tk = [sys.executable, "-m", "tracekit"]
    run_hta = not args.skip_hta and HTA_PY.exists()
    if not args.skip_hta and not HTA_PY.exists():
        print(f"  HTA skipped: {HTA_PY} absent (bash benchmarks/setup_hta.sh)", file=sys.stderr)
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    for _ in range(args.repeat):  # repeats interleaved, so that a slow spell hits every tool alike
        if not getattr(args, "skip_floor", False):
            floor_out = work / f"{slug}.floor.json"
            m = measure([sys.executable, "-c", FLOOR_CODE, "gc", *sfiles], stdout=floor_out, timeout=args.timeout)
            if m["rc"] == 0:
                res.update(json.loads(floor_out.read_text()))
            runs["floor"].append(m)
            runs["floor_nogc"].append(
                measure([sys.executable, "-c", FLOOR_CODE, "nogc", *sfiles], timeout=args.timeout)
            )
        if _have_limit_modules():
            runs["limit"].append(measure([sys.executable, "-c", LIMIT_CODE, *sfiles], timeout=args.timeout))
        shutil.rmtree(store, ignore_errors=True)
        runs["tk_ingest"].append(measure([*tk, "ingest", *sfiles, "--store", str(store)], timeout=args.timeout))
        tk_out = work / f"{slug}.analyze.json"
        m = measure([*tk, "analyze", "--store", str(store), "--json"], stdout=tk_out, timeout=args.timeout)
        if m["rc"] == 0:
            try:
                rep = json.loads(tk_out.read_text())
                res["tk_overlap"] = {str(r["rank"]): r["overlap_ratio"] for r in rep.get("overlap_by_rank", [])}
            except (ValueError, KeyError, TypeError):
                pass
        runs["tk_analyze"].append(m)
        shutil.rmtree(store, ignore_errors=True)
        # the same work as one command: ingest, then the report, in one process
        m = measure([*tk, "ingest", *sfiles, "--store", str(store), "--analyze"],
                    stdout=work / f"{slug}.one.txt", timeout=args.timeout)
        runs["tk_one"].append(m)
        shutil.rmtree(store, ignore_errors=True)
        if run_hta:
            hta_out = work / f"{slug}.hta.json"
            hta_cmd = [str(HTA_PY), str(HERE / "hta_overlap.py"), str(trace_dir)]
            m = measure(hta_cmd, stdout=hta_out, timeout=args.timeout)
            if m["rc"] == 0:
                res["hta_overlap"] = json.loads(hta_out.read_text().strip().splitlines()[-1])
            runs["hta"].append(m)
    if not _have_limit_modules():
        print("  one-core limit skipped: isal or simdjson missing (pip install isal pysimdjson)", file=sys.stderr)
    for key in ("floor", "floor_nogc", "limit", "tk_ingest", "tk_analyze", "tk_one", "hta"):
        ms = runs.get(key)
        if not ms:
            res[key] = None
            continue
        good = [m for m in ms if m["rc"] == 0]
        best = min(good, key=lambda m: m["wall_s"]) if good else ms[-1]
        best = dict(best, all_wall_s=[m["wall_s"] for m in ms], all_peak_mib=[m["peak_mib"] for m in ms])
        res[key] = best
        if not good:
            print(f"  {key} failed (rc {best['rc']}): {best['stderr_tail'][-500:]}", file=sys.stderr)
    _derive(res)
    print("  " + _row(res), file=sys.stderr, flush=True)
    return res


def _ok(m) -> bool:
    return bool(m) and m["rc"] == 0


def _derive(r: dict) -> None:
    if _ok(r["tk_ingest"]) and _ok(r["tk_analyze"]):
        r["tk_total_s"] = round(r["tk_ingest"]["wall_s"] + r["tk_analyze"]["wall_s"], 3)
        r["tk_total_cpu_s"] = round(r["tk_ingest"]["cpu_s"] + r["tk_analyze"]["cpu_s"], 3)
        r["tk_peak_mib"] = max(r["tk_ingest"]["peak_mib"], r["tk_analyze"]["peak_mib"])
        if _ok(r.get("hta")):
            r["hta_over_tk_time"] = round(r["hta"]["wall_s"] / r["tk_total_s"], 2)
            r["hta_over_tk_cpu"] = round(r["hta"]["cpu_s"] / r["tk_total_cpu_s"], 2)
            r["hta_over_tk_mem"] = round(r["hta"]["peak_mib"] / r["tk_peak_mib"], 2)
        if _ok(r["floor"]):
            r["tk_over_floor"] = round(r["tk_total_s"] / r["floor"]["wall_s"], 2)
        if _ok(r["floor_nogc"]):
            r["tk_over_floor_nogc"] = round(r["tk_total_s"] / r["floor_nogc"]["wall_s"], 2)
        if _ok(r.get("limit")):
            r["tk_over_limit"] = round(r["tk_total_s"] / r["limit"]["wall_s"], 2)
    if _ok(r.get("tk_one")) and _ok(r.get("hta")):
        r["hta_over_tk_one_time"] = round(r["hta"]["wall_s"] / r["tk_one"]["wall_s"], 2)


# -- report ------------------------------------------------------------------------

HEADER = (
    "| input | JSON MB | events | floor s / MiB | floor no-GC s / MiB | tracekit ingest s / MiB | analyze s / MiB "
    "| tracekit total s (CPU s) / peak MiB | HTA s (CPU s) / peak MiB | HTA÷tk time (CPU) | HTA÷tk mem "
    "| tk÷floor | tk÷floor no-GC | one-core limit s / MiB | tk÷limit "
    "| one process: `ingest --analyze` s / MiB (HTA÷it) | load |"
)


def _sm(m, cpu: bool = False) -> str:
    if not m:
        return "—"
    if m["rc"] != 0:
        return "timeout" if m.get("timed_out") else f"failed ({m['rc']})"
    c = f" ({m['cpu_s']:.1f})" if cpu else ""
    return f"{m['wall_s']:.2f}{c} / {m['peak_mib']:.0f}"


def _row(r: dict) -> str:
    def g(key, fmt="{:.2f}"):
        v = r.get(key)
        return "—" if v is None else fmt.format(v)

    mb = f"{r['json_bytes'] / 1e6:.0f}" if r.get("json_bytes") else "—"
    ev = f"{r['events']:,}" if r.get("events") else "—"
    if "tk_total_s" in r:
        tk_tot = f"{r['tk_total_s']:.2f} ({r['tk_total_cpu_s']:.1f}) / {r['tk_peak_mib']:.0f}"
    else:
        tk_tot = "failed"
    ing = _sm(r["tk_ingest"])
    ana = _sm(r["tk_analyze"])
    hta = _sm(r.get("hta"), cpu=True) if r.get("hta") is not None else "skipped"
    ratio = "—"
    if "hta_over_tk_time" in r:
        ratio = f"{r['hta_over_tk_time']:.1f}× ({r['hta_over_tk_cpu']:.1f}×)"
    loads = [r[k]["loadavg_1m"] for k in ("floor", "floor_nogc", "limit", "tk_ingest", "tk_analyze", "tk_one", "hta") if r.get(k)]
    load = f"{max(loads):.1f}" if loads else "—"
    return (
        f"| {r['name']} | {mb} | {ev} | {_sm(r['floor'])} | {_sm(r['floor_nogc'])} | {ing} | {ana} | {tk_tot} "
        f"| {hta} | {ratio} | {g('hta_over_tk_mem', '{:.1f}×')} | {g('tk_over_floor', '{:.2f}×')} "
        f"| {g('tk_over_floor_nogc', '{:.2f}×')} | {_sm(r.get('limit'))} | {g('tk_over_limit', '{:.2f}×')} "
        f"| {_sm(r.get('tk_one'))} ({g('hta_over_tk_one_time', '{:.1f}×')}) "
        f"| {load} |"
    )


def _verdicts(results: list[dict]) -> list[str]:
    """The issue's targets, read off the replicated inputs."""
    reps = [r for r in results if "k" in r and "tk_total_s" in r]
    if not reps:
        return []
    out = ["", "targets (replicated inputs):"]
    for r in reps:
        bits = []
        if "hta_over_tk_time" in r:
            bits.append(f"HTA÷tracekit time {r['hta_over_tk_time']:.1f}× (target ≥ 10×)")
        if "hta_over_tk_one_time" in r:
            bits.append(f"one process {r['hta_over_tk_one_time']:.1f}×")
        if "tk_over_floor" in r:
            bits.append(f"tracekit÷floor {r['tk_over_floor']:.2f}× (target ≤ 2×)")
        if "tk_over_limit" in r:
            bits.append(f"tracekit÷one-core limit {r['tk_over_limit']:.2f}× (target ≤ 1.5×)")
        out.append(f"  ×{r['k']}: " + "; ".join(bits))
    lo, hi = min(reps, key=lambda r: r["k"]), max(reps, key=lambda r: r["k"])
    if hi["k"] > lo["k"]:
        out.append(
            f"  tracekit peak memory ×{lo['k']} → ×{hi['k']}: "
            f"{lo['tk_peak_mib']:.0f} → {hi['tk_peak_mib']:.0f} MiB "
            f"({hi['tk_peak_mib'] / lo['tk_peak_mib']:.2f}× for {hi['k'] / lo['k']:.0f}× the input; target: flat)"
        )
        for key, what in (("tk_ingest", "ingest"), ("tk_analyze", "analyze")):
            peaks = ", ".join(f"×{r['k']} {r[key]['peak_mib']:.0f}" for r in sorted(reps, key=lambda r: r["k"]))
            out.append(f"    {what} peak MiB: {peaks}")
    return out


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}"


def _tracekit_rev() -> str:
    """The commit tracekit ran from, with '+dirty' when tracekit/ or analyses/ has local changes."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "tracekit", "analyses"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="*", default=[1, 4, 16], help="replication factors (default 1 4 16)")
    ap.add_argument(
        "--base", type=Path, default=DEFAULT_BASE, help="the trace to replicate (default: hta_ddp_v100_r1of2)"
    )
    ap.add_argument(
        "--shared", nargs="*", default=DEFAULT_SHARED, help="folders under ../shared/traces to run as they are"
    )
    ap.add_argument("--skip-hta", action="store_true", help="leave HTA out")
    ap.add_argument("--hta-max-k", type=int, default=None, help="run HTA only on replicas with k <= this")
    ap.add_argument(
        "--floor-max-k", type=int, default=None,
        help="run the parse floor only on replicas with k <= this (it holds the whole document: ~8x the JSON)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write all measurements as JSON here")
    ap.add_argument("--workdir", type=Path, default=None, help="keep (and reuse) replicas and stores here")
    ap.add_argument(
        "--repeat", type=int, default=1, help="run every measurement N times and keep the fastest (default 1)"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per measured process (default 1800)")
    ap.add_argument(
        "--write-replica",
        nargs=2,
        metavar=("K", "OUT"),
        default=None,
        help="only write --base replicated K times to OUT (.json.gz), print its counts as JSON, and exit",
    )
    args = ap.parse_args(argv)
    if args.write_replica:
        k, out = int(args.write_replica[0]), Path(args.write_replica[1])
        print(json.dumps(replicate(args.base, k, out)))
        return 0

    try:
        import orjson  # noqa: F401
    except ImportError:
        ap.error("orjson is needed for the parse floor: pip install orjson (or tracekit[bench])")

    rev = _tracekit_rev()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracekit-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for rel in args.shared:
            d = TRACES / rel
            if not d.is_dir():
                print(f"[{rel}] skipped: {d} is absent", file=sys.stderr)
                continue
            files = sorted(p for p in d.iterdir() if p.name.endswith((".json", ".json.gz")))
            results.append(run_set(rel, files, d, work, args))
        if args.k:
            if not args.base.exists():
                print(f"replicas skipped: base trace {args.base} is absent", file=sys.stderr)
            else:
                for k in args.k:
                    d = work / f"x{k}"
                    d.mkdir(exist_ok=True)
                    f = d / f"{args.base.name.split('.')[0]}_x{k}.json.gz"
                    meta_f = work / f"x{k}.replica.json"  # not in d: HTA reads every .json there
                    if not (f.exists() and meta_f.exists()):
                        # in a child process, so that this driver stays small: a child's peak RSS
                        # (ru_maxrss) counts the memory of the process it was forked from
                        t = time.perf_counter()
                        child = subprocess.run(
                            [sys.executable, __file__, "--write-replica", str(k), str(f), "--base", str(args.base)],
                            check=True,
                            stdout=subprocess.PIPE,
                        )
                        meta_f.write_text(child.stdout.decode().strip().splitlines()[-1])
                        print(f"[x{k}] wrote {f} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
                    meta = json.loads(meta_f.read_text())
                    name = f"{args.base.name.split('.')[0]} ×{k}"
                    r = _run_set_k(name, [f], d, work, args, k)
                    r["replica"] = meta
                    for key in ("events", "json_bytes"):  # known here when the floor was not run
                        if r.get(key) is None and meta.get(key) is not None:
                            r[key] = meta[key]
                    results.append(r)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    doc = dict(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        machine=_machine(),
        tracekit_rev=rev,
        results=results,
    )
    print()
    print(f"{doc['date']} — {doc['machine']} — tracekit {rev}")
    print(HEADER)
    print("|" + "---|" * (HEADER.count(" | ") + 1))
    for r in results:
        print(_row(r))
    for line in _verdicts(results):
        print(line)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


def _run_set_k(name, files, trace_dir, work, args, k):
    skip = args.hta_max_k is not None and k > args.hta_max_k
    saved = args.skip_hta
    args.skip_hta = saved or skip
    args.skip_floor = args.floor_max_k is not None and k > args.floor_max_k
    try:
        r = run_set(name, files, trace_dir, work, args)
    finally:
        args.skip_hta = saved
        args.skip_floor = False
    r["k"] = k
    if skip and not saved:
        r["hta_skipped_reason"] = f"k > --hta-max-k {args.hta_max_k}"
    return r


if __name__ == "__main__":
    sys.exit(main())
