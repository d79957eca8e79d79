"""A GPU rank's collectives resolved once per pattern (tracekit.ingest.attribute._gpu_table: kernels
of the same metadata, enclosed by ops of the same metadata, share one resolution; each keeps its
own event_id, times, launch and seq; a rank of few kernels resolves each on its own): rows
computed by hand, and against resolving every kernel on its own (the rules of attribute._resolve
and _finish_row, kernel by kernel)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

import tracekit.ingest.attribute as attribute
from tracekit.ingest.assemble import rank_collectives
from tracekit.ingest.linkpass import ById
from tracekit.ingest.staging import MetaRows, _meta_batch
from tracekit.store import COLLECTIVES_SCHEMA

KERNEL = "ncclKernel_AllReduce_RING_LL_Sum_float"
THREAD = dict(device=100, track=200)  # the CPU thread that runs the ops and launches the kernels


def _rpc(eid, ts, seq, nelems=1024, dur=50):
    return dict(event_id=eid, name="record_param_comms", gpu=False, ts_ns=ts, dur_ns=dur, category="cpu_op",
                correlation=None, collective="allreduce", in_nelems=nelems, out_nelems=nelems, dtype="Float",
                group_size=2, seq=seq, **THREAD)


def _kernel(eid, ts, corr, **meta):
    return dict(event_id=eid, name=KERNEL, gpu=True, device=0, track=7, ts_ns=ts, dur_ns=30, category="kernel",
                correlation=corr, **meta)


def _launches(calls):
    """(event_id, start, end) of launch calls on THREAD → the ById the link pass gives."""
    calls = sorted(calls)
    col = lambda k: np.array([c[k] for c in calls], dtype=np.int64)  # noqa: E731
    n = len(calls)
    return ById(col(0), [np.full(n, THREAD["device"]), np.full(n, THREAD["track"]), col(1), col(2)], [None] * 4)


def _table(rows, launches):
    meta = MetaRows(pa.Table.from_batches([_meta_batch(rows)]))
    got = list(attribute.build_collectives("r", 0, meta, launches, world_size=2, pg_config={}, cpu_only=False))
    return meta, rank_collectives(got)


def test_kernels_alike_share_a_resolution_and_keep_their_own_values(monkeypatch):
    monkeypatch.setattr(attribute, "PATTERNS_FROM", 1)  # patterns for these few kernels too
    calls = []
    real = attribute._resolve
    monkeypatch.setattr(attribute, "_resolve", lambda k, e: calls.append(k["event_id"]) or real(k, e))
    rows = [
        _rpc(1, 990, seq=7), _kernel(11, 1100, corr=501),  # 1024 floats: S = 4096 B
        _rpc(2, 1990, seq=8), _kernel(12, 2100, corr=502),  # the same but seq and correlation
        _rpc(3, 2990, seq=9, nelems=2048), _kernel(13, 3100, corr=503),  # twice the elements
        _kernel(14, 4100, corr=504),  # launched outside the capture: the kernel's name only
        _rpc(5, 4990, seq=20), _kernel(15, 5100, corr=505, collective="allreduce", in_nelems=10, dtype="Float",
                                       group_size=2, seq=3),  # its own metadata wins
        _rpc(6, 5990, seq=21), _kernel(16, 6100, corr=506, collective="allreduce", in_nelems=10, dtype="Float",
                                       group_size=2, seq=-1),  # a negative seq is none: numbered
        _rpc(7, 6990, seq=22), _kernel(17, 7100, corr=507, collective="allreduce", in_nelems=10, dtype="Float",
                                       group_size=2, seq="5"),  # not an integer: none, numbered
    ]
    launches = _launches([(11, 1000, 1010), (12, 2000, 2010), (13, 3000, 3010), (15, 5000, 5010),
                          (16, 6000, 6010), (17, 7000, 7010)])
    _, t = _table(rows, launches)
    cols = ["event_id", "op", "meta_source", "size_bytes", "wire_bytes", "seq", "issue_ts_ns", "ts_ns", "dtype",
            "pg_name", "group_size"]
    got = [tuple(r[c] for c in cols) for r in t.select(cols).to_pylist()]
    # all-reduce on 2 ranks: wire = 2(k-1)/k * S = S; name-only and metadata-less-seq rows numbered
    # in call order (issue 4100, 6000, 7000 → 0, 1, 2)
    assert got == [
        (11, "all_reduce", "record_param_comms", 4096, 4096, 7, 1000, 1100, "Float", "default", 2),
        (12, "all_reduce", "record_param_comms", 4096, 4096, 8, 2000, 2100, "Float", "default", 2),
        (13, "all_reduce", "record_param_comms", 8192, 8192, 9, 3000, 3100, "Float", "default", 2),
        (14, "all_reduce", "name_only", None, None, 0, 4100, 4100, None, "default", 2),
        (15, "all_reduce", "kernel_args", 40, 40, 3, 5000, 5100, "Float", "default", 2),
        (16, "all_reduce", "kernel_args", 40, 40, 1, 6000, 6100, "Float", "default", 2),
        (17, "all_reduce", "kernel_args", 40, 40, 2, 7000, 7100, "Float", "default", 2),
    ]
    # one resolution per pattern: 11 and 12 alike, 15 and 16 alike (an integer seq is no part of it)
    assert sorted(calls) == [11, 13, 14, 15, 17]
    assert t.schema == COLLECTIVES_SCHEMA and t.column("cpu_side").to_pylist() == [False] * 7


def _enclosing_by_brute_force(meta, launches):
    """GPU meta row → the CPU rows enclosing its launch call (every op and call here is on THREAD),
    innermost first (latest start, then the shorter), by testing every pair."""
    cpu = np.flatnonzero(~meta.gpu).tolist()
    out = {}
    for k in np.flatnonzero(meta.gpu).tolist():
        found, cols, _ = launches.lookup(meta.event_id[[k]])
        if not found[0]:
            continue
        s, e = int(cols[2][0]), int(cols[3][0])
        enc = [j for j in cpu if meta.ts_ns[j] <= s and meta.ts_ns[j] + meta.dur_ns[j] >= e]
        if enc:
            out[k] = sorted(enc, key=lambda j: (-int(meta.ts_ns[j]), int(meta.dur_ns[j])))
    return out


def _per_kernel(meta, launches):
    """Every GPU row resolved on its own (no patterns, enclosing ops by brute force), as the rows of
    the collectives table."""
    enclosing = _enclosing_by_brute_force(meta, launches)
    out = []
    for k in np.flatnonzero(meta.gpu).tolist():
        found, cols, _ = launches.lookup(meta.event_id[[k]])
        sp = meta.row(k)
        res = attribute._resolve(sp, [meta.row(j) for j in enclosing.get(k, ())])
        out.append(dict(attribute._finish_row("r", 0, sp, res, int(cols[2][0]) if found[0] else None, 2, {}),
                        cpu_side=False))
    return rank_collectives([pa.Table.from_pylist(out, schema=COLLECTIVES_SCHEMA)])


@pytest.mark.parametrize("patterns_from", [256, 10**9])
def test_patterns_match_resolving_each_kernel_on_its_own(patterns_from, monkeypatch):
    monkeypatch.setattr(attribute, "PATTERNS_FROM", patterns_from)  # 300 kernels: by pattern, or each on its own
    rng = random.Random(5)
    rows, calls = [], []
    for i in range(300):  # a few metadata variants each, seqs of every form (one an object holding a
        # "seq" key of its own: not the call's seq), some launches missing
        base = 1000 * i
        rpc = _rpc(10 * i, base, seq=rng.choice([i, i + 1, -3, None, "x", 10**20, {"seq": 7}, [7]]), nelems=rng.choice([8, 64]))
        if rpc["seq"] is None:
            del rpc["seq"]
        if rng.random() < 0.3:
            rpc.update(name="nccl:all_gather", input_dims=[[rng.choice([4, 16])]], input_type=["c10::Half"])
            for k in ("collective", "in_nelems", "out_nelems"):
                del rpc[k]
        meta = {} if rng.random() < 0.6 else dict(collective=rng.choice(["allreduce", "broadcast"]),
                                                   in_nelems=rng.choice([1, 2]), dtype="Float", seq=i)
        rows += [rpc, _kernel(10 * i + 1, base + 100, corr=i, **meta)]
        if rng.random() < 0.85:
            calls.append((10 * i + 1, base + rng.choice([-5, 10]), base + 20))
    rng.shuffle(rows)
    launches = _launches(calls)
    real, n = attribute._resolve, []
    monkeypatch.setattr(attribute, "_resolve", lambda k, e: n.append(1) or real(k, e))
    meta, t = _table(rows, launches)
    assert 10 < len(n) < 150 if patterns_from <= 300 else len(n) == 300
    monkeypatch.setattr(attribute, "_resolve", real)
    assert t.equals(_per_kernel(meta, launches))
    assert set(t.column("meta_source").to_pylist()) == {"kernel_args", "record_param_comms", "cpu_op_dims", "name_only"}
