"""tracekit.collectors.pg_labels in a real one-rank gloo job (a subprocess, so that neither the
process group nor the wrapped torch.distributed leaks into the test process): every c10d call,
direct, from torch.distributed.nn.functional's backward, or from DDP's reducer through
``allreduce_hook``, lies inside the range naming its group, and the results are unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from tracekit.collectors.pg_labels import LABEL_PREFIX, WRAPPED  # noqa: E402
from tracekit.ingest import comm_families, pg_attribution  # noqa: E402

JOB = textwrap.dedent("""
    import gc, json, sys, torch, torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all_single
    from tracekit.collectors import pg_labels

    dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/store", rank=0, world_size=1)
    sub = dist.new_group([0], group_desc="sub")
    x = torch.arange(4.0, requires_grad=True)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1, bias=False), process_group=sub)
    model.register_comm_hook(sub, pg_labels.allreduce_hook)
    ref = torch.nn.Linear(4, 1, bias=False)
    ref.load_state_dict(model.module.state_dict())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x.detach()).sum().backward()       # DDP's bucket, through the hook alone
        ref(x.detach()).sum().backward()
        pg_labels.install()
        pg_labels.install()                      # idempotent: one range per call, not two
        t = torch.ones(3)
        dist.all_reduce(t, group=sub)            # keyword group
        dist.all_reduce(t, dist.ReduceOp.SUM)    # the default group
        y = all_to_all_single(torch.empty(4), x * 2, [4], [4], group=sub)
        y.sum().backward()                       # the backward all-to-all, from autograd
        model(x.detach()).sum().backward()       # the hook, with the wrapped all_reduce
        ref(x.detach()).sum().backward()         # both accumulate two backwards
    prof.export_chrome_trace(sys.argv[1] + "/trace.json")
    print(json.dumps(dict(sub=sub.group_name, world=dist.group.WORLD.group_name, t=t.tolist(), xgrad=x.grad.tolist(),
                          same_grad=bool(torch.equal(model.module.weight.grad, ref.weight.grad)))))
    del model, prof, y                           # DDP's works freed before the exit (tests/scripts/ddp_train.py)
    gc.collect()
    dist.destroy_process_group()
""")


def test_every_call_runs_inside_its_groups_range(tmp_path):
    out = subprocess.run([sys.executable, "-c", JOB, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["t"] == [1.0, 1.0, 1.0] and res["xgrad"] == [2.0] * 4 and res["same_grad"]
    ev = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    labels = [e for e in ev if e["name"].startswith(LABEL_PREFIX)]
    got = []
    for c in sorted((e for e in ev if e["name"].startswith("c10d::") and e["name"] != "c10d::wait"),
                    key=lambda e: e["ts"]):
        around = [e for e in labels if e["tid"] == c["tid"] and e["ts"] <= c["ts"] <= c["ts"] + c["dur"] <= e["ts"] + e["dur"]]
        got.append((c["name"], max(around, key=lambda e: e["ts"])["name"] if around else None))
    sub, world = LABEL_PREFIX + res["sub"], LABEL_PREFIX + res["world"]
    # DDP's reducer broadcasts its rebuilt bucket order (indices, sizes) at its second iteration
    # from C++: neither the hook nor install() reaches it, it stays unlabelled
    assert got == [("c10d::allreduce_", sub), ("c10d::allreduce_", sub), ("c10d::allreduce_", world),
                   ("c10d::alltoall_base_", sub), ("c10d::alltoall_base_", sub),
                   ("c10d::broadcast_", None), ("c10d::broadcast_", None), ("c10d::allreduce_", sub)]
    # one range per labelled call: installed once, the hook's own range only when not installed
    assert len(labels) == len(got) - 2


def test_the_reader_keeps_the_ranges_the_attribution_reads():
    assert LABEL_PREFIX == pg_attribution.LABEL_PREFIX == "tracekit.process_group:"
    assert LABEL_PREFIX in comm_families.COMM_CPU_PREFIX  # the reader keeps their rows for attribute.py
    assert {"all_reduce", "all_to_all_single", "reduce_scatter_tensor", "send", "irecv"} <= set(WRAPPED)
