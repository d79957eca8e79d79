"""Fault injection for the collectors' workloads: make one rank hang, desynchronise or straggle on
purpose, so that a hang (and its Flight Recorder dumps) can be recorded with known truth.

A fault is ``KIND:RANK@STEP`` (``delay:RANK@STEP:MS`` for a delay), 0-based rank and step; several
may be given. At that step, on that rank, the step's collective (an all_reduce of the workload's
buffer on the given group) is replaced:

- ``hang``: the rank never issues it (sleeps until it is killed): the other ranks wait in it;
- ``op`` (alias ``desync``): the rank issues a broadcast instead of the all_reduce;
- ``size``: the rank issues the all_reduce on its buffer viewed as another shape (2 × n/2: the
  same bytes). A byte count that differs is what a real size desync is, but on gloo it aborts every
  rank of the collective inside gloo's transport ("Received data size doesn't match expected
  size", std::terminate) before any rank can dump; gloo does not compare shapes, Flight Recorder
  records them (input_sizes), so the job runs on and the dumps at exit show the mismatch;
- ``dtype``: the rank issues the all_reduce on its buffer viewed as int32 (the same bytes);
- ``delay``: the rank sleeps MS milliseconds first, then issues it (a straggler of known skew).

Standard library only at import; torch is imported by the caller.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from tracekit.errors import BadInputError

KINDS = ("hang", "op", "desync", "size", "dtype", "delay")
_SPEC = re.compile(r"^(?P<kind>[a-z]+):(?P<rank>\d+)@(?P<step>\d+)(?::(?P<ms>\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` (hang / op / size / delay), the rank and step (0-based) it hits,
    and for a delay its length in ms."""

    kind: str
    rank: int
    step: int
    delay_ms: float = 0.0

    def spec(self) -> str:
        """The fault as written on the command line."""
        tail = f":{self.delay_ms:g}" if self.kind == "delay" else ""
        return f"{self.kind}:{self.rank}@{self.step}{tail}"


def parse_fault(text: str) -> Fault:
    """``'hang:1@3'`` → Fault('hang', 1, 3); ``'delay:0@2:150'`` → a 150 ms delay.
    Raises BadInputError (one line) for anything else."""
    m = _SPEC.match(str(text).strip())
    if not m or m["kind"] not in KINDS:
        raise BadInputError(f"--inject {text!r}: expected hang:RANK@STEP, op:RANK@STEP, size:RANK@STEP, "
                            "dtype:RANK@STEP or delay:RANK@STEP:MS")
    kind = "op" if m["kind"] == "desync" else m["kind"]
    if kind == "delay" and m["ms"] is None:
        raise BadInputError(f"--inject {text!r}: a delay needs its length: delay:RANK@STEP:MS")
    if kind != "delay" and m["ms"] is not None:
        raise BadInputError(f"--inject {text!r}: only a delay takes a length (:MS)")
    return Fault(kind, int(m["rank"]), int(m["step"]), float(m["ms"] or 0.0))


def check_faults(faults, world_size: int) -> None:
    """BadInputError when a fault names a rank outside 0..world_size−1."""
    for f in faults:
        if f.rank >= world_size:
            raise BadInputError(f"--inject {f.spec()}: rank {f.rank} is not in a job of {world_size} ranks")


def fault_at(faults, rank: int, step: int) -> Fault | None:
    """The fault that hits ``rank`` at ``step``, if any (the first given)."""
    return next((f for f in faults if f.rank == rank and f.step == step), None)


def step_collective(buf, faults, rank: int, step: int, group=None, hang_s: float = 3600.0) -> None:
    """The step's all_reduce of ``buf`` on ``group``, or the fault that replaces it (module doc)."""
    import torch
    import torch.distributed as dist

    f = fault_at(faults, rank, step)
    if f is None:
        dist.all_reduce(buf, group=group)
    elif f.kind == "hang":
        time.sleep(hang_s)
    elif f.kind == "op":
        dist.broadcast(buf, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    elif f.kind == "size":
        n = buf.numel()
        dist.all_reduce(buf.view(2, n // 2) if n % 2 == 0 else buf.view(1, n), group=group)
    elif f.kind == "dtype":
        dist.all_reduce(buf.view(torch.int32) if buf.element_size() == 4 else buf.view(torch.uint8), group=group)
    elif f.kind == "delay":
        time.sleep(f.delay_ms / 1000.0)
        dist.all_reduce(buf, group=group)
