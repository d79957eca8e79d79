"""The model functions added for the measured-vs-model analysis, on hand-worked values."""

from __future__ import annotations

import pytest

from tracekit.errors import BadInputError
from tracekit.model import layered_exposed_time, pipeline_bubble_fraction


def test_layered_exposed_time():
    # compute longer than transfer: only the last layer's transfer is exposed
    assert layered_exposed_time(1e-3, 2e-3, 80) == pytest.approx(1e-3)
    # transfer 3 ms, compute 1 ms, 4 layers: 3 + 3·(3 − 1) = 9 ms
    assert layered_exposed_time(3e-3, 1e-3, 4) == pytest.approx(9e-3)
    with pytest.raises(BadInputError):
        layered_exposed_time(1e-3, 1e-3, 0)


def test_pipeline_bubble_fraction():
    assert pipeline_bubble_fraction(2, 4) == pytest.approx(1 / 5)  # (2−1)/(4+2−1)
    assert pipeline_bubble_fraction(8, 8) == pytest.approx(7 / 15)
    assert pipeline_bubble_fraction(1, 3) == 0.0
    with pytest.raises(BadInputError):
        pipeline_bubble_fraction(4, 0)


# -- issue 15: double binary tree, crossover size D*, fixed latency, presets -------------------

from tracekit.model import (  # noqa: E402
    LINK_PRESETS,
    algorithm_coefficients,
    crossover_size,
    device_presets,
    double_binary_tree_all_reduce_time,
    fixed_latency,
    link_from_preset,
    network_link,
    predict_collective,
)

NV4 = link_from_preset("nvlink4")  # α 2 µs, β 450e9 × 0.8 = 360e9 B/s


def test_double_binary_tree_hand_checked():
    # k = 8, D = 1 GB, nvlink4: 2·⌈log₂8⌉·α + 2·D/β = 2·3·2 µs + 2·1e9/360e9 s
    p = double_binary_tree_all_reduce_time(1e9, 8, NV4)
    assert p.alpha_term_s == pytest.approx(12e-6, rel=1e-12)
    assert p.beta_term_s == pytest.approx(2e9 / 360e9, rel=1e-12)  # 5.5556 ms
    assert p.time_s == pytest.approx(12e-6 + 5.555555555555556e-3, rel=1e-12)
    assert p.steps == 6 and p.bytes_per_rank_sent == 2e9
    # the textbook unpipelined tree pays the depth in the β term too: 6·D/β, three times as much
    tree = predict_collective("all_reduce", 1e9, 8, NV4, algo="tree")
    assert tree.beta_term_s == pytest.approx(3 * p.beta_term_s, rel=1e-12)
    # non-power-of-two k: ⌈log₂6⌉ = 3
    assert double_binary_tree_all_reduce_time(0, 6, NV4).alpha_term_s == pytest.approx(12e-6)
    assert "double_binary_tree" in [q.algo for q in predict_collective("all_reduce", 1e9, 8, NV4, algo="all")]


CASES = [  # (op, algo, k, D* by hand in units of α·β = 720 KB)
    ("all_reduce", "ring", 8, 8),  # 2(k−1)α = 2(k−1)/k·D/β → D = k·α·β
    ("all_gather", "ring", 8, 8),
    ("reduce_scatter", "ring", 4, 4),
    ("all_to_all", "pairwise", 16, 16),
    ("all_reduce", "tree", 8, 1),  # 2·3·α = 2·3·D/β → D = α·β
    ("all_reduce", "double_binary_tree", 8, 3),  # 6α = 2D/β → D = 3·α·β
    ("all_reduce", "recursive_doubling", 8, 1),
    ("all_reduce", "nvls", 8, 2),  # 2α = D/β
]


@pytest.mark.parametrize("op,algo,k,mult", CASES)
def test_crossover_equalises_the_terms(op, algo, k, mult):
    d_star = crossover_size(op, k, NV4, algo=algo)
    assert d_star == pytest.approx(mult * 2e-6 * 360e9, rel=1e-12)
    p = predict_collective(op, d_star, k, NV4, algo=algo)
    assert p.alpha_term_s == pytest.approx(p.beta_term_s, rel=1e-12)
    assert p.crossover_bytes == pytest.approx(d_star, rel=1e-12)
    # just below: latency-bound; just above: bandwidth-bound
    assert predict_collective(op, d_star * 0.99, k, NV4, algo=algo).verdict == "latency-bound"
    assert predict_collective(op, d_star * 1.01, k, NV4, algo=algo).verdict == "bandwidth-bound"


def test_fixed_latency_is_steps_times_alpha():
    # ring all-reduce on 2,048 ranks with a per-step α of 0.04 µs: 2·2047·0.04 µs = 163.76 µs
    from tracekit.model import custom_link

    lk = custom_link(0.04e-6, 100e9)
    assert fixed_latency("all_reduce", 2048, lk) == pytest.approx(163.76e-6, rel=1e-12)
    assert fixed_latency("all_gather", 8, NV4) == pytest.approx(14e-6, rel=1e-12)
    p = predict_collective("all_reduce", 1e6, 8, NV4)
    assert p.fixed_latency_s == pytest.approx(28e-6) == p.alpha_term_s
    assert algorithm_coefficients("all_reduce", "double_binary_tree", 8).steps == 6


def test_added_presets():
    # nominal per direction × 0.8
    expect = {
        "nvlink2": 150e9, "nvlink3": 300e9, "nvlink4": 450e9, "nvlink5": 900e9, "xgmi_mi250x": 400e9,
        "xgmi_mi300x": 448e9, "xgmi_mi355x": 537.6e9, "pcie3": 16e9, "pcie4": 32e9, "pcie5": 64e9,
        "ib_hdr": 25e9, "ib_ndr": 50e9, "ib_xdr": 100e9, "roce200": 25e9, "roce400": 50e9,
        "slingshot11": 25e9, "loopback_gloo": 2.5e9,
    }
    for name, nominal in expect.items():
        assert LINK_PRESETS[name].nominal_Bps == pytest.approx(nominal)
        assert link_from_preset(name).beta_Bps == pytest.approx(nominal * 0.8)
    assert link_from_preset("nvlink2").beta_Bps == pytest.approx(120e9)


# every device name the shared traces carry (each folder of ../shared/traces ingested with
# `tracekit ingest`, then SELECT DISTINCT device_name FROM runs), with the preset it must map to
SHARED_DEVICE_NAMES = {
    "Tesla V100-SXM2-32GB": ("nvlink2", "ib_edr"),  # param_dlrm_8rank_v100, hta_ddp_v100, hta_ws1
    "Tesla V100-DGXS-32GB": ("nvlink2", "ib_edr"),  # kineto_legacy_2021
    "NVIDIA A100-PG509-200": ("nvlink3", "ib_hdr"),  # hta_nccl_parser_a100
    "NVIDIA A100-SXM4-80GB": ("nvlink3", "ib_hdr"),  # hta_pyper_a100
    "A100-SXM4-40GB": ("nvlink3", "ib_hdr"),  # superbench nccl-tests
    "NVIDIA B200": ("nvlink5", "ib_xdr"),  # tracelens_b200
    "NVIDIA H100 80GB HBM3": ("nvlink4", "ib_ndr"),  # single_gpu_compute/h100
    "AMD Instinct MI300X VF": ("xgmi_mi300x", "roce400"),  # single_gpu_compute/mi300
    "AMD Radeon Graphics": None,  # single_gpu_compute/mi250: the trace does not name the GPU
    None: None,  # CPU-only gloo traces
}


@pytest.mark.parametrize("name", list(SHARED_DEVICE_NAMES))
def test_device_names_of_the_shared_traces_map_to_presets(name):
    assert device_presets(name) == SHARED_DEVICE_NAMES[name]


def test_more_device_names():
    assert device_presets("NVIDIA A100-PCIE-40GB") == ("pcie4", "ib_hdr")
    assert device_presets("NVIDIA H100 PCIe") == ("pcie5", "ib_ndr")
    assert device_presets("NVIDIA H200") == ("nvlink4", "ib_ndr")
    assert device_presets("NVIDIA GB200")[0] == "nvlink5"
    assert device_presets("AMD Instinct MI355X")[0] == "xgmi_mi355x"


def test_network_link_shares_nics():
    # 8 GPUs over 4 NDR NICs: each GPU gets half a NIC, 40 GB/s × 4/8 = 20 GB/s
    lk = network_link("ib_ndr", nics_per_node=4, gpus_per_node=8)
    assert lk.beta_Bps == pytest.approx(20e9) and lk.alpha_s == pytest.approx(5e-6)
    assert network_link("ib_ndr", nics_per_node=8, gpus_per_node=8).beta_Bps == pytest.approx(40e9)
    assert network_link("ib_ndr").beta_Bps == pytest.approx(40e9)
    with pytest.raises(BadInputError):
        network_link("ib_ndr", nics_per_node=0, gpus_per_node=8)
