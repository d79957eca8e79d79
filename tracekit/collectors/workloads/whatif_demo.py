"""A small gloo job for checking what-if predictions on real runs: STEPS steps of a fixed amount of
compute (OPS matmuls of DIM × DIM, one thread per rank; then SLEEP_MS of waiting, which a loaded
machine does not stretch as it stretches compute) and an all_reduce, with faults injected
(tracekit.collectors.faults; ``delay:RANK@STEP:MS`` makes a straggler of known skew). Run it under
``tracekit profile``, e.g.::

    tracekit profile --wait 0 --warmup 1 --active 3 -- torchrun --nproc-per-node 2 \\
        -m tracekit.collectors.workloads.whatif_demo --steps 4 --inject delay:1@2:200

Each step ends with ``tracekit.step()`` when the profile agent is there.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="whatif_demo", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ops", type=int, default=12, help="matmuls per step")
    ap.add_argument("--dim", type=int, default=384, help="matrix side")
    ap.add_argument("--sleep-ms", type=float, default=0.0,
                    help="per step, this long waiting (a stand-in for work the CPU waits for: steady under load)")
    ap.add_argument("--numel", type=int, default=1 << 16, help="elements of the all_reduce buffer (float32)")
    ap.add_argument("--inject", action="append", default=[], help="delay:RANK@STEP:MS (or another fault kind)")
    args = ap.parse_args(argv)
    from tracekit.collectors.faults import check_faults, parse_fault, step_collective
    from tracekit.errors import BadInputError

    try:
        faults = [parse_fault(s) for s in args.inject]
        check_faults(faults, int(os.environ.get("WORLD_SIZE", "1")))
    except BadInputError as exc:
        print(f"whatif_demo: {exc}", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    try:
        import tracekit

        step = tracekit.step
    except Exception:  # noqa: BLE001
        step = lambda: None  # noqa: E731
    torch.manual_seed(0)
    a = torch.randn(args.dim, args.dim) / args.dim ** 0.5
    buf = torch.ones(args.numel)
    x = None
    for i in range(args.steps):
        x = a
        for _ in range(args.ops):
            x = torch.tanh(x @ a)
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000.0)
        step_collective(buf, faults, rank, i)
        step()
    dist.barrier()
    # Let go of the tensors and collect while the interpreter runs (as fr_demo does, for the same
    # reason: a gloo worker thread still freeing a collective's work at the interpreter's exit can
    # abort the process with SIGABRT).
    del a, x, buf
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
