"""`tp --overlap-chunks N`: the chunked forward equals the plain one, each block's
all-reduce becomes N asynchronous all-reduces of 1/N the size, and the recorded
fixture (fixtures/tp_chunks_2rank, N = 4) shows exactly that next to the
unchunked fixtures/tp_2rank of the same model.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tracekit.errors import BadInputError

torch = pytest.importorskip("torch")

from tracekit.collectors.workloads import tp  # noqa: E402
from tests.collectors.test_tp_workload import FIXTURE as PLAIN_FIXTURE  # noqa: E402
from tests.collectors.test_tp_workload import FIXTURE_CFG, comm_summary, load_trace  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "tp_chunks_2rank"
CHUNKS = 4


class _SumWorld:
    """`n` thread ranks whose async all-reduce sums in place through a barrier
    (the sum happens at launch; wait() is a no-op), recording each call's shape."""

    def __init__(self, n: int):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots: list = [None] * n
        self.shapes: list[list[tuple]] = [[] for _ in range(n)]

    def all_reduce_async(self, rank: int):
        class Done:
            def wait(self):
                return True

        def f(t):
            self.shapes[rank].append(tuple(t.shape))
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.slots)
            self.barrier.wait()
            t.copy_(total)
            return Done()

        return f


@pytest.mark.parametrize("world, chunks", [(1, 4), (2, 2), (2, 4), (4, 8)])
def test_chunked_forward_equals_single_process(world, chunks):
    cfg = tp.TPConfig(ranks=world, layers=2, hidden=64, heads=4, seq=16, batch=2, overlap_chunks=chunks).resolved()
    full = tp.init_weights(cfg)
    x = tp.make_input(cfg)
    sw = _SumWorld(world)
    outs: list = [None] * world

    def body(r):
        with torch.no_grad():
            outs[r] = tp.forward_chunked(x, tp.shard_weights(full, r, world, cfg.heads), sw.all_reduce_async(r), chunks)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with torch.no_grad():
        ref = tp.forward(x, tp.shard_weights(full, 0, 1, cfg.heads), None)
    for r in range(world):
        torch.testing.assert_close(outs[r], ref, atol=1e-5, rtol=1e-5)
        assert tp.compare(outs[r], ref, "float32")["passed"]
        # N× the calls, each 1/N of the tokens
        assert sw.shapes[r] == [(cfg.batch * cfg.seq // chunks, cfg.hidden)] * (2 * cfg.layers * chunks)


def test_config_sizes_and_validation():
    c = tp.TPConfig(overlap_chunks=4).resolved()
    assert c.all_reduce_bytes * 4 == c.block_bytes == tp.TPConfig().resolved().all_reduce_bytes
    with pytest.raises(BadInputError, match=r"overlap_chunks \(3\) must divide the tokens \(batch x seq = 512\)"):
        tp.TPConfig(overlap_chunks=3).resolved()
    with pytest.raises(BadInputError, match="overlap_chunks must be a positive integer, got 0"):
        tp.TPConfig(overlap_chunks=0).resolved()


def test_cli_bad_chunks_exit_2(capsys):
    from tracekit.cli import main

    assert main(["collect", "tp", "--overlap-chunks", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tracekit: overlap_chunks (7) must divide the tokens (batch x seq = 512) into equal chunks"


def _allreduce_ops(doc: dict) -> list[dict]:
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    return [e for e in ev if e["name"] == "c10d::allreduce_" and lo <= e["ts"] <= hi]


def test_fixture_has_n_times_the_all_reduces_of_one_nth_the_size():
    cfg = tp.TPConfig(**{**FIXTURE_CFG.__dict__, "overlap_chunks": CHUNKS}).resolved()
    conf = json.loads((FIXTURE / "run_config.json").read_text())
    assert conf["overlap_chunks"] == CHUNKS and conf["tp_check"]["passed"]
    for k in ("ranks", "layers", "hidden", "heads", "seq", "batch", "wait", "warmup", "active", "dtype"):
        assert conf[k] == getattr(cfg, k), k
    exp = conf["expected"]
    assert exp["all_reduce_per_rank_active"] == 2 * cfg.layers * cfg.active * CHUNKS
    assert exp["all_reduce_bytes"] * CHUNKS == exp["block_all_reduce_bytes"] == cfg.block_bytes
    assert exp["all_reduce_async"] is True
    for r in range(2):
        path = FIXTURE / f"rank{r}.pt.trace.json.gz"
        assert path.stat().st_size < 1_000_000
        chunked = comm_summary(load_trace(path))
        plain = comm_summary(load_trace(PLAIN_FIXTURE / f"rank{r}.pt.trace.json.gz"))
        assert chunked["steps"] == plain["steps"] == cfg.active
        assert chunked["gloo"] == chunked["gloo_all"] == chunked["c10d"] == CHUNKS * plain["gloo"]
        assert chunked["gloo"] == exp["all_reduce_per_rank_active"]
        (size,) = chunked["gloo_bytes"]
        (plain_size,) = plain["gloo_bytes"]
        assert size * CHUNKS == plain_size and size == exp["all_reduce_bytes"]
        assert chunked["c10d_elems"] == {exp["all_reduce_elems"]}
        assert chunked["ranges"] == plain["ranges"]
        ops = _allreduce_ops(load_trace(path))
        # Concrete Inputs of c10d::allreduce_: [tensors, op, pg, sparse, async_op, timeout]
        assert {e["args"]["Concrete Inputs"][4] for e in ops} == {"True"}
        assert {e["args"]["Input type"][0] for e in ops} == {"TensorList"}


@pytest.mark.slow
def test_real_2rank_chunked_run(tmp_path):
    cfg = tp.TPConfig(
        ranks=2, layers=2, hidden=128, heads=4, seq=32, batch=2, active=2, overlap_chunks=2, out=str(tmp_path)
    ).resolved()
    run_dir = tp.run_tp(cfg)
    conf = json.loads((run_dir / "run_config.json").read_text())
    assert conf["overlap_chunks"] == 2 and conf["tp_check"]["max_abs_err"] < 1e-4
    for r in range(2):
        s = comm_summary(load_trace(run_dir / f"rank{r}.pt.trace.json.gz"))
        assert s["gloo"] == s["c10d"] == 2 * cfg.layers * cfg.active * 2
        assert s["gloo_bytes"] == {cfg.batch * cfg.seq * cfg.hidden * 4 // 2}
