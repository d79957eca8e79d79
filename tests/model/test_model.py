"""The α–β model's formulas, each checked against numbers worked out by hand.

Reference: ../shared/reference/alpha-beta.md. nvlink4 is α = 2 µs,
β = 450 GB/s × 0.8 = 360 GB/s throughout unless a test says otherwise.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.errors import BadInputError
from tracekit.model import (
    ALGORITHMS,
    LINK_PRESETS,
    achieved_fraction,
    algbw,
    algorithm_coefficients,
    applicable_algorithms,
    best_chunks,
    busbw,
    busbw_factor,
    canonical_op,
    chunked_overlap,
    custom_link,
    hierarchical_all_reduce,
    layer_transfer,
    link_from_preset,
    message_time,
    n_half,
    no_overlap_time,
    nvls_all_reduce_time,
    p2p_time,
    pairwise_all_to_all_time,
    pp_decode,
    predict_collective,
    rabenseifner_all_reduce_time,
    recursive_doubling_all_reduce_time,
    ring_all_gather_time,
    ring_all_reduce_time,
    ring_broadcast_time,
    ring_reduce_scatter_time,
    scatter_allgather_broadcast_time,
    tree_all_reduce_time,
    tree_broadcast_time,
    two_batch_overlap,
)

US = 1e-6
MS = 1e-3
NV4 = link_from_preset("nvlink4")
D = 100e6  # 100 MB


def close(x, y, rel=1e-12):
    return x == pytest.approx(y, rel=rel, abs=1e-18)


# --- links -------------------------------------------------------------------


def test_presets_match_reference_table():
    # (nominal GB/s per direction, effective GB/s at 0.8, α µs), copied from the reference's table.
    table = {
        "nvlink4": (450, 360, 2),
        "nvlink5": (900, 720, 2),
        "nvlink3": (300, 240, 2),
        "pcie5": (64, 51.2, 5),
        "pcie4": (32, 25.6, 5),
        "ib_ndr": (50, 40, 5),
        "ib_hdr": (25, 20, 5),
        "roce400": (50, 40, 5),
        "eth25": (3.125, 2.5, 20),
        "eth100": (12.5, 10, 10),
        "nvme": (7, 5.6, 100),
        "hbm3": (3350, 2680, 0),
    }
    assert set(table) <= set(LINK_PRESETS)  # the added presets: tests/model/test_model_extra.py
    for name, (nominal, effective, alpha_us) in table.items():
        link = link_from_preset(name)
        assert close(link.nominal_Bps, nominal * 1e9), name
        assert close(link.beta_Bps, effective * 1e9), name
        assert close(link.alpha_s, alpha_us * US), name
        assert link.efficiency == 0.8


def test_efficiency_is_a_parameter():
    # 450 GB/s × 0.9 = 405 GB/s
    assert close(link_from_preset("nvlink4", efficiency=0.9).beta_Bps, 405e9)
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(BadInputError, match="efficiency"):
            link_from_preset("nvlink4", efficiency=bad)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(BadInputError) as err:
        link_from_preset("nvlink9")
    msg = str(err.value)
    assert "nvlink9" in msg and "nvlink4" in msg and "eth25" in msg and "\n" not in msg


def test_preset_names_are_forgiving():
    assert link_from_preset("IB-NDR").name == "ib_ndr"


def test_custom_link_and_overrides():
    link = custom_link(3 * US, 100e9)
    assert (link.alpha_s, link.beta_Bps, link.efficiency) == (3 * US, 100e9, 1.0)
    assert close(link.n_half_bytes, 3e-6 * 100e9)  # 300 KB
    over = NV4.with_overrides(alpha_s=1 * US)
    assert (over.alpha_s, over.beta_Bps) == (1 * US, NV4.beta_Bps)  # β kept
    over = NV4.with_overrides(beta_Bps=300e9)
    assert (over.alpha_s, over.beta_Bps) == (NV4.alpha_s, 300e9)  # α kept
    assert close(over.efficiency, 300 / 450)
    with pytest.raises(BadInputError):
        custom_link(-1 * US, 1e9)
    with pytest.raises(BadInputError):
        custom_link(1 * US, 0)


def test_message_time_and_n_half():
    # T(1 MB) = 2 µs + 1e6 / 3.6e11 s = 2 µs + 2.7778 µs = 4.7778 µs
    assert close(message_time(1e6, NV4), 2e-6 + 1e6 / 3.6e11)
    # n½(nvlink4) = 2 µs × 360 GB/s = 720 KB
    assert close(n_half(NV4), 720e3)
    # A message of n½ bytes takes 2α: half the link's bandwidth.
    assert close(message_time(720e3, NV4), 2 * NV4.alpha_s)
    with pytest.raises(BadInputError):
        message_time(-1, NV4)


def test_achieved_fraction():
    # 256 KB on nvlink4: 256e3 / (256e3 + 720e3) = 256/976 = 0.2623 ("about a quarter")
    assert close(achieved_fraction(256e3, NV4), 256 / 976)
    assert 0.26 < achieved_fraction(256e3, NV4) < 0.27
    # 256 KB on eth25: n½ = 20 µs × 2.5 GB/s = 50 KB; 256/(256+50) = 0.8366 ("about 84 %")
    eth25 = link_from_preset("eth25")
    assert close(n_half(eth25), 50e3)
    assert close(achieved_fraction(256e3, eth25), 256 / 306)
    assert 0.83 < achieved_fraction(256e3, eth25) < 0.85
    assert achieved_fraction(720e3, NV4) == pytest.approx(0.5)
    assert achieved_fraction(0, NV4) == 0.0


# --- collectives ---------------------------------------------------------------


def test_ring_all_reduce_worked_example():
    # 100 MB on 4 ranks, nvlink4:
    #   α term = 2(k−1)·α = 2·3·2 µs = 12 µs
    #   β term = 2(k−1)/k · D/β = 2·3/4 · 1e8/3.6e11 s = 416.667 µs
    p = ring_all_reduce_time(D, 4, NV4)
    assert close(p.alpha_term_s, 12 * US)
    assert close(p.beta_term_s, 1.5e8 / 3.6e11)
    assert p.beta_term_s == pytest.approx(416.667 * US, rel=1e-6)
    assert close(p.time_s, 12 * US + 1.5e8 / 3.6e11)  # 428.667 µs
    assert p.steps == 6
    assert close(p.bytes_per_rank_sent, 1.5e8)
    assert p.verdict == "bandwidth-bound"
    assert close(p.n_half_bytes, 720e3)
    # Latency-bound exactly when D/k < n½: crossover D = k·n½ = 4 · 720 KB = 2.88 MB.
    assert close(p.crossover_bytes, 2.88e6)
    d = p.to_dict()
    assert d["time_s"] == p.time_s and d["verdict"] == "bandwidth-bound" and d["algo"] == "ring"
    assert all(k == k.lower() and " " not in k for k in d)


def test_ring_reduce_scatter_and_all_gather():
    # (k−1)·α = 3·2 µs = 6 µs; (k−1)/k · D/β = 0.75·1e8/3.6e11 = 208.333 µs
    for fn in (ring_reduce_scatter_time, ring_all_gather_time):
        p = fn(D, 4, NV4)
        assert close(p.alpha_term_s, 6 * US)
        assert close(p.beta_term_s, 0.75e8 / 3.6e11)
        assert p.steps == 3
        assert close(p.bytes_per_rank_sent, 0.75e8)


def test_recursive_doubling():
    # log₂4 = 2 steps: α term 2·2 µs = 4 µs; β term 2·1e8/3.6e11 = 555.556 µs
    p = recursive_doubling_all_reduce_time(D, 4, NV4)
    assert close(p.alpha_term_s, 4 * US)
    assert close(p.beta_term_s, 2e8 / 3.6e11)
    assert p.steps == 2
    assert close(p.bytes_per_rank_sent, 2e8)  # log₂k · D


def test_rabenseifner():
    # 2·log₂4 = 4 steps: α term 4·2 µs = 8 µs; β term 2·3/4·1e8/3.6e11 = 416.667 µs
    p = rabenseifner_all_reduce_time(D, 4, NV4)
    assert close(p.alpha_term_s, 8 * US)
    assert close(p.beta_term_s, 1.5e8 / 3.6e11)
    assert p.steps == 4


def test_tree():
    # 2·log₂4 = 4 steps of (α + D/β): α term 8 µs; β term 4·1e8/3.6e11 = 1.1111 ms
    p = tree_all_reduce_time(D, 4, NV4)
    assert close(p.alpha_term_s, 8 * US)
    assert close(p.beta_term_s, 4e8 / 3.6e11)
    assert p.steps == 4
    # k = 6 is not a power of two: ⌈log₂6⌉ = 3 levels, 6 steps
    assert tree_all_reduce_time(D, 6, NV4).steps == 6


def test_nvls():
    # 2α + D/β = 4 µs + 1e8/3.6e11 = 4 µs + 277.778 µs, whatever k
    for k in (2, 4, 8, 72):
        p = nvls_all_reduce_time(D, k, NV4)
        assert close(p.alpha_term_s, 4 * US)
        assert close(p.beta_term_s, 1e8 / 3.6e11)
        assert p.steps == 2


def test_all_to_all_and_p2p():
    # pairwise all-to-all k=4: 3·2 µs = 6 µs; 3/4·1e8/3.6e11 = 208.333 µs
    p = pairwise_all_to_all_time(D, 4, NV4)
    assert close(p.alpha_term_s, 6 * US) and close(p.beta_term_s, 0.75e8 / 3.6e11) and p.steps == 3
    # p2p: α + D/β = 2 µs + 277.778 µs
    p = p2p_time(D, NV4)
    assert close(p.alpha_term_s, 2 * US) and close(p.beta_term_s, 1e8 / 3.6e11) and p.steps == 1


def test_broadcast():
    # binomial tree k=8: ⌈log₂8⌉ = 3 steps of (α + D/β): 6 µs + 3·277.778 µs
    p = tree_broadcast_time(D, 8, NV4)
    assert close(p.alpha_term_s, 6 * US) and close(p.beta_term_s, 3e8 / 3.6e11) and p.steps == 3
    # scatter + ring all-gather k=8: (3 + 7)·2 µs = 20 µs; 2·7/8·1e8/3.6e11 = 486.111 µs
    p = scatter_allgather_broadcast_time(D, 8, NV4)
    assert close(p.alpha_term_s, 20 * US) and close(p.beta_term_s, 1.75e8 / 3.6e11) and p.steps == 10
    # pipelined ring k=8: 7·2 µs = 14 µs; D/β = 1e8/3.6e11 = 277.778 µs; D bytes sent (busbw factor 1)
    p = ring_broadcast_time(D, 8, NV4)
    assert close(p.alpha_term_s, 14 * US) and close(p.beta_term_s, 1e8 / 3.6e11) and p.steps == 7
    assert close(p.bytes_per_rank_sent, D)


@pytest.mark.parametrize("k", [2, 4, 8, 16, 64, 1024])
def test_bandwidth_optimal_bounds(k):
    # Ring and Rabenseifner send exactly the lower bound 2(k−1)/k·D; recursive doubling log₂k·D.
    bound = 2 * (k - 1) / k * D
    assert close(ring_all_reduce_time(D, k, NV4).bytes_per_rank_sent, bound)
    assert close(rabenseifner_all_reduce_time(D, k, NV4).bytes_per_rank_sent, bound)
    assert close(recursive_doubling_all_reduce_time(D, k, NV4).bytes_per_rank_sent, math.log2(k) * D)
    # reduce-scatter and all-gather each need (k−1)/k·D
    assert close(ring_reduce_scatter_time(D, k, NV4).bytes_per_rank_sent, bound / 2)
    assert close(ring_all_gather_time(D, k, NV4).bytes_per_rank_sent, bound / 2)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(2, 4096), d=st.floats(0, 1e12))
def test_ring_matches_formula_and_verdict_rule(k, d):
    p = ring_all_reduce_time(d, k, NV4)
    assert p.time_s == pytest.approx(2 * (k - 1) * 2e-6 + 2 * (k - 1) / k * d / 3.6e11, rel=1e-12)
    assert p.bytes_per_rank_sent == pytest.approx(2 * (k - 1) / k * d, rel=1e-12)
    # latency-bound exactly when the per-step chunk D/k is below n½ (away from the boundary)
    chunk = d / k
    if chunk < 0.999 * 720e3:
        assert p.verdict == "latency-bound"
    elif chunk > 1.001 * 720e3:
        assert p.verdict == "bandwidth-bound"


def test_verdict_below_and_above_n_half():
    # One message below n½ = 720 KB is latency-bound, above it bandwidth-bound.
    assert p2p_time(256e3, NV4).verdict == "latency-bound"
    assert p2p_time(4e6, NV4).verdict == "bandwidth-bound"
    # α term == β term counts as latency-bound (α term >= β term); α = 1 s, β = 1 B/s, n = 1 B
    assert p2p_time(1, custom_link(1.0, 1.0)).verdict == "latency-bound"
    assert p2p_time(0, NV4).verdict == "latency-bound"


def test_errors():
    with pytest.raises(BadInputError, match="at least 2 ranks"):
        ring_all_reduce_time(D, 1, NV4)
    with pytest.raises(BadInputError, match="negative"):
        ring_all_reduce_time(-1, 4, NV4)
    for fn in (recursive_doubling_all_reduce_time, rabenseifner_all_reduce_time):
        with pytest.raises(BadInputError, match="power-of-two") as err:
            fn(D, 6, NV4)
        assert "\n" not in str(err.value)
    with pytest.raises(BadInputError):
        ring_all_reduce_time(D, 2.5, NV4)
    with pytest.raises(BadInputError):
        ring_all_reduce_time(float("nan"), 4, NV4)
    # p2p needs no group: 1 rank is fine
    assert p2p_time(D, NV4, ranks=1).steps == 1


def test_predict_collective_dispatch():
    assert predict_collective("all_reduce", D, 4, NV4) == ring_all_reduce_time(D, 4, NV4)  # default: ring
    assert predict_collective("allreduce", D, 4, NV4, algo="rabenseifner") == rabenseifner_all_reduce_time(D, 4, NV4)
    assert predict_collective("all_to_all", D, 4, NV4).algo == "pairwise"
    assert predict_collective("send", D, 1, NV4).algo == "p2p"
    assert predict_collective("broadcast", D, 4, NV4).algo == "ring"
    every = predict_collective("all_reduce", D, 4, NV4, algo="all")
    assert [p.algo for p in every] == list(ALGORITHMS["all_reduce"])
    # k = 6: the power-of-two algorithms are left out of 'all'
    assert [p.algo for p in predict_collective("all_reduce", D, 6, NV4, algo="all")] == ["ring", "tree", "double_binary_tree", "nvls"]
    assert applicable_algorithms("all_reduce", 6) == ["ring", "tree", "double_binary_tree", "nvls"]
    with pytest.raises(BadInputError, match="expected one of ring"):
        predict_collective("all_gather", D, 4, NV4, algo="rabenseifner")
    with pytest.raises(BadInputError, match="unknown collective"):
        predict_collective("all_sum", D, 4, NV4)
    with pytest.raises(BadInputError, match="no algorithm for barrier"):
        predict_collective("barrier", D, 4, NV4)
    with pytest.raises(BadInputError):
        predict_collective("all_reduce", D, 6, NV4, algo="recursive_doubling")


def test_coefficients_table():
    c = algorithm_coefficients("all_reduce", "ring", 8)
    assert (c.steps, c.alpha_coeff, c.beta_coeff) == (14, 14.0, 1.75)  # 2(k−1), 2(k−1)/k
    c = algorithm_coefficients("all_gather", "ring", 8)
    assert (c.steps, c.alpha_coeff, c.beta_coeff) == (7, 7.0, 0.875)


def test_hierarchical_all_reduce_worked_example():
    # 1 GB on 4 nodes × 8 GPUs, nvlink4 inside, ib_ndr (α 5 µs, β 40 GB/s) between:
    #  1. reduce-scatter: 7·2 µs = 14 µs;  7/8·1e9/3.6e11 = 2.43056 ms
    #  2. all-reduce of 1e9/8 = 125 MB over 4 nodes: 2·3·5 µs = 30 µs; 2·3/4·1.25e8/4e10 = 4.6875 ms
    #  3. all-gather: as 1.
    #  flat ring over 32 ranks on ib_ndr: 2·31·5 µs = 310 µs; 2·31/32·1e9/4e10 = 48.4375 ms
    ib = link_from_preset("ib_ndr")
    h = hierarchical_all_reduce(1e9, 4, 8, NV4, ib)
    p1, p2, p3 = h.phases
    assert close(p1.alpha_term_s, 14 * US) and close(p1.beta_term_s, 0.875e9 / 3.6e11)
    assert close(p2.alpha_term_s, 30 * US) and close(p2.beta_term_s, 1.5 * 1.25e8 / 4e10)
    assert close(p2.beta_term_s, 4.6875 * MS)
    assert p3 == ring_all_gather_time(1e9, 8, NV4)
    assert close(h.alpha_term_s, 58 * US)
    assert close(h.time_s, 58 * US + 2 * 0.875e9 / 3.6e11 + 4.6875 * MS)
    assert close(h.flat_ring.alpha_term_s, 310 * US) and close(h.flat_ring.beta_term_s, 48.4375 * MS)
    assert close(h.speedup_vs_flat, h.flat_ring.time_s / h.time_s)
    d = h.to_dict()
    assert [ph["phase"] for ph in d["phases"]] == [
        "intra_node_reduce_scatter",
        "inter_node_all_reduce",
        "intra_node_all_gather",
    ]
    assert d["flat_ring"]["ranks"] == 32


def test_hierarchical_degenerate_layouts():
    ib = link_from_preset("ib_ndr")
    # One node: reduce-scatter + all-gather inside it is exactly a ring all-reduce on G ranks.
    one_node = hierarchical_all_reduce(D, 1, 8, NV4, ib)
    assert close(one_node.time_s, ring_all_reduce_time(D, 8, NV4).time_s)
    # One GPU per node: just the inter-node ring on the whole buffer.
    one_gpu = hierarchical_all_reduce(D, 4, 1, NV4, ib)
    assert close(one_gpu.time_s, ring_all_reduce_time(D, 4, ib).time_s)
    with pytest.raises(BadInputError):
        hierarchical_all_reduce(D, 1, 1, NV4, ib)
    with pytest.raises(BadInputError):
        hierarchical_all_reduce(D, 0, 8, NV4, ib)
    with pytest.raises(BadInputError):
        hierarchical_all_reduce(-5, 2, 8, NV4, ib)


# --- nccl-tests bandwidth --------------------------------------------------------


def test_busbw_factors():
    assert busbw_factor("all_reduce", 8) == 2 * 7 / 8  # 1.75
    for op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert busbw_factor(op, 8) == 7 / 8
    for op in ("broadcast", "reduce", "send", "recv"):
        assert busbw_factor(op, 8) == 1.0
    assert busbw_factor("allreduce", 4) == 1.5  # aliases as nccl-tests and torch spell them
    assert busbw_factor("AllGather", 2) == 0.5
    assert busbw_factor("all_reduce", 8.0) == 1.75  # SQL may hand in a double
    assert busbw_factor("all_reduce", 1) == 0.0
    for bad_n in (0, -1, 2.5, float("nan")):
        with pytest.raises(BadInputError):
            busbw_factor("all_reduce", bad_n)
    with pytest.raises(BadInputError):
        busbw_factor("barrier", 8)
    with pytest.raises(BadInputError):
        busbw_factor("frobnicate", 8)


def test_algbw_busbw():
    # 1e9 B in 10 ms: 1e9/0.01/1e9 = 100 GB/s; all-reduce on 8: ×1.75 = 175 GB/s
    assert close(algbw(1e9, 0.01), 100.0)
    assert close(busbw("all_reduce", 1e9, 0.01, 8), 175.0)
    # A row of the superbench all_reduce log: 8 GiB in 63896 µs → algbw 134.44, busbw 235.26 (printed)
    assert round(algbw(8589934592, 63896e-6), 2) == 134.44
    assert round(busbw("all_reduce", 8589934592, 63896e-6, 8), 2) == 235.26
    assert algbw(1e6, 0) is None and busbw("all_reduce", 1e6, 0, 8) is None
    with pytest.raises(BadInputError):
        algbw(-1, 1.0)
    with pytest.raises(BadInputError):
        algbw(1, -1.0)


def test_canonical_op():
    assert canonical_op("all_reduce_perf") == "all_reduce"
    assert canonical_op("reduce-scatter") == "reduce_scatter"
    assert canonical_op("alltoallv") == "all_to_all"
    assert canonical_op("sendrecv") == "send"


# --- overlap models ----------------------------------------------------------------


def test_no_overlap():
    assert close(no_overlap_time(1 * MS, 2 * MS), 3 * MS)
    with pytest.raises(BadInputError):
        no_overlap_time(-1, 1)


def test_chunked_overlap_worked_examples():
    # c = a = 1 ms, n = 8, α_c = 10 µs: c/n = 125 µs, a/n + α_c = 135 µs
    # T = 125 + 135 + 7·135 = 1205 µs
    r = chunked_overlap(1 * MS, 1 * MS, 8, 10 * US)
    assert close(r.time_s, 1205 * US)
    assert close(r.serial_time_s, 2 * MS)
    assert close(r.hidden_comm_s, 795 * US)
    assert close(r.exposed_comm_s, 205 * US)
    # compute-bound c = 2 ms, a = 1 ms, n = 4, α_c = 10 µs: c/n = 500 µs, a/n + α_c = 260 µs
    # T = 500 + 260 + 3·500 = 2260 µs
    assert close(chunked_overlap(2 * MS, 1 * MS, 4, 10 * US).time_s, 2260 * US)
    # n = 1 is the serial schedule plus one α_c: 1 + 1 + 0.01 ms
    assert close(chunked_overlap(1 * MS, 1 * MS, 1, 10 * US).time_s, 2.01 * MS)
    with pytest.raises(BadInputError):
        chunked_overlap(1 * MS, 1 * MS, 0, 10 * US)
    with pytest.raises(BadInputError):
        chunked_overlap(1 * MS, -1 * MS, 2, 10 * US)


def test_best_chunks():
    # c = a: T(n) = c/n + a + n·α_c, least at n = √(c/α_c) = √(1e-3/1e-5) = 10: 100 + 1000 + 100 µs
    r = best_chunks(1 * MS, 1 * MS, 10 * US)
    assert r.chunks == 10
    assert close(r.time_s, 1200 * US)
    # neighbours are worse: T(9) = 111.1 + 1000 + 90 = 1201.1 µs; T(11) = 90.9 + 1000 + 110 = 1200.9 µs
    assert chunked_overlap(1 * MS, 1 * MS, 9, 10 * US).time_s > r.time_s
    assert chunked_overlap(1 * MS, 1 * MS, 11, 10 * US).time_s > r.time_s
    # α_c = 0: T(n) = (n+1)/n · c keeps falling, so the search stops at its limit: 17/16 ms
    r = best_chunks(1 * MS, 1 * MS, 0.0, max_chunks=16)
    assert r.chunks == 16 and close(r.time_s, 17 / 16 * MS)


@settings(max_examples=100, deadline=None)
@given(
    c=st.floats(1e-6, 1.0),
    extra=st.floats(1e-6, 1.0),
    n=st.integers(1, 256),
    ac=st.floats(0, 1e-3),
)
def test_chunking_never_hides_more_than_compute(c, extra, n, ac):
    # If a > c, no chunking hides more than c.
    a = c + extra
    r = chunked_overlap(c, a, n, ac)
    assert r.hidden_comm_s <= c * (1 + 1e-9)
    assert r.time_s >= a * (1 - 1e-9)


def test_two_batch_overlap():
    # c = a = 1 ms: max + min/2 = 1 + 0.5 = 1.5 ms vs 2 ms serial
    r = two_batch_overlap(1 * MS, 1 * MS)
    assert close(r.time_s, 1.5 * MS) and close(r.serial_time_s, 2 * MS) and close(r.hidden_comm_s, 0.5 * MS)
    # c = 3 ms, a = 1 ms: 3 + 0.5 = 3.5 ms vs 4 ms
    assert close(two_batch_overlap(3 * MS, 1 * MS).time_s, 3.5 * MS)


def test_layer_transfer_worked_example():
    # 1.342 GB (Llama-3-70B KV for 4096 tokens: 327,680 B × 4096) over 8 ib_ndr NICs, 80 layers:
    # β' = 8 × 40 GB/s = 320 GB/s
    # bulk = 5 µs + 1.342e9/3.2e11 s = 5 µs + 4.19375 ms = 4.19875 ms
    # per layer: 1.342e9/80 = 16.775 MB; 5 µs + 16.775e6/3.2e11 s = 5 + 52.421875 µs = 57.421875 µs
    ib = link_from_preset("ib_ndr")
    r = layer_transfer(1.342e9, ib, layers=80, nics=8)
    assert close(r.effective_Bps, 3.2e11)
    assert close(r.bulk_s, 4.19875 * MS)
    assert close(r.per_layer_bytes, 16.775e6)
    assert close(r.layered_exposed_s, 57.421875 * US)
    assert close(r.saved_s, 4.19875 * MS - 57.421875 * US)
    # one layer is the bulk transfer
    assert close(layer_transfer(1.342e9, ib, layers=1, nics=8).layered_exposed_s, r.bulk_s)


def test_layer_transfer_when_compute_is_shorter():
    # 4 GB in 4 layers over one ib_ndr NIC: t_l = 5 µs + 1e9/4e10 s = 25.005 ms; compute 10 ms per layer.
    # Transfers end at 10 + 4·25.005 = 110.02 ms, compute at 40 ms: exposed 70.02 ms
    # = t_l + 3·(t_l − s_l) = 25.005 + 3·15.005.
    ib = link_from_preset("ib_ndr")
    r = layer_transfer(4e9, ib, layers=4, layer_compute_s=10 * MS)
    assert close(r.layered_exposed_s, 70.02 * MS)
    # when compute is longer than the transfer, only the last layer shows
    assert close(layer_transfer(4e9, ib, layers=4, layer_compute_s=30 * MS).layered_exposed_s, 25.005 * MS)
    for kwargs in ({"layers": 0}, {"nics": 0}, {"layer_compute_s": -1.0}):
        with pytest.raises(BadInputError):
            layer_transfer(4e9, ib, **kwargs)


def test_pp_decode_worked_example():
    # p = 8, m = 8, s = 1 ms, x = 0.1 ms, T = 100:
    #   R = 8·1 + 7·0.1 = 8.7 ms (token interval lower bound); P = max(8·1, 8.7) = 8.7 ms
    #   total = 99·8.7 + 7·1 + 8.7 = 877.0 ms; mean per token 8.770 ms
    #   utilisation = 8·100·1 / 877 = 0.91220; steady 8/8.7 = 0.91954; m to fill = ⌈8.7⌉ = 9
    r = pp_decode(8, 8, 1 * MS, 0.1 * MS, 100)
    assert close(r.token_latency_s, 8.7 * MS)
    assert close(r.round_s, 8.7 * MS)
    assert close(r.total_s, 877.0 * MS)
    assert close(r.mean_time_per_token_s, 8.77 * MS)
    assert close(r.utilisation, 800 / 877)
    assert close(r.steady_utilisation, 8 / 8.7)
    assert r.microbatches_to_fill == 9
    # stage-bound: p = 4, m = 8, s = 1 ms, x = 0, T = 10: R = 4 ms, P = 8 ms,
    # total = 9·8 + 7 + 4 = 83 ms; utilisation = 80/83
    r = pp_decode(4, 8, 1 * MS, 0.0, 10)
    assert close(r.total_s, 83 * MS) and close(r.utilisation, 80 / 83) and r.microbatches_to_fill == 4
    for args in ((0, 8, MS, 0, 10), (8, 0, MS, 0, 10), (8, 8, MS, 0, 0), (8, 8, -MS, 0, 10)):
        with pytest.raises(BadInputError):
            pp_decode(*args)


def _simulate_pp_decode(p, m, s, x, tokens):
    """Event-by-event schedule: stages serve micro-batches round-robin, a token waits for the previous one."""
    stage_free = [0.0] * p
    done = [0.0] * m  # when each micro-batch's previous token left the last stage
    busy = 0.0
    for _t in range(tokens):
        for j in range(m):
            ready = done[j]
            for i in range(p):
                start = max(stage_free[i], ready)
                stage_free[i] = start + s
                busy += s
                ready = start + s + (x if i < p - 1 else 0.0)
            done[j] = stage_free[p - 1]
    total = max(done)
    return total, busy / (p * total)


@settings(max_examples=100, deadline=None)
@given(
    p=st.integers(1, 12),
    m=st.integers(1, 16),
    s=st.floats(1e-4, 1e-2),
    x=st.floats(0, 5e-3),
    tokens=st.integers(1, 20),
)
def test_pp_decode_closed_form_matches_simulation(p, m, s, x, tokens):
    total, util = _simulate_pp_decode(p, m, s, x, tokens)
    r = pp_decode(p, m, s, x, tokens)
    assert r.total_s == pytest.approx(total, rel=1e-9)
    assert r.utilisation == pytest.approx(util, rel=1e-9)
    assert r.round_s >= r.token_latency_s - 1e-15  # never faster than p·s + (p−1)·x per token
