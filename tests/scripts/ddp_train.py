"""A small DDP training script, written the way users write them (no tracekit in it).

    torchrun --nproc-per-node 2 ddp_train.py --steps 8

Each step: a forward on a random batch, cross-entropy, backward (DDP all-reduces
the gradients: one bucket for this small model), SGD step. ``--crash-rank R``
makes rank R die hard (``os._exit``, as a segfault or an OOM kill would) right
after its second optimizer step: by then every other rank has ended its first step (its share of
the second step's all-reduce came after it), so a profiler with one warm-up step is recording on
each of them when the launcher stops them, however loaded the machine.
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class MLP(nn.Module):
    def __init__(self, d_in=64, d_hidden=256, n_classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.head = nn.Linear(d_hidden, n_classes)

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--crash-rank", type=int, default=None)
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1234 + rank)

    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=gen)
        y = torch.randint(0, 10, (args.batch,), generator=gen)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if args.crash_rank == rank and step == 1:
            print(f"rank {rank}: simulated crash after step 2", flush=True)
            os._exit(3)

    # Let go of the model and collect before the end. At the interpreter's exit a gloo worker thread
    # may still be freeing an all-reduce work of DDP's, whose thread-local state holds a Python
    # object: it asks the finalizing interpreter for the GIL, is made to exit inside a destructor and
    # the process aborts ("terminate called without an active exception", SIGABRT; torch 2.13, the
    # more often the more the machine is loaded). Freed here, the works go while the interpreter runs.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
