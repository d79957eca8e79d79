"""Name each collective's process group in the trace, for backends whose trace does not.

torch's CPU (gloo) traces record no ``Process Group Name`` on the ``c10d::*`` ops (torch 2.13),
and when two groups of a rank run calls of one op and size at the same time nothing else in the
trace tells which call was whose (tracekit.ingest.pg_attribution leaves such a call unassigned).
This module makes the job say it: each collective runs inside a profiler range
(``torch.profiler.record_function``) named ``LABEL_PREFIX + group.group_name``, on the issuing
thread, around the ``c10d::*`` op it issues; the ingest reads the innermost such range around a
call as that call's group (pg_attribution, rule "the trace names it").

Public API:

- :data:`LABEL_PREFIX`: ``"tracekit.process_group:"``; the range of group "3" is
  ``tracekit.process_group:3`` (the name is the group's ``group_name``, as
  ``distributedInfo.pg_config`` lists it);
- :func:`label`: the range for one group, ``with label(group): dist.all_reduce(t, group=group)``;
- :func:`install`: wraps the collective and point-to-point functions of ``torch.distributed``
  (:data:`WRAPPED`) in this process, so that every later call through the module
  (``dist.all_reduce(...)``, ``torch.distributed.nn.functional``'s forward and backward calls
  included) runs inside its group's range while the profiler records (otherwise the call goes
  straight through); idempotent. The built-in collectors call it on gloo. Cost: one
  ``record_function`` per profiled call (benchmarks/README.md);
- :func:`allreduce_hook`: a DDP communication hook (``ddp.register_comm_hook(group, hook)``)
  that all-reduces each gradient bucket inside the range (DDP's reducer calls the process group
  from C++, where :func:`install` cannot reach), averaging as DDP's default hook does.

A call on a group this rank is not in (``GroupMember.NON_GROUP_MEMBER``) is not labelled, nor is
what a library issues from C++ past both (DDP's reducer broadcasting its rebuilt bucket order
once, at its second iteration): the ingest attributes those by the timing rules, as before.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

# The range name's prefix (tracekit/vocab.py); the ingest (tracekit.ingest.pg_attribution, rule 0)
# reads what this writes. This module imports only the standard library and tracekit.vocab (torch
# when called), so that the agent ``tracekit profile`` injects into a job can use it.
from tracekit.vocab import LABEL_PREFIX

WRAPPED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
           "all_to_all", "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier",
           "send", "recv", "isend", "irecv")
"""The ``torch.distributed`` functions :func:`install` wraps (those of them this torch has, with a
``group`` argument)."""

_MARK = "_tracekit_pg_label"


def group_name(group: Any) -> str | None:
    """The ``group_name`` of ``group`` (None: the default group); None when this rank is not in it."""
    import torch.distributed as dist

    g = dist.group.WORLD if group is None else group
    name = getattr(g, "group_name", None)
    return None if name is None else str(name)


def label(group: Any):
    """The profiler range naming ``group`` (a context manager; a no-op one when the rank is not in it)."""
    from torch.profiler import record_function

    name = group_name(group)
    return contextlib.nullcontext() if name is None else record_function(LABEL_PREFIX + name)


def _wrap(fn):
    import torch

    params = list(inspect.signature(fn).parameters.values())
    at = [p.name for p in params].index("group")
    default = params[at].default

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not torch.autograd._profiler_enabled():  # nothing records the range: no cost
            return fn(*args, **kwargs)
        group = kwargs["group"] if "group" in kwargs else args[at] if len(args) > at else default
        with label(group):
            return fn(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def install() -> None:
    """Wrap :data:`WRAPPED` in ``torch.distributed`` (module docstring); a second call does nothing."""
    import torch.distributed as dist

    for name in WRAPPED:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, _MARK, False) and "group" in inspect.signature(fn).parameters:
            setattr(dist, name, _wrap(fn))


def allreduce_hook(process_group, bucket):
    """DDP communication hook: all-reduce the bucket's flattened gradients on ``process_group``
    (None: the default group) inside its range, divided by the group size (DDP's default hook).
    Unannotated: DDP rejects annotations other than its own, and this module's are strings."""
    import torch.distributed as dist

    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(process_group))
    installed = getattr(dist.all_reduce, _MARK, False)  # then the call labels itself: one range, not two
    with contextlib.nullcontext() if installed else label(process_group):
        work = dist.all_reduce(tensor, group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
