"""NCCL's tuning model (tracekit.model.nccl_tuning) against hand-computed values.

Constants: NVIDIA/nccl src/graph/tuning.cc, NCCL 2.20.3 (commit b6475625fbca). Each test writes
the arithmetic out from that file's figures: base latency baseLat[algo][proto], hop latency
hwLat[NVLINK|PCI|NET][algo][proto], the bandwidth factors and caps, and the algbw ratios.

Machine dgx-h100: β_in = 450 GB/s × 0.8 = 360 GB/s (nvlink4), NIC ib_ndr 50 × 0.8 = 40 GB/s,
8 NICs per node, 16 channels, Hopper, Intel CPUs.
"""

from dataclasses import replace

import pytest

from tracekit.errors import BadInputError
from tracekit.model.machine import machine_preset, make_machine
from tracekit.model.nccl_tuning import NCCL_TABLE, nccl_choice, nccl_predictions

H100 = machine_preset("dgx-h100")
A100 = machine_preset("dgx-a100")
US = 1e-6
GB = 1e9


def pick(op, d, k, n, m, label):
    (p,) = [r for r in nccl_predictions(op, d, k, n, m) if r.label == label]
    return p


def check(p, lat_us, algbw_GBps, d):
    assert p.eligible, p.reason
    assert p.latency_s == pytest.approx(lat_us * US, rel=1e-12)
    assert p.algbw_Bps == pytest.approx(algbw_GBps * GB, rel=1e-12)
    assert p.time_s == pytest.approx(lat_us * US + d / (algbw_GBps * GB), rel=1e-12)


# -- one node of 8 H100 (NVLink hops), all_reduce of 1 MB: nsteps = 2·7 = 14, ring ratio 8/14 ---------


def test_ring_ll_one_node():
    # bus = min(llMaxBw Hopper 1 node 87.7, 360 × 1/4 = 90) = 87.7; lat = 6.6 + 14 × 0.6 = 15.0 µs
    check(pick("all_reduce", 1e6, 8, 1, H100, "ring/LL"), 15.0, 87.7 * 8 / 14, 1e6)


def test_ring_ll128_one_node():
    # bus = min(360 × 0.92 = 331.2, 16 ch × 36.7 = 587.2) = 331.2; lat = 14.0 + 14 × 1.9 = 40.6 µs
    check(pick("all_reduce", 1e6, 8, 1, H100, "ring/LL128"), 40.6, 331.2 * 8 / 14, 1e6)


def test_ring_simple_one_node():
    # bus = 360; lat = 8.4 + 14 × 3.4 = 56.0 µs
    check(pick("all_reduce", 1e6, 8, 1, H100, "ring/Simple"), 56.0, 360 * 8 / 14, 1e6)


def test_tree_ll_one_node():
    # bus = min(360 × 0.92, 16 × 38.7) = 331.2 → × 1/3.8 = 87.157..., min with 87.7; algbw × 0.5;
    # size class ⌊log₂(1e6 / 64)⌋ = ⌊log₂ 15625⌋ = 13 → LL correction 0.4
    # lat = 6.8 + 2 × (7 × 0.6 + 0) = 15.2 µs
    check(pick("all_reduce", 1e6, 8, 1, H100, "tree/LL"), 15.2, 331.2 / 3.8 * 0.5 * 0.4, 1e6)


def test_tree_ll128_one_node():
    # bus = min(331.2 × 7/9 = 257.6, 16 × 36.7) = 257.6; × 0.5; LL128 correction[13] = 0.6
    # lat = 14.0 + 2 × 7 × 1.25 = 31.5 µs
    check(pick("all_reduce", 1e6, 8, 1, H100, "tree/LL128"), 31.5, 257.6 * 0.5 * 0.6, 1e6)


def test_tree_simple_one_node():
    # bus 331.2 × 0.5, Simple correction[13] = 0.5; lat = 0 + 2 × 7 × 28 = 392 µs
    check(pick("all_reduce", 1e6, 8, 1, H100, "tree/Simple"), 392.0, 331.2 * 0.5 * 0.5, 1e6)


def test_nvls_one_node():
    # NVLS replaces the base latency: lat = hwLat[NVLINK][NVLS][Simple] = 23 µs; algbw = 360 × 5/6 = 300
    check(pick("all_reduce", 1e9, 8, 1, H100, "nvls/Simple"), 23.0, 300.0, 1e9)
    assert nccl_choice("all_reduce", 1e9, 8, 1, H100).label == "nvls/Simple"


# -- across nodes: path = min(360, 8 NICs × 40) = 320 GB/s ----------------------------------------------


def test_nvls_tree_four_nodes():
    # more than 2 nodes: bwInter / 2 → min(360, 320 / 2) = 160; algbw 160 × 5/6
    # lat = 0 + 23 (NVLink hop) + 2 × ⌊log₂4⌋ × 14 (NET) = 79 µs
    check(pick("all_reduce", 1e9, 32, 4, H100, "nvls_tree/Simple"), 79.0, 160 * 5 / 6, 1e9)


def test_ring_simple_four_nodes_plateau():
    # k = 32: nsteps 62, nInter = 2 × 4 = 8; net overhead (Intel) 1.0 × 3 (Simple) = 3.0 < 3.4
    # lat = 8.4 + 54 × 3.4 + 8 × 14.0 = 304.0 µs; D/(16 × 32) >= 64 → plateau × 1.4 = 425.6 µs
    p = pick("all_reduce", 1e9, 32, 4, H100, "ring/Simple")
    check(p, 425.6, 320 * 32 / 62, 1e9)
    assert p.crossover_bytes == pytest.approx(304.0e-6 * 320e9 * 32 / 62)  # its own boundary: no plateau


def test_ring_ll_two_nodes_amd():
    # dgx-a100: β_in 240, 8 × ib_hdr 20 = 160 → path 160; LL: min(llMaxBw 2 nodes AMD 22.5, 160/4)
    # k = 16: nsteps 30, nInter 4; overhead AMD 2.0 (LL: × 1) > hop 0.6 → lat = 6.6 + 26 × 2.0 + 4 × 2.7 = 69.4
    check(pick("all_reduce", 1e6, 16, 2, A100, "ring/LL"), 69.4, 22.5 * 16 / 30, 1e6)


def test_tree_ll_at_scale_is_what_nccl_picks():
    # 8-byte all_reduce on 256 nodes × 8: tree LL bus = min(294.4 / 3.8, llMaxBw >2 nodes Intel 20.4) = 20.4
    # lat = 6.8 + 2 × (7 × 0.6 + ⌊log₂256⌋ × 5.0) = 95.2 µs; size class 0 → correction 1.0
    p = pick("all_reduce", 8, 2048, 256, H100, "tree/LL")
    check(p, 95.2, 20.4 * 0.5, 8)
    assert nccl_choice("all_reduce", 8, 2048, 256, H100).label == "tree/LL"
    # ring/LL there: 6.6 + (4094 − 512) × max(0.6, 1.0) + 512 × 2.7 = 4,971 µs, far slower
    ring = pick("all_reduce", 8, 2048, 256, H100, "ring/LL")
    assert ring.latency_s == pytest.approx((6.6 + 3582 * 1.0 + 512 * 2.7) * US)


def test_tree_ll128_and_simple_multi_node():
    # 4 nodes: tree bus = min(320 × 0.92 = 294.4, 16 × 36.0 = 576) = 294.4
    # LL128: min(294.4 × 120/128 = 276, 16 × 29.0 = 464) = 276; lat = 14 + 2 × (7 × 1.25 + 2 × 8.5) = 65.5
    # D = 1e9: size class ⌊log₂(1e9/64)⌋ = 23, no correction
    check(pick("all_reduce", 1e9, 32, 4, H100, "tree/LL128"), 65.5, 276 * 0.5, 1e9)
    # Simple: lat = 0 + 2 × (7 × 28 + 2 × 28) = 504
    check(pick("all_reduce", 1e9, 32, 4, H100, "tree/Simple"), 504.0, 294.4 * 0.5, 1e9)


def test_collnet_and_nvls_with_sharp():
    m = replace(H100, collnet=True)
    # chain: bus 320, algbw × 0.5; lat = 0 + 2 × 7 × 2.8 + 30 = 69.2
    check(pick("all_reduce", 1e9, 32, 4, m, "collnet_chain/Simple"), 69.2, 160.0, 1e9)
    # direct: GPU/channel factor 8/16 = 0.5 → 0.5 − (0.5 − 1)/2 = 0.75; bus 320 / 0.75 × 0.85 (Hopper)
    # lat = 2 × (min(1, 7) × 3.7 + 7 × 0.4) + 31 = 44.0
    check(pick("all_reduce", 1e9, 32, 4, m, "collnet_direct/Simple"), 44.0, 320 / 0.75 * 0.85 * 0.5, 1e9)
    # NVLS across nodes (needs CollNet): lat = 23 + 18 = 41; bus min(360, 320) = 320 × 5/6
    check(pick("all_reduce", 1e9, 32, 4, m, "nvls/Simple"), 41.0, 320 * 5 / 6, 1e9)
    assert not pick("all_reduce", 1e9, 32, 4, H100, "collnet_chain/Simple").eligible


def test_broadcast_and_all_gather_rings():
    # broadcast, one node: nsteps = k = 8, ratio 8/8; LL factor 1/3 (one node, not all-reduce):
    # min(87.7, 360/3 = 120) = 87.7; lat = 6.6 + one NVLink hop 0.6 = 7.2
    check(pick("broadcast", 1e6, 8, 1, H100, "ring/LL"), 7.2, 87.7, 1e6)
    check(pick("broadcast", 1e6, 8, 1, H100, "ring/LL128"), 14.0 + 1.9, 331.2, 1e6)
    # all_gather on 2 nodes × 8: nsteps 15, nInter 1; Simple overhead 3.0 < 3.4
    # lat = 8.4 + 14 × 3.4 + 1 × 14.0 = 70.0; algbw 320 × 16/15
    check(pick("all_gather", 1e8, 16, 2, H100, "ring/Simple"), 70.0, 320 * 16 / 15, 1e8)
    assert [r.label for r in nccl_predictions("broadcast", 1e6, 8, 1, H100)] == ["ring/LL", "ring/LL128", "ring/Simple"]


def test_p2p_rows():
    # send across 2 nodes, one GPU each: NICs used ⌈1 × 8/8⌉ = 1 → 40 GB/s; lat = 8.4 + 14.0 = 22.4
    check(pick("send", 1e9, 2, 2, H100, "p2p/Simple"), 22.4, 40.0, 1e9)
    # p5: 32 EFA cards of 12.5 × 0.8 = 10 GB/s, ⌈32/8⌉ = 4 per GPU → 40 GB/s
    check(pick("send", 1e9, 2, 2, machine_preset("p5.48xlarge"), "p2p/Simple"), 22.4, 40.0, 1e9)
    # all_to_all on 2 × 8: node peers 7/16 of D over 360, others 8/16 of D over 8 × 40 / 8 = 40 GB/s;
    # the NIC side is slower: D / (8/16 × D / 40) = 80 GB/s
    check(pick("all_to_all", 1e9, 16, 2, H100, "p2p/Simple"), 22.4, 80.0, 1e9)
    # one node: a send over NVLink, lat 8.4 + 3.4
    check(pick("send", 1e6, 2, 1, H100, "p2p/Simple"), 11.8, 360.0, 1e6)


def test_eligibility():
    assert "NVLink SHARP" in pick("all_reduce", 1e9, 8, 1, A100, "nvls/Simple").reason
    assert "several nodes" in pick("all_reduce", 1e9, 8, 1, H100, "nvls_tree/Simple").reason
    # every pair NCCL's all_reduce loop has: ring and tree × 3 protocols, the other four Simple only
    assert len(nccl_predictions("all_reduce", 1e6, 8, 1, H100)) == 10
    pcie = make_machine(8, "pcie5", name="pcie-box")
    assert "NVLink" in pick("all_reduce", 1e6, 8, 1, pcie, "ring/LL128").reason
    # PCIe hops: ring Simple lat 8.4 + 14 × 5.7 = 88.2
    check(pick("all_reduce", 1e6, 8, 1, pcie, "ring/Simple"), 88.2, 51.2 * 8 / 14, 1e6)
    assert all(r.eligible or r.reason for r in nccl_predictions("all_reduce", 1e6, 8, 1, H100))
    assert {r.algo for r in nccl_predictions("reduce_scatter", 1e6, 8, 1, H100, eligible_only=True)} == {"ring", "nvls"}


def test_bad_input():
    with pytest.raises(BadInputError, match="no barrier"):
        nccl_predictions("barrier", 8, 8, 1, H100)
    with pytest.raises(BadInputError, match="4 nodes for 2 ranks"):
        nccl_predictions("all_reduce", 8, 2, 4, H100)
    with pytest.raises(BadInputError, match="ranks"):
        nccl_predictions("all_reduce", 8, 1, 1, H100)
    with pytest.raises(BadInputError, match="no NIC"):
        nccl_predictions("all_reduce", 8, 16, 2, make_machine(8, "nvlink4"))


def test_table_is_the_published_one():
    # spot checks of the transcription against tuning.cc 2.20.3
    assert NCCL_TABLE["base_latency_us"]["ring"] == (6.6, 14.0, 8.4)
    assert NCCL_TABLE["hw_latency_us"]["net"]["nvls_tree"][2] == 14.0
    assert all(len(v) == 23 for v in NCCL_TABLE["tree_correction"].values())
