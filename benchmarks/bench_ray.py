"""Benchmark: `tracekit ingest --engine local` against `--engine ray`, by ranks and by workers.

    python benchmarks/bench_ray.py [--ranks 64 256 1024] [--workers 1 2] [--engines local ray]
                                   [--base DIR] [--workdir DIR] [--out results.json]
    python benchmarks/bench_ray.py --per-rank FILE     # one large rank file in one Ray worker
    python benchmarks/bench_ray.py --jobs-dirs DIR... [--checkouts OLD NEW] [--held]

For every rank count N it writes a replica job (:func:`write_replica_job`) and, for every engine
and worker count W, ingests it into a fresh store in its own driver process, which reports its
wall time, its own CPU time (user + system; workers' not counted) and peak RSS
(``ru_maxrss`` of the driver itself: what the machine running `tracekit ingest` must hold).

* ``local``: ``ingest_paths(jobs=W)``: W = 1 is the driver alone, W > 1 a process pool of W.
* ``ray``: a Ray cluster started by this script before the timed runs (``ray.cluster_utils.Cluster``,
  one node of W CPUs, 100 MB object store), joined with ``address=``; the cluster's start-up is
  timed apart (``ray_start_s``), as a cluster normally runs already. Its worker processes are the
  cluster's, not the driver's: their memory is not in the driver's peak.

Then `tracekit analyze --json` on every rank count's run of the first engine with the most workers
(its wall time and the run's collectives rows: analyze should grow no faster than them).

**Replica job** (a stand-in until benchmarks/synth_job.py exists): rank r of N is a copy of the
base job's rank file r mod k (default ``fixtures/tp_2rank``, k = 2, a real 2-rank gloo TP run: 8
all-reduces of 131,072 B per rank) with ``distributedInfo.rank`` = r, ``world_size`` = N, every
process group of ``pg_config`` widened to ranks 0..N-1, and every integer ``pid`` p ≥ 100 (a
process id, not a device index) made p + r·PID_STRIDE; timestamps are kept, so every rank shares
the base ranks' timeline and every collective (pg, seq) is matched across all N ranks. It is
written gzip level 1 as ``rank{r}.pt.trace.json.gz`` (about 18 kB a rank).

``--per-rank FILE``: one rank file ingested inside one Ray worker (a fresh local Ray of one CPU):
the task's wall time, its rate (JSON bytes, gunzipped, / 1e6 / s) and the worker's peak RSS (``ru_maxrss``),
with the idle worker's beside it — the per-rank figures docs/scale.md extrapolates from.

``--phases``: each ingest is followed by a second one whose driver samples its own RSS every 20 ms
and marks where each phase begins (the read and assemble tasks, the group attribution, the clock
alignment, each run table's streaming): per phase the RSS at its start and its most
(:func:`phases_once`; what grows with the ranks, phase by phase).

``--jobs-dirs DIR...``: ingest these job folders (e.g. synth_job.py's ``DIR/traces``) instead of
replicas; ``--checkouts OLD NEW``: the driver imports each checkout in turn, interleaved per job (the
local engine; for Ray run the script once per checkout, so that the cluster's workers import it
too). ``--held``: only the bytes the driver receives from the read and assemble tasks (pickled
results summed over ranks), per job and checkout.

Writes nothing into the repository (replicas and stores live in a temporary directory, or
--workdir). Numbers: benchmarks/README.md, "Ray engine".
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_BASE = REPO / "fixtures" / "tp_2rank"
PID_STRIDE = 1 << 22  # Linux's largest pid_max: a copy's pids never meet another's


def _base_docs(base: Path) -> list[dict]:
    files = sorted(p for p in base.iterdir() if p.name.endswith((".json", ".json.gz")) and p.name != "run_config.json")
    if not files:
        raise SystemExit(f"{base}: no rank files")
    out = []
    for f in files:
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt") as fh:
            out.append(json.load(fh))
    return out


def write_replica_job(base: Path, n_ranks: int, out: Path) -> list[Path]:
    """Write an ``n_ranks``-rank job into ``out`` from the rank files of ``base`` (see the module
    docstring); returns the files written, rank order."""
    docs = _base_docs(Path(base))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for r in range(n_ranks):
        doc = docs[r % len(docs)]
        di = dict(doc.get("distributedInfo") or {}, rank=r, world_size=n_ranks)
        di["pg_config"] = [dict(pg, ranks=list(range(n_ranks)), pg_size=n_ranks) for pg in di.get("pg_config") or []]
        events = [e if not (isinstance(e.get("pid"), int) and e["pid"] >= 100) else dict(e, pid=e["pid"] + r * PID_STRIDE)
                  for e in doc["traceEvents"]]
        f = out / f"rank{r}.pt.trace.json.gz"
        with gzip.open(f, "wt", compresslevel=1) as fh:
            json.dump(dict(doc, distributedInfo=di, traceEvents=events), fh)
        written.append(f)
    return written


_DRIVER = r"""
import json, resource, sys, time
from tracekit.ingest import ingest_paths
src, store, engine, workers, address = sys.argv[1:6]
t0, c0 = time.perf_counter(), time.process_time()
ingest_paths([src], store, run_id="bench", engine=engine, jobs=int(workers), address=address or None)
wall = time.perf_counter() - t0
print(json.dumps(dict(wall_s=wall, driver_cpu_s=time.process_time() - c0,
                      driver_peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def ingest_once(src: Path, store: Path, engine: str, workers: int, address: str | None,
                checkout: Path | None = None) -> dict:
    """One ingest in a fresh driver process: its wall_s, driver_cpu_s, driver_peak_mib. ``checkout``:
    the tracekit checkout the driver imports (PYTHONPATH; default: the one on sys.path)."""
    env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
    # cwd: the checkout (``python -c`` puts the working directory first on sys.path)
    p = subprocess.run([sys.executable, "-c", _DRIVER, str(src), str(store), engine, str(workers), address or ""],
                       capture_output=True, text=True, timeout=3600, env=env, cwd=checkout or REPO)
    if p.returncode:
        raise SystemExit(f"ingest failed ({engine}, {workers} workers, {src}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def analyze_once(store: Path) -> dict:
    """`tracekit analyze --json` on the run: wall_s, and the run's collectives rows and instances."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "--store", str(store), "--json"],
                       capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"analyze failed: {p.stderr.strip()[-2000:]}")
    import duckdb

    rows = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{store}/runs/bench/collectives.parquet')").fetchone()[0]
    return dict(wall_s=wall, collectives=rows)


def _ingest_in_worker(path: str, store: str) -> dict:
    """A Ray task: ingest one rank file with the local engine inside this worker (the same two
    per-file functions a Ray ingest runs); its wall and CPU time (the reader's second thread
    included) and the worker's peak RSS."""
    import resource

    from tracekit.ingest import ingest_paths

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    ingest_paths([path], store, run_id="one", jobs=1)
    return dict(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, worker_peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                worker_before_mib=before, file_bytes=os.path.getsize(path))


def per_rank(path: Path, work: Path) -> dict:
    """One large rank file ingested in a Ray worker of a fresh local Ray instance: what one task
    costs (``wall_s``, ``MBps`` = JSON bytes / 1e6 / s, gunzipped size; ``MB_per_cpu_s`` the same per
    CPU second, the rate on a core of its own) and holds (``worker_peak_mib``; the idle
    worker, Ray and tracekit imported: ``worker_before_mib``)."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        store = work / "store-per-rank"
        shutil.rmtree(store, ignore_errors=True)
        out = ray.get(ray.remote(_ingest_in_worker).remote(str(path.resolve()), str(store.resolve())))
    finally:
        ray.shutdown()
    out["json_bytes"] = _json_bytes(path)
    out["MBps"] = out["json_bytes"] / 1e6 / out["wall_s"]
    out["MB_per_cpu_s"] = out["json_bytes"] / 1e6 / out["cpu_s"]  # what a worker with a core of its own reads
    return out


_HELD = r"""
import json, pickle, sys, tempfile
import tracekit.ingest as I
import tracekit.ingest.assemble as A
got = dict(read=0, assemble=0, ranks=0)
real_read, real_asm = I._read_one, A.assemble_rank
def read(a):
    r = real_read(a); got["read"] += len(pickle.dumps(r)); return r
def asm(t):
    r = real_asm(t); got["assemble"] += len(pickle.dumps(r)); got["ranks"] += 1; return r
I._read_one, A.assemble_rank = read, asm
I.ingest_paths([sys.argv[1]], tempfile.mkdtemp() + "/store", run_id="held", jobs=1)
print(json.dumps(got))
"""


def held_bytes(src: Path, checkout: Path | None = None) -> dict:
    """What the driver receives from the tasks of an ingest of ``src``: the pickled results of the
    read tasks and of the assemble tasks, bytes summed over ranks (an in-process ingest with both
    functions wrapped; ``checkout``: the tracekit checkout to run)."""
    env = dict(os.environ, PYTHONPATH=str(checkout)) if checkout else None
    p = subprocess.run([sys.executable, "-c", _HELD, str(src)], capture_output=True, text=True, timeout=3600, env=env,
                       cwd=checkout or REPO)
    if p.returncode:
        raise SystemExit(f"ingest failed ({src}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


_PHASES = r"""
import json, sys, threading, time
import tracekit.ingest.assemble as A
import tracekit.ingest.clocks as C
import tracekit.ingest.engine as E
from tracekit.ingest import ingest_paths
src, store, engine, workers, address = sys.argv[1:6]
marks, samples, stop = [], [], []
def rss():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) / 1024 for l in fh if l.startswith("VmRSS"))
def sample():
    while not stop:
        samples.append((time.perf_counter(), rss())); time.sleep(0.02)
def mark(name):
    marks.append((time.perf_counter(), name, rss()))
def wrap(owner, attr, before, after):
    real = getattr(owner, attr)
    def f(*a, **k):
        mark(before() if callable(before) else before)
        try:
            return real(*a, **k)
        finally:
            mark(after() if callable(after) else after)
    setattr(owner, attr, f)
maps = iter(["read tasks", "read done", "assemble tasks", "assemble done"] * 2)
for cls in (E.RayEngine, E.LocalEngine):
    wrap(cls, "map", lambda: next(maps), lambda: next(maps))
wrap(A.pg_attribution, "attribute", "group attribution", "DuckDB import, group sizes")
wrap(C, "estimate_offsets_from_files", "clock alignment", "events shifted")
real_read, last = A.read_part, [None]
def read_part(parts, name, rank, columns=None):
    if name != last[0]:
        last[0] = name; mark(f"streaming {name}")
    return real_read(parts, name, rank, columns)
A.read_part = read_part
threading.Thread(target=sample, daemon=True).start()
mark("start")
ingest_paths([src], store, run_id="bench", engine=engine, jobs=int(workers), address=address or None)
mark("end")
stop.append(1)
out = []
for i, (t, name, r) in enumerate(marks):
    t1 = marks[i + 1][0] if i + 1 < len(marks) else float("inf")
    seg = [m for tt, m in samples if t <= tt < t1] + [r]
    out.append(dict(phase=name, t_s=round(t - marks[0][0], 2), start_mib=round(r, 1), peak_mib=round(max(seg), 1)))
print(json.dumps(out))
"""


def phases_once(src: Path, store: Path, engine: str, workers: int, address: str | None) -> list[dict]:
    """One ingest in a fresh driver process with its RSS sampled every 20 ms (``/proc/self/status``)
    and marked where each phase begins (the engine's two maps, the group attribution, the clock
    alignment, each run table's streaming): per phase, its start time, the RSS at its start and the
    most until the next (MiB)."""
    p = subprocess.run([sys.executable, "-c", _PHASES, str(src), str(store), engine, str(workers), address or ""],
                       capture_output=True, text=True, timeout=3600, cwd=REPO)
    if p.returncode:
        raise SystemExit(f"ingest failed ({engine}, {workers} workers, {src}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _json_bytes(path: Path) -> int:
    """The JSON's size: the file's, or what it gunzips to."""
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            n += len(chunk)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--engines", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    ap.add_argument("--base", type=Path, default=DEFAULT_BASE)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jobs-dirs", type=Path, nargs="+", default=None, metavar="DIR",
                    help="ingest these job folders (e.g. synth_job.py's DIR/traces) instead of replica jobs; "
                         "--ranks is then each folder's file count")
    ap.add_argument("--checkouts", type=Path, nargs="+", default=None, metavar="DIR",
                    help="run the driver with each of these tracekit checkouts in turn (before/after), "
                         "interleaved per job; default: the tracekit on sys.path")
    ap.add_argument("--no-analyze", action="store_true", help="ingest only")
    ap.add_argument("--held", action="store_true",
                    help="only: per job folder and checkout, the bytes the driver receives from the tasks")
    ap.add_argument("--phases", action="store_true",
                    help="with each ingest, the driver's RSS by phase (sampled every 20 ms; Linux)")
    ap.add_argument("--per-rank", type=Path, default=None, metavar="FILE",
                    help="only: ingest this one (large) rank file in a Ray worker; its time, rate and peak RSS")
    a = ap.parse_args(argv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="tracekit-bench-ray-"))
    if a.per_rank:
        print(json.dumps(per_rank(a.per_rank, work)))
        return 0
    if a.held:
        for d in a.jobs_dirs or []:
            for co in a.checkouts or [None]:
                print(json.dumps(dict(job=str(d), checkout=str(co) if co else None, **held_bytes(d, co))))
        return 0
    results: dict = dict(load_before=os.getloadavg()[0], runs=[], analyze=[])
    jobs = {}
    if a.jobs_dirs:
        jobs = {len([f for f in d.iterdir() if f.name != "run_config.json"]): d for d in a.jobs_dirs}
        a.ranks = list(jobs)
    for n in a.ranks if not a.jobs_dirs else ():
        d = work / f"job{n}"
        if not (d.is_dir() and len(list(d.iterdir())) == n):
            t0 = time.perf_counter()
            write_replica_job(a.base, n, d)
            print(f"wrote {n} ranks in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        jobs[n] = d
    for w in a.workers:
        for engine in a.engines:
            cluster, address = None, None
            if engine == "ray":
                from ray.cluster_utils import Cluster

                t0 = time.perf_counter()
                cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=w, object_store_memory=100 * 2**20))
                address = cluster.address
                results.setdefault("ray_start_s", {})[w] = time.perf_counter() - t0
            try:
                for n in a.ranks:
                    for co in a.checkouts or [None]:  # before/after interleaved
                        store = work / f"store-{engine}-{w}-{n}"
                        shutil.rmtree(store, ignore_errors=True)
                        m = ingest_once(jobs[n], store, engine, w, address, co)
                        row = dict(engine=engine, workers=w, ranks=n, load=os.getloadavg()[0], **m)
                        if a.phases and co is None:  # a second ingest, sampled (the first is the timed one)
                            shutil.rmtree(store, ignore_errors=True)
                            row["phases"] = phases_once(jobs[n], store, engine, w, address)
                        if co:
                            row["checkout"] = str(co)
                        results["runs"].append(row)
                        print(json.dumps(row), file=sys.stderr)
                        if w == max(a.workers) and engine == a.engines[0] and not a.no_analyze and co is None:
                            an = dict(ranks=n, **analyze_once(store))
                            results["analyze"].append(an)
                            print(json.dumps(an), file=sys.stderr)
                        shutil.rmtree(store, ignore_errors=True)
            finally:
                if cluster is not None:
                    cluster.shutdown()
    text = json.dumps(results, indent=1)
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
