"""The GPU check: every built-in workload on NCCL, a profiled DDP job, and what must hold.

    python benchmarks/gpu_check.py [--out DIR] [--keep]

On a machine without CUDA it prints ``no CUDA device: skipped`` and exits 0 (so CI runs it
everywhere and it cannot rot). With CUDA, by the number of GPUs n:

- n ≥ 2: every workload with ``--backend nccl`` on 2 ranks (tp, tp --mode train, tp
  --overlap-chunks 2, ep, pp, disagg-kv, 3d sized to n, sweep up to 4 MB), and a small DDP job
  (``torch.nn.parallel.DistributedDataParallel``, 4 MB buckets) run by ``tracekit profile --
  torchrun --nproc-per-node 2``;
- n = 1: world size 1 on NCCL (tp, tp --mode train, 3d 1×1×1) and the DDP job on one rank. (CUDA
  compute with gloo is not a mode of the collectors: under gloo they compute on the CPU; the
  table says so.)
- with ``nsys`` on PATH, also ``collect tp --profiler nsys``.

Every run is ingested into one store and checked (the functions below, each returning a list of
problems, empty when it holds): NCCL kernels recognised from their metadata, with the op and
size the workload's run config expects (:func:`check_calls`, :func:`check_gpu_comm`); every
instance complete (:func:`check_complete`); overlap computed per rank with communication and
compute on different GPU streams (:func:`check_overlap`); no warning about clocks
(:func:`check_no_clock_warnings`). One summary table; exit 1 if any check failed. Sized to finish
in under 5 minutes on one GPU (tiny models, few steps).

The check functions are unit-tested on recorded CPU runs (tests/collectors/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SKIP_LINE = "no CUDA device: skipped"
JOB_TIMEOUT_S = 240

#: the small DDP job `tracekit profile` runs (one rank per GPU; torchrun sets LOCAL_RANK)
DDP_JOB = '''\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
ddp = DDP(model, device_ids=[rank], bucket_cap_mb=4)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for _ in range(8):
    loss = ddp(torch.randn(64, 1024, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
dist.destroy_process_group()
'''


# --------------------------------------------------------------------------- the checks


def _q(con, sql: str, params: list | None = None) -> list[tuple]:
    return con.execute(sql, params or []).fetchall()


def expected_calls(config: dict[str, Any]) -> dict[str, set[int] | None]:
    """{op: the sizes (nccl-tests S, bytes) every call of that op must have, or None: any size}
    that a built-in workload's run config promises; {} for a run config without one (a
    profiled job). The ops listed must all appear; others may too."""
    w = config.get("workload")
    exp = config.get("expected") or {}
    if w == "tp":
        return {"all_reduce": {exp["all_reduce_bytes"]}}
    if w == "3d":
        sizes = {exp["tp_all_reduce_bytes"]} if config.get("tp", 1) > 1 else set()
        if config.get("dp_mode") == "ddp" and config.get("dp", 1) > 1:
            sizes |= {b for stage in exp["dp_bucket_bytes"] for b in stage}
        out: dict[str, set[int] | None] = {"all_reduce": sizes} if sizes else {}
        if config.get("pp", 1) > 1:
            out.update(send={exp["pp_message_bytes"]}, recv={exp["pp_message_bytes"]})
        if config.get("dp_mode") == "fsdp" and config.get("dp", 1) > 1:
            out.update(reduce_scatter=None, all_gather=None)
        return out
    if w == "ep":
        return {"all_to_all": None}
    if w in ("pp", "disagg_kv"):
        return {"send": None, "recv": None}
    if w == "sweep":
        return {op: None for per_rank in exp.get("calls_per_rank", []) for op in per_rank if op != "barrier"}
    return {}


def check_calls(con, run_id: str, expected: dict[str, set[int] | None]) -> list[str]:
    """Every op of `expected` was recorded, each call with one of its sizes; no comm span without
    a collective (op NULL)."""
    problems = []
    rows = _q(con, "SELECT op, size_bytes, count(*) FROM collectives WHERE run_id = ? GROUP BY ALL", [run_id])
    seen: dict[str | None, set] = {}
    for op, size, n in rows:
        seen.setdefault(op, set()).add(size)
    for op, sizes in expected.items():
        if op not in seen:
            problems.append(f"no {op} recorded")
        elif sizes is not None and not seen[op] <= sizes:
            problems.append(f"{op} sizes {sorted(s for s in seen[op] if s is not None)} not all in {sorted(sizes)}")
    if None in seen:
        n = sum(n for op, _, n in rows if op is None)
        problems.append(f"{n} comm span(s) with no collective attributed")
    return problems


def check_gpu_comm(con, run_id: str) -> list[str]:
    """NCCL kernels recognised: communication runs on GPU streams, and every collective was
    identified from metadata (kernel args or record_param_comms), not from its name alone."""
    problems = []
    ((n_gpu,),) = _q(con, "SELECT count(*) FROM events WHERE run_id = ? AND class = 'comm' AND track_kind = 'gpu_stream'",
                     [run_id])
    if n_gpu == 0:
        problems.append("no communication kernels on GPU streams")
    by_source = dict(_q(con, "SELECT meta_source, count(*) FROM collectives WHERE run_id = ? GROUP BY ALL", [run_id]))
    weak = {k: v for k, v in by_source.items() if k not in ("kernel_args", "record_param_comms")}
    if weak:
        problems.append("collectives not identified from metadata: " + ", ".join(f"{v} by {k}" for k, v in sorted(weak.items())))
    return problems


def check_complete(con, run_id: str) -> list[str]:
    """Every matched instance was recorded by every rank of its group, and the ranks agree."""
    ((inc, dis, total),) = _q(con, "SELECT count(*) FILTER (WHERE NOT complete), count(*) FILTER (WHERE disagree), count(*) "
                                   "FROM collective_instances WHERE run_id = ?", [run_id])
    problems = [] if total else ["no collective instances"]
    if inc:
        problems.append(f"{inc} of {total} instances incomplete")
    if dis:
        problems.append(f"{dis} of {total} instances where ranks disagree")
    return problems


def check_overlap(con, run_id: str, gpu: bool) -> list[str]:
    """Overlap was computed for every rank (communication present, overlap_ratio not null); on a
    GPU, communication and compute ran on different streams of each rank (so they can overlap)."""
    problems = []
    rows = _q(con, "SELECT rank, comm_ns, overlap_ratio FROM overlap_by_rank WHERE run_id = ? ORDER BY rank", [run_id])
    if not rows:
        problems.append("no overlap rows")
    for rank, comm, ratio in rows:
        if not comm or ratio is None:
            problems.append(f"rank {rank}: no communication to overlap (comm {comm} ns)")
    if gpu:
        streams = _q(con, """SELECT rank, list(DISTINCT track) FILTER (WHERE class = 'comm'),
                                    list(DISTINCT track) FILTER (WHERE class = 'compute')
                             FROM events WHERE run_id = ? AND track_kind = 'gpu_stream' GROUP BY rank ORDER BY rank""",
                     [run_id])
        if not streams:
            problems.append("no GPU stream events")
        for rank, comm_streams, compute_streams in streams:
            if not comm_streams or not compute_streams:
                problems.append(f"rank {rank}: comm streams {comm_streams}, compute streams {compute_streams}")
            elif set(comm_streams) & set(compute_streams):
                problems.append(f"rank {rank}: communication and compute share streams {sorted(set(comm_streams) & set(compute_streams))}")
    return problems


def check_no_clock_warnings(con, run_id: str) -> list[str]:
    """No rank of the run has a warning that mentions clocks."""
    return [f"rank {r}: {w}" for r, ws in _q(con, "SELECT rank, warnings FROM ranks WHERE run_id = ? ORDER BY rank", [run_id])
            for w in (ws or []) if "clock" in w.lower()]


def check_run(con, run_id: str, config: dict[str, Any], gpu: bool = True) -> list[str]:
    """All the checks of one ingested run; the problems, empty when everything holds."""
    problems = check_calls(con, run_id, expected_calls(config))
    if gpu:
        problems += check_gpu_comm(con, run_id)
    return problems + check_complete(con, run_id) + check_overlap(con, run_id, gpu) + check_no_clock_warnings(con, run_id)


# --------------------------------------------------------------------------- the plan


@dataclass
class Job:
    """One run of the check: a `tracekit collect` (argv after ``collect``) or the profiled DDP job."""

    name: str
    argv: list[str] = field(default_factory=list)
    kind: str = "collect"  # collect | profile | skip
    ranks: int = 2
    note: str = ""


def plan(n_gpus: int, have_nsys: bool) -> list[Job]:
    """The jobs for a machine with `n_gpus` GPUs (none without CUDA) and nsys or not."""
    if n_gpus < 1:
        return []
    nccl = ["--backend", "nccl"]
    tiny_tp = ["--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64", "--batch", "2"]
    if n_gpus == 1:
        jobs = [
            Job("tp world 1 (nccl)", ["tp", "--ranks", "1", *tiny_tp, *nccl], ranks=1),
            Job("tp train world 1 (nccl)", ["tp", "--ranks", "1", "--mode", "train", *tiny_tp, *nccl], ranks=1),
            Job("3d 1x1x1 (nccl)", ["3d", "--tp", "1", "--pp", "1", "--dp", "1", *nccl], ranks=1),
            Job("ddp profile (1 rank)", kind="profile", ranks=1),
            Job("cuda compute + gloo", kind="skip",
                note="not a collector mode: under gloo the workloads compute on the CPU"),
        ]
    else:
        tp, pp, dp = (2, 2, 2) if n_gpus >= 8 else (2, 2, 1) if n_gpus >= 4 else (2, 1, 1)
        jobs = [
            Job("tp (nccl)", ["tp", "--ranks", "2", *tiny_tp, *nccl]),
            Job("tp train (nccl)", ["tp", "--ranks", "2", "--mode", "train", *tiny_tp, *nccl]),
            Job("tp 2 chunks (nccl)", ["tp", "--ranks", "2", "--overlap-chunks", "2", *tiny_tp, *nccl]),
            Job("ep (nccl)", ["ep", "--ranks", "2", "--layers", "2", "--hidden", "256", *nccl]),
            Job("pp 1f1b (nccl)", ["pp", "--ranks", "2", "--stages", "2", "--layers", "2", "--hidden", "256", *nccl]),
            Job("disagg-kv (nccl)", ["disagg-kv", "--ranks", "2", "--layers", "2", *nccl]),
            Job(f"3d {tp}x{pp}x{dp} ddp (nccl)", ["3d", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), *nccl],
                ranks=tp * pp * dp),
            Job("sweep to 4 MB (nccl)", ["sweep", "--ranks", "2", "--max-bytes", "4M", *nccl]),
            Job("ddp profile (2 ranks)", kind="profile", ranks=2),
        ]
        if dp > 1:
            jobs.insert(7, Job(f"3d {tp}x{pp}x{dp} fsdp (nccl)",
                               ["3d", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--dp-mode", "fsdp", *nccl],
                               ranks=tp * pp * dp))
    if have_nsys:
        r = "1" if n_gpus == 1 else "2"
        jobs.append(Job("tp under nsys (nccl)", ["tp", "--ranks", r, "--profiler", "nsys", *tiny_tp, *nccl], ranks=int(r)))
    return jobs


# --------------------------------------------------------------------------- running


def _cuda_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_job(job: Job, work: Path, store) -> tuple[str, str]:
    """Run, ingest and check one job; returns (status, detail): ok / FAIL / skip."""
    from tracekit import analyses
    from tracekit.ingest import ingest_paths

    if job.kind == "skip":
        return "skip", job.note
    out = work / job.name.replace(" ", "_").replace("(", "").replace(")", "")
    out.mkdir(parents=True)
    tk = [sys.executable, "-m", "tracekit"]
    if job.kind == "profile":
        script = out / "ddp_job.py"
        script.write_text(DDP_JOB)
        run_id = f"ddp-{job.ranks}"
        cmd = [*tk, "profile", "--store", str(store.path), "--run-id", run_id, "--out", str(out), "--",
               sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(job.ranks), str(script)]
    else:
        cmd = [*tk, "collect", *job.argv, "--out", str(out), "--no-ingest"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return "FAIL", f"exit {p.returncode}: {tail[-1] if tail else ''}"
    if job.kind == "profile":
        config = {"workload": "external"}
    else:
        run_dir = next(d for d in out.iterdir() if d.is_dir() and (d / "run_config.json").exists())
        config = json.loads((run_dir / "run_config.json").read_text())
        run_id = ingest_paths([str(run_dir)], store, workload=config["workload"], config=config, run_id=run_dir.name)
    con = analyses.connect(store, [run_id])
    try:
        problems = check_run(con, run_id, config, gpu=True)
    finally:
        con.close()
    return ("FAIL", "; ".join(problems)) if problems else ("ok", f"run {run_id}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="working folder (default: a temporary one, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    args = ap.parse_args(argv)
    n = _cuda_gpus()
    if n == 0:
        print(SKIP_LINE)
        return 0
    from rich.console import Console
    from rich.table import Table

    from tracekit.store import Store

    work = Path(args.out or tempfile.mkdtemp(prefix="tk-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    store = Store(work / "store")
    jobs = plan(n, shutil.which("nsys") is not None)
    table = Table(title=f"tracekit GPU check: {n} GPU(s)")
    for col in ("job", "ranks", "status", "s", "detail"):
        table.add_column(col, justify="right" if col in ("ranks", "s") else "left")
    failed = 0
    for job in jobs:
        t0 = time.perf_counter()
        try:
            status, detail = run_job(job, work, store)
        except subprocess.TimeoutExpired:
            status, detail = "FAIL", f"did not finish in {JOB_TIMEOUT_S} s"
        except Exception as exc:  # noqa: BLE001 - one row per job, whatever went wrong
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
        failed += status == "FAIL"
        table.add_row(job.name, str(job.ranks), status, f"{time.perf_counter() - t0:.1f}", detail)
    Console(width=160).print(table)
    if not args.keep and not args.out:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{failed} of {len(jobs)} job(s) failed" if failed else f"all {len(jobs)} job(s) passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
