"""NCCL's own cost model: time of each algorithm × protocol it could run, and the one it would pick.

NCCL chooses an algorithm (ring, tree, NVLS, ...) and a protocol (LL, LL128, Simple) per call by
evaluating ``time = latency + bytes / bandwidth`` for every eligible pair and taking the fastest.
The latencies and bandwidth factors are constants in its public source; this module keeps them as
one data table, :data:`NCCL_TABLE`, and re-derives the time from a :class:`~tracekit.model.machine.Machine`.

Source: NVIDIA/nccl ``src/graph/tuning.cc`` at NCCL 2.20.3 (commit b6475625fbca, ``makefiles/
version.mk``: 2.20.3), functions ``ncclTopoTuneModel`` (latency and bandwidth per
collective/algorithm/protocol) and ``ncclTopoGetAlgoTime`` (tree correction, ring plateau). The
figures are NCCL's; the table layout and code here are tracekit's.

How the time is formed (µs inside NCCL; seconds here). For op, D = nccl-tests S bytes (NCCL's
``nBytes``: the all-reduce buffer, all-gather output, reduce-scatter input), k ranks on n nodes,
ppn = k/n ranks per node:

- bus bandwidth B (GB/s per GPU) = the path's aggregate bandwidth, then NCCL's refinements
  (per-algorithm/protocol factors and caps: :data:`NCCL_TABLE` ``ring_ll_factor`` ... below);
- algorithm bandwidth = B × ratio: ring k/nsteps (all-reduce nsteps = 2(k−1), all-gather /
  reduce-scatter k−1, broadcast / reduce k), NVLS / NVLS-tree 5/6, tree and CollNet 1/2;
- latency L (µs) = base latency[algo][proto] + hardware latency per hop (:data:`NCCL_TABLE`
  ``hw_latency_us``, by NVLink / PCI / NET) composed per algorithm:
    ring (all-reduce, all-gather, reduce-scatter): (nsteps − nInter)·max(intra, net overhead) + nInter·inter,
        nInter = 2n (all-reduce, n > 1, else 0), n − 1 (all-gather / reduce-scatter);
    ring (broadcast, reduce): one hop, intra on one node else NET (channels alike: NCCL's ``sameChannels``);
    tree: 2·((ppn − 1)·intra + ⌊log₂n⌋·inter);
    CollNet-direct: 2·(min(1, ppn − 1)·intra + 0.4·(ppn − 1)) + inter;  CollNet-chain: 2·(ppn − 1)·intra + inter;
    NVLS: intra (+ inter when n > 1), with no base latency;  NVLS-tree: intra + 2·⌊log₂n⌋·inter;
- time = L·1e-6 + D / (algbw·1e9) s, where a tree's algbw is multiplied by the tree correction
  factor of its size class ⌊log₂(D/64)⌋ (< 23), and a multi-node Simple ring all-reduce's L by
  1.4 (Volta: 1.9) once D/(channels·k) >= 64 ("plateau effect of ring").

Where tracekit supplies what NCCL measures at run time (stated in each prediction's ``assumption``):

- the path bandwidth, NCCL's nChannels × per-channel graph bandwidth: on one node the intra-node
  link's effective β (:class:`~tracekit.model.links.Link`, nominal × 0.8); across nodes
  min(β_in, NICs used × β_NIC) — NCCL's rings and trees spread their channels over every NIC of
  the node, so the node's NICs add up (NICs used = ⌈ppn · NICs/G⌉, at least 1: the NICs local to
  the group's GPUs); NVLS-tree on more than two nodes gets half of that (as NCCL's bwInter/2);
- the channel count, which only scales NCCL's per-channel caps: ``Machine.channels``.

Left out (each only shifts mid-size times): NCCL's per-call channel and thread reduction for
small messages, the aggregation of several ops into one launch (numPipeOps = 1 here), the
``latencyInter`` of network plugins (0 for InfiniBand), the 0.85 penalty of the plain TREE pattern
(NCCL's default balanced tree has none), CollNet-direct for all-gather / reduce-scatter, NVLS for
all-gather / reduce-scatter across nodes, PAT (NCCL 2.23+), Multi-Node NVLink, the user's
NCCL_ALGO / NCCL_PROTO overrides and tuner plugins; LL128 is taken as allowed across nodes (NCCL
also asks that GPU and NIC share a PCIe switch, as on DGX/HGX nodes). Point-to-point (send/recv, all-to-all) is not
in NCCL's tuning table: its row here, algo ``p2p`` / Simple, is tracekit's composition from the
table's ring base and hop latencies and the same path bandwidths (see :func:`_p2p`). RCCL (AMD)
has its own tables; on an ``arch = "cdna"`` machine these predictions are NCCL's model applied to
that hardware, an approximation. Blackwell uses the Hopper rows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tracekit.errors import BadInputError
from tracekit.model.links import _check_size
from tracekit.model.machine import Machine
from tracekit.model.ops import canonical_op

__all__ = [
    "NCCL_VERSION",
    "NCCL_SOURCE",
    "NCCL_TABLE",
    "PROTOCOLS",
    "NCCL_ALGORITHMS",
    "NCCL_OPS",
    "NcclPrediction",
    "nccl_predictions",
    "nccl_choice",
]

NCCL_VERSION = "2.20.3"
NCCL_SOURCE = "NVIDIA/nccl src/graph/tuning.cc, NCCL 2.20.3 (commit b6475625fbca)"

PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree")
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send")

_ARCH_ROW = {"volta": "volta", "ampere": "ampere", "hopper": "hopper", "blackwell": "hopper", "cdna": "ampere"}

NCCL_TABLE: dict = {
    # base latency, µs, per algorithm: (LL, LL128, Simple)
    "base_latency_us": {
        "tree": (6.8, 14.0, 0.0),
        "ring": (6.6, 14.0, 8.4),
        "collnet_direct": (0.0, 0.0, 0.0),
        "collnet_chain": (0.0, 0.0, 0.0),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
    },
    # hardware latency of one hop, µs, by link class then algorithm: (LL, LL128, Simple)
    "hw_latency_us": {
        "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0.0, 0.0, 3.7),
                   "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 23.0), "nvls_tree": (0.0, 0.0, 23.0)},
        "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0.0, 0.0, 3.7),
                "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0)},
        "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0.0, 0.0, 31.0),
                "collnet_chain": (0.0, 0.0, 30.0), "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 14.0)},
    },
    # LL bandwidth cap, GB/s (not per channel): one node by GPU arch; 2 nodes / more by CPU vendor
    "ll_max_bw_GBps": {
        "one_node": {"volta": 39.0, "ampere": 87.7, "hopper": 87.7},
        "two_nodes": {"intel": 39.0, "amd": 22.5},
        "more_nodes": {"intel": 20.4, "amd": 19.0},
    },
    # per-channel caps, GB/s, by arch: (1 node, 2 nodes, more)
    "ring_ll128_max_per_channel_GBps": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                                         "hopper": (36.7, 36.7, 36.7)},
    "tree_ll128_max_per_channel_GBps": {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                                         "hopper": (36.7, 36.7, 29.0)},
    "tree_max_per_channel_GBps": {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
                                  "hopper": (38.7, 41.4, 36.0)},
    # bandwidth factors
    "ring_ll_factor": (1 / 4, 1 / 3),  # (multi-node, all-reduce or reduce; otherwise)
    "ring_ll128_factor": (0.92, 0.7),  # (ppn >= 2; ppn < 2)
    "tree_factor": 0.92,
    "tree_ll_factor": 1 / 3.8,
    "tree_ll128_factor": (7 / 9, 120 / 128),  # (one node; more)
    "collnet_direct_hopper_factor": 0.85,
    "collnet_direct_arity_latency_us": 0.4,
    "algbw_ratio": {"tree": 0.5, "collnet_direct": 0.5, "collnet_chain": 0.5, "nvls": 5 / 6, "nvls_tree": 5 / 6},
    # network post overhead per inter-node ring step, µs, by CPU vendor; × 3 for Simple
    "net_overhead_us": {"intel": 1.0, "amd": 2.0, "arm": 1.0},
    "net_overhead_simple_factor": 3.0,
    # ring Simple all-reduce across nodes, latency × this once D/(channels·k) >= 64 B
    "ring_plateau_factor": {"volta": 1.9, "ampere": 1.4, "hopper": 1.4},
    # tree bandwidth × this, by protocol, for size class ⌊log₂(D/64)⌋ = 0..22 (64 B to 256 MB)
    "tree_correction": {
        "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
        "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
        "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
    },
}
"""NCCL 2.20.3's tuning constants (``src/graph/tuning.cc``), µs and GB/s (GB = 1e9 B) as NCCL keeps
them. Protocol tuples are (LL, LL128, Simple). See the module docstring for how they combine."""


@dataclass(frozen=True)
class NcclPrediction:
    """One algorithm × protocol NCCL could run for one collective instance.

    op, algo (one of :data:`NCCL_ALGORITHMS` or ``p2p``), proto (one of :data:`PROTOCOLS`);
    ranks k, nodes n, size_bytes D; eligible: NCCL would consider it on this machine (else
    ``reason`` says why and the numbers are None); time_s = latency_s + beta_term_s, seconds;
    latency_s: NCCL's latency (the α term); beta_term_s = D / algbw_Bps; algbw_Bps: NCCL's
    algorithm bandwidth at this size (tree correction applied), bytes/s; bus_bw_Bps: its bus
    bandwidth before the algbw ratio, bytes/s (equal to nccl-tests busbw for ring all-reduce);
    crossover_bytes: D* where this pair's latency equals its bandwidth term, latency × algbw
    (tree correction and ring plateau left out: the pair's own boundary), bytes; verdict:
    ``latency-bound`` when latency_s >= beta_term_s, else ``bandwidth-bound``; assumption: the
    path bandwidth used, in words.
    """

    op: str
    algo: str
    proto: str
    ranks: int
    nodes: int
    size_bytes: float
    eligible: bool
    reason: str = ""
    time_s: float | None = None
    latency_s: float | None = None
    beta_term_s: float | None = None
    algbw_Bps: float | None = None
    bus_bw_Bps: float | None = None
    crossover_bytes: float | None = None
    verdict: str | None = None
    assumption: str = ""

    @property
    def label(self) -> str:
        """``ring/LL128``: how NCCL's logs name the pair (lower-case algorithm here)."""
        return f"{self.algo}/{self.proto}"

    def to_dict(self) -> dict:
        """Snake-case dict (seconds, bytes, bytes/s), with ``label``."""
        return {**asdict(self), "label": self.label}


def _log2i(n: int) -> int:
    """⌊log₂n⌋ for n >= 1, 0 for n <= 1 (NCCL's log2i)."""
    return max(int(n), 1).bit_length() - 1


def _nodes_index(n: int) -> int:
    return 0 if n <= 1 else 1 if n == 2 else 2


def _path(machine: Machine, ppn: int, n: int) -> tuple[float, str]:
    """(aggregate path bandwidth in GB/s per GPU, words): β_in on one node; min(β_in, NICs used × β_NIC)
    across nodes (β_in dropped when a node holds one rank of the group)."""
    b_in = machine.intra_link.beta_Bps / 1e9
    if n <= 1:
        return b_in, f"{machine.link_in} β {b_in:.4g} GB/s per GPU"
    nic = machine.nic_link
    if nic is None:
        raise BadInputError(f"machine {machine.name!r} has no NIC preset: it cannot run a collective over {n} nodes")
    used = nics_used(machine, ppn)
    b_net = used * nic.beta_Bps / 1e9
    words = f"{used} × {machine.nic} ({b_net:.4g} GB/s: rings and trees use every NIC local to the group's GPUs)"
    if ppn > 1 and b_in < b_net:
        return b_in, f"{machine.link_in} β {b_in:.4g} GB/s per GPU (below {words})"
    return b_net, words


def nics_used(machine: Machine, ppn: int) -> int:
    """NICs a group with ``ppn`` ranks on each node can drive: ⌈ppn · NICs/G⌉, between 1 and NICs."""
    if machine.nics_per_node < 1:
        return 0
    return max(1, min(machine.nics_per_node, math.ceil(ppn * machine.nics_per_node / machine.gpus_per_node)))


def _eligibility(op: str, algo: str, proto: str, k: int, n: int, ppn: int, m: Machine) -> str:
    """'' when NCCL 2.20 would consider (op, algo, proto) here, else the reason it would not."""
    if algo == "p2p":
        return ""
    if algo == "nvls":
        if not m.nvls:
            return "no NVLink SHARP (NVSwitch multicast) on this machine"
        if ppn < 2:
            return "NVLS needs several GPUs of a node"
        if n > 1 and (op != "all_reduce" or not m.collnet):
            return "NVLS across nodes needs CollNet (IB SHARP); NVLS-tree covers the rest"
    if algo == "nvls_tree":
        if not m.nvls:
            return "no NVLink SHARP (NVSwitch multicast) on this machine"
        if n < 2:
            return "NVLS-tree is for several nodes"
        if ppn < 2:
            return "NVLS-tree needs several GPUs of a node"
    if algo in ("collnet_direct", "collnet_chain"):
        if not m.collnet:
            return "no CollNet (IB SHARP) on this machine"
        if n < 2:
            return "CollNet is for several nodes"
        if algo == "collnet_direct" and (not m.nvswitch or ppn > 8):
            return "CollNet-direct needs an NVSwitch node of at most 8 GPUs"
    if proto == "LL128":
        if not m.intra_is_nvlink:
            return "LL128 is on by default only over NVLink"
        if m.arch not in ("volta", "ampere", "hopper"):
            return f"LL128 is on by default only on Volta, Ampere and Hopper, not {m.arch}"
    return ""


_OP_ALGORITHMS = {
    "all_reduce": NCCL_ALGORITHMS,
    "all_gather": ("ring", "nvls"),
    "reduce_scatter": ("ring", "nvls"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("p2p",),
    "send": ("p2p",),
}
"""The algorithms NCCL 2.20's tuning loop evaluates per op (p2p: tracekit's row)."""


def _protocols(algo: str) -> tuple[str, ...]:
    """Protocols that exist for ``algo``: NVLS, NVLS-tree and CollNet run Simple only; p2p is
    modelled with Simple only (NCCL switches to LL below NCCL_P2P_LL_THRESHOLD, 16 KiB per peer)."""
    return PROTOCOLS if algo in ("ring", "tree") else ("Simple",)


def _p2p(op: str, d: float, k: int, n: int, ppn: int, m: Machine) -> tuple[float, float, str]:
    """(latency µs, path GB/s, words) of point-to-point, tracekit's composition (not NCCL's table).

    Latency: ring base + one ring hop (Simple), NET across nodes. send: one GPU's path — β_in on a
    node, else its share of the node's NICs (NICs used / ppn × β_NIC). all_to_all: the (ppn−1)/k of
    D bound for the node's peers over β_in and the (k−ppn)/k for other nodes over the NIC share run
    at once; the slower sets the time, returned as the equivalent bandwidth D/time.
    """
    base = NCCL_TABLE["base_latency_us"]["ring"][2]
    intra_hw = "nvlink" if m.intra_is_nvlink else "pci"
    lat = base + NCCL_TABLE["hw_latency_us"]["net" if n > 1 else intra_hw]["ring"][2]
    b_in = m.intra_link.beta_Bps / 1e9
    if n > 1:
        nic = m.nic_link
        if nic is None:
            raise BadInputError(f"machine {m.name!r} has no NIC preset: it cannot send over {n} nodes")
        share = nics_used(m, ppn) * nic.beta_Bps / 1e9 / ppn
    if op == "send":
        if n > 1:
            return lat, share, f"one GPU's NIC share {share:.4g} GB/s ({nics_used(m, ppn)} × {m.nic} over {ppn} GPUs)"
        return lat, b_in, f"{m.link_in} β {b_in:.4g} GB/s"
    t_in = (ppn - 1) / k * d / b_in if ppn > 1 else 0.0
    t_out = (k - ppn) / k * d / share if n > 1 else 0.0
    t = max(t_in, t_out)
    bw = d / t if t > 0 else b_in
    return lat, bw, (f"peers on the node over {m.link_in} ({b_in:.4g} GB/s), others over the NIC share "
                     f"({share:.4g} GB/s), whichever is slower" if n > 1 else f"{m.link_in} β {b_in:.4g} GB/s")


def _predict(op: str, algo: str, proto: str, d: float, k: int, n: int, m: Machine) -> NcclPrediction:
    ppn = max(1, k // n)
    reason = _eligibility(op, algo, proto, k, n, ppn, m)
    if reason:
        return NcclPrediction(op, algo, proto, k, n, d, False, reason)
    p = PROTOCOLS.index(proto)
    arch = _ARCH_ROW[m.arch]
    ni = _nodes_index(n)
    T = NCCL_TABLE
    if algo == "p2p":
        lat_us, algbw, words = _p2p(op, d, k, n, ppn, m)
        bus = algbw
    else:
        path, words = _path(m, ppn, n)
        if algo == "nvls_tree" and n > 2:
            path = min(m.intra_link.beta_Bps / 1e9, path / 2) if ppn > 1 else path / 2
            words += "; halved for NVLS-tree on more than two nodes"
        bus = path
        ch = m.channels
        if n == 1:
            ll_max = T["ll_max_bw_GBps"]["one_node"][arch]
        else:
            row = "amd" if m.cpu == "amd" else "intel"
            ll_max = T["ll_max_bw_GBps"]["two_nodes" if n == 2 else "more_nodes"][row]
        if algo == "ring" and proto == "LL":
            f = T["ring_ll_factor"][0 if (n > 1 or op in ("all_reduce", "reduce")) else 1]
            bus = min(ll_max, bus * f)
        if algo == "ring" and proto == "LL128":
            bus = min(bus * T["ring_ll128_factor"][0 if ppn >= 2 else 1],
                      ch * T["ring_ll128_max_per_channel_GBps"][arch][ni])
        if algo == "tree":
            bus = min(bus * T["tree_factor"], ch * T["tree_max_per_channel_GBps"][arch][ni])
            if proto == "LL":
                bus = min(bus * T["tree_ll_factor"], ll_max)
            if proto == "LL128":
                bus = min(bus * T["tree_ll128_factor"][0 if n == 1 else 1],
                          ch * T["tree_ll128_max_per_channel_GBps"][arch][ni])
        if algo == "collnet_direct":
            factor = ppn / ch
            factor -= (factor - 1) / 2
            bus /= factor
            if m.arch in ("hopper", "blackwell"):
                bus *= T["collnet_direct_hopper_factor"]
        nsteps = 2 * (k - 1) if op == "all_reduce" else k - 1 if op in ("all_gather", "reduce_scatter") else k
        ratio = k / nsteps if algo == "ring" else T["algbw_ratio"][algo]
        algbw = bus * ratio
        # latency, µs
        intra_hw = "nvlink" if m.intra_is_nvlink else "pci"
        intra = T["hw_latency_us"][intra_hw][algo][p]
        inter = T["hw_latency_us"]["net"][algo][p]
        lat_us = T["base_latency_us"][algo][p]
        if algo == "ring":
            if op in ("broadcast", "reduce"):
                lat_us += T["hw_latency_us"][intra_hw if n == 1 else "net"]["ring"][p]
            else:
                n_inter = (2 * n if n > 1 else 0) if op == "all_reduce" else n - 1
                overhead = 0.0
                if n > 1:
                    overhead = T["net_overhead_us"][m.cpu] * (T["net_overhead_simple_factor"] if proto == "Simple" else 1)
                lat_us += (nsteps - n_inter) * max(intra, overhead) + n_inter * inter
        elif algo == "tree":
            lat_us += 2 * ((ppn - 1) * intra + _log2i(n) * inter)
        elif algo == "collnet_direct":
            lat_us += 2 * (min(1, ppn - 1) * intra + (ppn - 1) * T["collnet_direct_arity_latency_us"]) + inter
        elif algo == "collnet_chain":
            lat_us += 2 * (ppn - 1) * intra + inter
        elif algo == "nvls":
            lat_us = intra + (inter if n > 1 else 0.0)
        elif algo == "nvls_tree":
            lat_us += intra + 2 * _log2i(n) * inter
    crossover = lat_us * 1e-6 * algbw * 1e9
    # ncclTopoGetAlgoTime's size-dependent corrections
    eff_bw = algbw
    if algo == "tree":
        size_class = _log2i(int(d) >> 6)
        if size_class < 23:
            eff_bw *= T["tree_correction"][proto][size_class]
    eff_lat = lat_us
    if algo == "ring" and proto == "Simple" and n > 1 and op == "all_reduce" and d / (m.channels * k) >= 64:
        eff_lat *= T["ring_plateau_factor"][arch]
    latency_s = eff_lat * 1e-6
    beta_term = d / (eff_bw * 1e9)
    return NcclPrediction(
        op=op, algo=algo, proto=proto, ranks=k, nodes=n, size_bytes=d, eligible=True,
        time_s=latency_s + beta_term, latency_s=latency_s, beta_term_s=beta_term,
        algbw_Bps=eff_bw * 1e9, bus_bw_Bps=bus * 1e9, crossover_bytes=crossover,
        verdict="latency-bound" if latency_s >= beta_term else "bandwidth-bound", assumption=words,
    )


def _check_op(op: str) -> str:
    canon = canonical_op(op)
    if canon == "recv":
        canon = "send"
    if canon not in NCCL_OPS:
        raise BadInputError(f"NCCL's model has no {canon}: expected one of {', '.join(NCCL_OPS)}")
    return canon


def nccl_predictions(op: str, size_bytes: float, ranks: int, nodes: int, machine: Machine,
                     eligible_only: bool = False) -> list[NcclPrediction]:
    """Every algorithm × protocol NCCL 2.20 has for ``op`` on k = ``ranks`` ranks over n = ``nodes``
    nodes of ``machine``, D = ``size_bytes`` (nccl-tests S), in the order of :data:`NCCL_ALGORITHMS`
    × :data:`PROTOCOLS`: all_reduce every algorithm; all_gather / reduce_scatter ring and NVLS;
    broadcast / reduce ring; all_to_all and send one ``p2p``/Simple row. NVLS, NVLS-tree and
    CollNet have a Simple row only, as in NCCL.

    Ineligible pairs come back with ``eligible`` False and a ``reason`` unless ``eligible_only``.
    Raises BadInputError for an op outside :data:`NCCL_OPS`, k < 2 (send: k >= 1), n < 1, n > k,
    D < 0, or a multi-node group on a machine without NICs.
    """
    canon = _check_op(op)
    d = _check_size(size_bytes)
    for label, v, low in (("ranks", ranks, 1 if canon == "send" else 2), ("nodes", nodes, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise BadInputError(f"bad {label} {v!r}: expected an integer >= {low}")
    if nodes > ranks:
        raise BadInputError(f"bad layout: {nodes} nodes for {ranks} ranks (each node holds at least one rank)")
    k = max(ranks, 2) if canon == "send" else ranks
    out = [_predict(canon, a, p, d, k, nodes, machine) for a in _OP_ALGORITHMS[canon] for p in _protocols(a)]
    return [x for x in out if x.eligible] if eligible_only else out


def nccl_choice(op: str, size_bytes: float, ranks: int, nodes: int, machine: Machine) -> NcclPrediction:
    """What NCCL would pick: the eligible pair of :func:`nccl_predictions` with the least time
    (first in table order on a tie). Raises BadInputError as nccl_predictions does."""
    rows = nccl_predictions(op, size_bytes, ranks, nodes, machine, eligible_only=True)
    return min(rows, key=lambda r: r.time_s)  # ring/Simple (or p2p/Simple) is always eligible
