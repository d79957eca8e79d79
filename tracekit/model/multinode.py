"""Flat collectives across nodes under the α–β model, with the bandwidth NCCL's rings actually get.

A flat ring over N nodes × G GPUs crosses the network at N of its hops. NCCL runs several rings
at once (its channels) and lays them out so that each ring leaves a node through a different NIC:
the rings together use every NIC of the node, and each GPU's NVLink carries all of them (NCCL's
topology search, ``src/graph/search.cc``, and its tuning model, where a multi-node ring's bus
bandwidth is nChannels × the per-channel network bandwidth: :mod:`tracekit.model.nccl_tuning`).
So the ring's bus bandwidth is

    β_ring = min(β_in, NICs × β_NIC)      (β_in dropped when G = 1)

— with one NIC per node, every ring step through the network goes through that one NIC
(β_ring = β_NIC), not through a 1/G share of it. The α term keeps the reference's comparator:
every one of the ring's steps at the inter-node α ("a ring is as slow as its slowest hop",
../shared/reference/alpha-beta.md, "Hierarchical all-reduce"). This module gives that flat ring
for the ring-based ops; algorithms whose every GPU sends across nodes at once (pairwise
all-to-all, trees of the α–β table, point-to-point) see each GPU's share of the node's NICs,
NIC β × min(NICs, G)/G (:func:`tracekit.model.links.network_link`).

Units: bytes, seconds, bytes/s per direction.
"""

from __future__ import annotations

from dataclasses import replace

from tracekit.errors import BadInputError
from tracekit.model.collectives import Prediction, _check_ranks, _predict_one
from tracekit.model.links import Link, custom_link

__all__ = ["RING_OPS", "ring_bandwidth_across_nodes", "flat_ring_across_nodes"]

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
"""Ops whose default α–β algorithm is a ring (the ones whose flat form uses every NIC)."""


def ring_bandwidth_across_nodes(gpus_per_node: int, nic: Link, nics_per_node: int | None,
                                link_in: Link | None = None) -> tuple[float, str]:
    """(β_ring in bytes/s, the assumption in words) for flat rings over nodes of G GPUs.

    β_ring = NICs × β_NIC, capped by β_in when ``link_in`` is given and G > 1 (module docstring).
    ``nics_per_node`` None: one NIC per GPU (the reference's assumption), NICs = G.
    Raises BadInputError for counts < 1.
    """
    g = _check_ranks(gpus_per_node, minimum=1)
    nics = g if nics_per_node is None else _check_ranks(nics_per_node, minimum=1)
    b_net = nics * nic.beta_Bps
    if nics == 1:
        words = (f"one NIC per node: every ring step through the network crosses that one {nic.name} NIC "
                 f"(β {b_net / 1e9:.4g} GB/s)")
    else:
        words = (f"NCCL's rings use all {nics} NICs of a node at once: ring bandwidth = {nics} × {nic.name} "
                 f"{nic.beta_Bps / 1e9:.4g} GB/s = {b_net / 1e9:.4g} GB/s")
    if link_in is not None and g > 1 and link_in.beta_Bps < b_net:
        return link_in.beta_Bps, words + f", capped by {link_in.name} {link_in.beta_Bps / 1e9:.4g} GB/s per GPU"
    return b_net, words


def flat_ring_across_nodes(op: str, size_bytes: float, nodes: int, gpus_per_node: int, nic: Link,
                           nics_per_node: int | None = None, link_in: Link | None = None) -> tuple[Prediction, str]:
    """The flat ring of ``op`` over k = N·G ranks spanning N nodes, as NCCL lays its rings out.

    T = A·α_NIC + B·D/β_ring with the ring's (A, B) of :func:`tracekit.model.algorithm_coefficients`
    (all-reduce: 2(k−1), 2(k−1)/k) and β_ring of :func:`ring_bandwidth_across_nodes`.
    Example: 1 GB all-reduce on 4 × 8 GPUs, ib_ndr (α 5 µs, β 40 GB/s), 1 NIC per node:
    2·31·5 µs + 2·31/32·1e9/4e10 s = 310 µs + 48.4375 ms; with 8 NICs and nvlink4 inside:
    β_ring = min(360, 320) GB/s → 310 µs + 6.0546875 ms.
    Returns (Prediction, assumption in words); the Prediction's ``link`` names the ring bandwidth.
    Raises BadInputError for an op without a ring, N·G < 2, counts < 1 or D < 0.
    """
    if op not in RING_OPS:
        raise BadInputError(f"{op} has no ring: the flat ring across nodes is for {', '.join(RING_OPS)}")
    n = _check_ranks(nodes, minimum=1)
    g = _check_ranks(gpus_per_node, minimum=1)
    beta, words = ring_bandwidth_across_nodes(g, nic, nics_per_node, link_in)
    ring_link = replace(custom_link(nic.alpha_s, beta, name=f"rings over {nic.name}"),
                        nominal_Bps=beta / nic.efficiency, efficiency=nic.efficiency)
    p = _predict_one(op, "ring", size_bytes, n * g, ring_link)
    return p, f"flat ring over {n * g} ranks, all {p.steps} steps at the network's α {nic.alpha_s * 1e6:.3g} µs; " + words
