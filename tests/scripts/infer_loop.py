"""An inference-style loop with no optimizer: 2 ranks each run a model on their own
batch and all-reduce the mean prediction (a toy ensemble); ``tracekit.step()`` marks each iteration
(a no-op when not running under ``tracekit profile``).

    torchrun --nproc-per-node 2 infer_loop.py --steps 8
"""

import argparse
import gc

import torch
import torch.distributed as dist
import torch.nn as nn

import tracekit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    world = dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)).eval()
    x = y = None
    with torch.inference_mode():
        for _ in range(args.steps):
            x = torch.randn(16, 128)
            y = model(x).mean(0)
            dist.all_reduce(y)
            y /= world
            tracekit.step()
    del model, x, y  # freed and collected while the interpreter runs (see ddp_train.py's end)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
