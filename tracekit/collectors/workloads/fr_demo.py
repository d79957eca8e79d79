"""A small gloo job for recording hangs: STEPS steps of a matmul and an all_reduce of a buffer, with
faults injected (tracekit.collectors.faults). Run it under torchrun, e.g.::

    tracekit profile --fr --timeout 20 -- torchrun --nproc-per-node 2 -m tracekit.collectors.workloads.fr_demo \\
        --steps 6 --inject hang:1@3 --pg-timeout 5

``--pg-timeout`` (s) is the process group's timeout: a rank waiting for one that never comes
fails after it (gloo raises), so the job ends instead of waiting 30 minutes. Each step ends with
``tracekit.step()`` when the profile agent is there.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fr_demo", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--numel", type=int, default=1024, help="elements of the all_reduce buffer (float32)")
    ap.add_argument("--inject", action="append", default=[], help="KIND:RANK@STEP (hang, op, size) or delay:RANK@STEP:MS")
    ap.add_argument("--pg-timeout", type=float, default=10.0, help="process group timeout, s")
    args = ap.parse_args(argv)
    from tracekit.collectors.faults import check_faults, parse_fault, step_collective
    from tracekit.errors import BadInputError

    try:
        faults = [parse_fault(s) for s in args.inject]
        world = int(os.environ.get("WORLD_SIZE", "1"))
        check_faults(faults, world)
    except BadInputError as exc:
        print(f"fr_demo: {exc}", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    try:
        import tracekit

        step = tracekit.step
    except Exception:  # noqa: BLE001
        step = lambda: None  # noqa: E731
    a = torch.randn(64, 64)
    buf = torch.ones(args.numel)
    for i in range(args.steps):
        a = torch.tanh(a @ a)
        step_collective(buf, faults, rank, i)
        step()
    dist.barrier()
    # Let go of the tensors and collect while the interpreter runs: a gloo worker thread still
    # freeing a collective's work at the interpreter's exit can abort the process ("terminate called
    # without an active exception", as tests/scripts/ddp_train.py says; seen here after a size fault).
    del a, buf
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
