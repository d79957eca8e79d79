"""tracekit.model.whatif on a hand-made 2-rank graph: the replay of the unchanged graph, every edit,
and the replayed critical path, each against times worked out by hand below.

The graph (µs; ns in the arrays):

    rank 0  CPU:    launch [0, 1)
            stream: gemm [2, 12) ── allreduce [12, 40) ── relu [40, 50)
    rank 1  stream: gemm [2, 22) ── allreduce [22, 40)

Edges: launch → rank 0's gemm (launch; ready 1, so the gemm's delay is 1 µs of launch latency);
stream order on each stream; rank 0's all-reduce waits for rank 1's arrival (collective: ready at
rank 1's all-reduce start, 22). Roots: the launch (delay 0 from the origin 0) and rank 1's gemm
(delay 2). Tails: every op its duration, except rank 0's all-reduce: 40 − 22 = 18 µs after the
last arrival (rank 1's own all-reduce is also 18). Measured steps: rank 0 50 µs, rank 1 38 µs.
"""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.errors import BadInputError
from tracekit.model import whatif as wf
from tracekit.model.links import custom_link

US = 1000
COMPUTE, COMM, CPU = (wf.CLASSES.index(c) + 1 for c in ("compute", "comm", "cpu"))


def graph() -> wf.Graph:
    # nodes: 0 launch, 1 gemm r0, 2 allreduce r0, 3 relu r0, 4 gemm r1, 5 allreduce r1
    a = lambda *x: np.array(x, np.int64)  # noqa: E731
    return wf.Graph(
        rank=a(0, 0, 0, 0, 1, 1), gpu=np.array([False, True, True, True, True, True]),
        cls=np.array([CPU, COMPUTE, COMM, COMPUTE, COMPUTE, COMM], np.int8),
        name=np.array(["cudaLaunchKernel", "gemm", "allreduce", "relu", "gemm", "allreduce"], object),
        start=a(0, 2, 12, 40, 2, 22) * US, end=a(1, 12, 40, 50, 22, 40) * US, track=a(0, 1, 1, 1, 2, 2),
        instance=a(-1, -1, 0, -1, -1, 0),
        src=a(0, 1, 2, 4, 5), dst=a(1, 2, 3, 5, 2),
        anchor=a(wf.END, wf.END, wf.END, wf.END, wf.START), side=a(wf.START, wf.START, wf.START, wf.START, wf.END),
        offset=a(0, 0, 0, 0, 0), kind=np.array(["launch", "stream", "stream", "stream", "collective"], object),
        origin=0, instances=[{"op": "all_reduce", "size_bytes": 10_000, "group_size": 2, "pg": "0", "seq": 0}])


def steps(g: wf.Graph) -> dict[int, int]:
    return {r: v // US for r, v in wf.replay(g).step_ns().items()}


def test_measured_weights_by_hand():
    g = graph()
    assert (g.delay // US).tolist() == [0, 1, 0, 0, 2, 0]
    assert (g.tail // US).tolist() == [1, 10, 18, 10, 20, 18]


def test_unchanged_replay_is_the_measured_schedule():
    g = graph()
    rp = wf.replay(g)
    assert rp.start.tolist() == g.start.tolist() and rp.end.tolist() == g.end.tolist()
    assert steps(g) == {0: 50, 1: 38}


def test_replayed_critical_path_by_hand():
    # rank 0: relu 10 (compute) ← its all-reduce's 18 after the last arrival (exposed comm) ← rank 1's
    # all-reduce start ← rank 1's gemm 20 + its 2 from the origin (straggler)
    cp = wf.critical_path(wf.replay(graph()), 0)
    assert cp["length_ns"] == 50 * US
    assert {k: v // US for k, v in cp["parts"].items() if v} == {"compute_ns": 10, "exposed_comm_ns": 18,
                                                                "straggler_ns": 22}
    assert sum(cp["parts"].values()) == cp["length_ns"]


def test_scale_by_class_and_by_name():
    # compute ×0.5: gemms [2, 7) and [2, 12); rank 1 arrives at 12; all-reduce ends 12 + 18 = 30;
    # relu [30, 35)
    assert steps(wf.scale(graph(), "compute", 0.5)) == {0: 35, 1: 28}
    # 'gemm' by name: the relu keeps its 10 µs: [30, 40)
    assert steps(wf.scale(graph(), "gemm", 0.5)) == {0: 40, 1: 28}
    with pytest.raises(BadInputError):
        wf.parse_scale("gemm")


def test_no_stragglers_by_hand():
    # gemm (occurrence 0 on both ranks): rank 1's delay 2 → 1 (rank 0's); its work stays 20: gemm
    # [1, 21), all-reduce [21, 39); rank 0's all-reduce ends max(12, 21) + 18 = 39; relu [39, 49)
    g = wf.no_stragglers(graph())
    assert steps(g) == {0: 49, 1: 38}
    assert "no stragglers" in g.notes[0]
    # with the work: rank 1's gemm 20 → 10 too: [1, 11), all-reduce [11, 29); rank 0's ends
    # max(12, 11) + 18 = 30; relu [30, 40)
    assert steps(wf.no_stragglers(graph(), work=True)) == {0: 40, 1: 28}


def test_model_transfers_by_hand():
    # ring all-reduce on k = 2: 2(k−1)α + 2(k−1)/k · D/β = 2 µs + 10,000 B / 1e9 B/s = 12 µs;
    # rank 1's all-reduce [22, 34); rank 0's ends 22 + 12 = 34; relu [34, 44)
    link = custom_link(1e-6, 1e9, "test")
    g = wf.model_transfers(graph(), link)
    assert g.tail[[2, 5]].tolist() == [12 * US, 12 * US]
    assert steps(g) == {0: 44, 1: 32}
    assert g.instances[0]["before_ns"] == 18 * US and g.instances[0]["after_ns"] == 12 * US


def test_machine_transfers_take_nccls_pick():
    # the all-reduce (10,000 B, 2 ranks: one node of a dgx-h100) costs what NCCL's model picks; rank
    # 1's all-reduce [22, 22 + t); rank 0's ends 22 + t; relu 10 after
    from tracekit.model.machine import machine_preset
    from tracekit.model.nccl_tuning import nccl_choice

    m = machine_preset("dgx-h100")
    pick = nccl_choice("all_reduce", 10_000, 2, 1, m)
    t = int(round(pick.time_s * 1e9))
    g = wf.machine_transfers(graph(), m)
    assert g.tail[[2, 5]].tolist() == [t, t] and g.instances[0]["model_pick"] == pick.label
    assert wf.replay(g).step_ns() == {0: 32 * US + t, 1: 20 * US + t}
    with pytest.raises(BadInputError, match="--machine"):
        wf.plan(link=custom_link(1e-6, 1e9), machine=m)


def test_chunk_by_hand():
    # T(n) = c/n + (a/n + α) + (n−1)·max(c/n, a/n + α), n = 2, α = 1 µs:
    # rank 0: c 10, a 18 → 5 + 10 + 10 = 25; rank 1: c 20, a 18 → 10 + 10 + 10 = 30; both members
    # take 30. Each all-reduce starts with its gemm (2); rank 0's ends max(2, 2) + 30 = 32; relu [32, 42)
    g = wf.chunk(graph(), "allreduce", 2, 1e-6)
    assert g.tail[[2, 5]].tolist() == [30 * US, 30 * US]
    assert steps(g) == {0: 42, 1: 30}
    with pytest.raises(BadInputError):
        wf.chunk(graph(), "allreduce", 0, 1e-6)


def test_move_off_stream_by_hand():
    # rank 0's relu now follows the gemm (12) instead of the all-reduce: relu [12, 22); the
    # all-reduce still ends at 40, the rank's step end
    g = wf.move_off_stream(graph(), "all_reduce")
    rp = wf.replay(g)
    assert rp.start[3] == 12 * US and rp.end[3] == 22 * US
    assert steps(g) == {0: 40, 1: 38}


def test_add_delay_by_hand():
    # rank 1's all-reduce starts 5 µs later: [27, 45); rank 0's ends 27 + 18 = 45; relu [45, 55)
    g = wf.add_delay(graph(), 1, 5 * US, "allreduce")
    assert steps(g) == {0: 55, 1: 43}
    assert wf.parse_delay("1:0.005@allreduce") == (1, 5 * US, "allreduce")
    with pytest.raises(BadInputError, match="RANK:MS@PATTERN"):
        wf.parse_delay("1@allreduce")
    with pytest.raises(BadInputError, match="no op matching"):
        wf.add_delay(graph(), 1, 1, "relu")
    # and no stragglers takes it out again (rank 1's all-reduce delay capped at rank 0's 0; its gemm's
    # 2 → 1 as in test_no_stragglers_by_hand)
    assert steps(wf.no_stragglers(g)) == {0: 49, 1: 38}


def test_edits_compose():
    # no stragglers, then gemm ×0.5: rank 1's gemm [1, 11) (delay 1, work 20 × 0.5); rank 0's gemm
    # [2, 7); rank 1 arrives at 11: rank 0's all-reduce ends 11 + 18 = 29; relu [29, 39); rank 1's
    # all-reduce [11, 29)
    edits = wf.plan(stragglers=True, scale_spec="gemm=0.5")
    assert [label for label, _ in edits] == ["no stragglers", "scale gemm=0.5"]
    assert steps(wf.apply(graph(), edits)) == {0: 39, 1: 28}


def test_plan_refuses_what_it_cannot_price():
    with pytest.raises(BadInputError, match="--algo needs --link"):
        wf.plan(algo="ring")
    with pytest.raises(BadInputError, match="--chunk needs --link"):
        wf.plan(chunk_spec="all_reduce=4")
    with pytest.raises(BadInputError, match="PATTERN=N"):
        wf.plan(link=custom_link(1e-6, 1e9), chunk_spec="all_reduce")


def test_a_loop_is_refused():
    g = graph()
    g.src, g.dst = np.r_[g.src, 3], np.r_[g.dst, 1]  # relu → gemm: a cycle through the stream
    g.anchor, g.side = np.r_[g.anchor, wf.END], np.r_[g.side, wf.START]
    g.offset, g.kind = np.r_[g.offset, 0], np.r_[g.kind, np.array(["stream"], object)]
    with pytest.raises(ValueError, match="loop"):
        wf.replay(g)
