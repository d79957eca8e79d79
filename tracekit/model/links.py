"""Links of the α–β model: the preset table and custom links.

A link is (α, β): α the fixed cost of one message or step in seconds, β the
effective bandwidth per GPU per direction in bytes/s. Effective β = nominal
per-direction bandwidth × efficiency (0.8 unless told otherwise). The presets
are the table of ../shared/reference/alpha-beta.md, "Link presets".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tracekit.errors import BadInputError

__all__ = [
    "DEFAULT_EFFICIENCY",
    "Link",
    "LinkPreset",
    "LINK_PRESETS",
    "DEVICE_PRESETS",
    "presets_for_device",
    "device_presets",
    "network_link",
    "link_from_preset",
    "custom_link",
    "message_time",
    "n_half",
    "achieved_fraction",
]

DEFAULT_EFFICIENCY = 0.8
"""Effective bandwidth / nominal per-direction bandwidth (reference, "Units")."""


@dataclass(frozen=True)
class LinkPreset:
    """One row of the preset table: nominal per-direction bandwidth (B/s) and α (s)."""

    name: str
    description: str
    nominal_Bps: float
    alpha_s: float


@dataclass(frozen=True)
class Link:
    """A link as the model sees it.

    name: preset name or ``custom``; alpha_s: α, seconds per message/step;
    beta_Bps: effective β, bytes/s per GPU per direction (the value every
    formula uses); nominal_Bps: nominal per-direction bandwidth, bytes/s;
    efficiency: beta_Bps / nominal_Bps.
    """

    name: str
    alpha_s: float
    beta_Bps: float
    nominal_Bps: float
    efficiency: float
    description: str = ""

    @property
    def n_half_bytes(self) -> float:
        """n½ = α·β, bytes: the message size that reaches half of β."""
        return self.alpha_s * self.beta_Bps

    def with_overrides(self, alpha_s: float | None = None, beta_Bps: float | None = None) -> Link:
        """This link with α and/or effective β replaced (the other kept).

        A new β keeps the nominal bandwidth, so ``efficiency`` becomes
        beta/nominal. Raises BadInputError for α < 0 or β <= 0.
        """
        alpha = self.alpha_s if alpha_s is None else _check_alpha(alpha_s)
        beta = self.beta_Bps if beta_Bps is None else _check_beta(beta_Bps)
        changed = [w for w, v in (("alpha", alpha_s), ("beta", beta_Bps)) if v is not None]
        name = self.name if not changed else f"{self.name} ({'+'.join(changed)} overridden)"
        return Link(
            name=name,
            alpha_s=alpha,
            beta_Bps=beta,
            nominal_Bps=self.nominal_Bps,
            efficiency=beta / self.nominal_Bps,
            description=self.description,
        )

    def to_dict(self) -> dict:
        """Snake-case dict (seconds, bytes/s), with ``n_half_bytes`` added."""
        d = asdict(self)
        d["n_half_bytes"] = self.n_half_bytes
        return d


_GB = 1e9
_US = 1e-6

LINK_PRESETS: dict[str, LinkPreset] = {
    p.name: p
    for p in (
        # -- the reference's table (../shared/reference/alpha-beta.md, "Link presets") --
        LinkPreset("nvlink4", "H100/H200 NVLink 4 via NVSwitch", 450 * _GB, 2 * _US),
        LinkPreset("nvlink5", "B200/B300/GB200 NVLink 5", 900 * _GB, 2 * _US),
        LinkPreset("nvlink3", "A100 NVLink 3", 300 * _GB, 2 * _US),
        LinkPreset("pcie5", "PCIe Gen5 x16", 64 * _GB, 5 * _US),
        LinkPreset("pcie4", "PCIe Gen4 x16", 32 * _GB, 5 * _US),
        LinkPreset("ib_ndr", "InfiniBand NDR, one 400 Gb/s NIC", 50 * _GB, 5 * _US),
        LinkPreset("ib_hdr", "InfiniBand HDR, one 200 Gb/s NIC", 25 * _GB, 5 * _US),
        LinkPreset("roce400", "RoCE, one 400 GbE NIC", 50 * _GB, 5 * _US),
        LinkPreset("eth25", "25 GbE, TCP", 3.125 * _GB, 20 * _US),
        LinkPreset("eth100", "100 GbE, TCP", 12.5 * _GB, 10 * _US),
        LinkPreset("nvme", "one NVMe SSD (read)", 7 * _GB, 100 * _US),
        LinkPreset("hbm3", "H100 HBM3 (on-device reads)", 3350 * _GB, 0.0),
        # -- added by the reference's "More presets" rule: nominal per direction from the vendor's
        #    data sheet, α as for the same class of link above --
        LinkPreset("nvlink2", "V100 NVLink 2 (SXM2, 6 links)", 150 * _GB, 2 * _US),
        LinkPreset("xgmi_mi250x", "MI250X Infinity Fabric (xGMI), 8 links", 400 * _GB, 2 * _US),
        LinkPreset("xgmi_mi300x", "MI300X/MI325X Infinity Fabric (xGMI), 7 links", 448 * _GB, 2 * _US),
        LinkPreset("xgmi_mi355x", "MI355X Infinity Fabric (xGMI), 7 links", 537.6 * _GB, 2 * _US),
        LinkPreset("pcie3", "PCIe Gen3 x16", 16 * _GB, 5 * _US),
        LinkPreset("ib_edr", "InfiniBand EDR, one 100 Gb/s NIC", 12.5 * _GB, 5 * _US),
        LinkPreset("ib_xdr", "InfiniBand XDR, one 800 Gb/s NIC", 100 * _GB, 5 * _US),
        LinkPreset("roce200", "RoCE, one 200 GbE NIC", 25 * _GB, 5 * _US),
        LinkPreset("slingshot11", "HPE Slingshot 11, one 200 Gb/s Cassini NIC", 25 * _GB, 5 * _US),
        LinkPreset("efa_100", "AWS EFA, one 100 Gb/s network card (p5: 32 per instance)", 12.5 * _GB, 5 * _US),
        LinkPreset("loopback_gloo", "gloo over TCP loopback, one host (CPU)", 2.5 * _GB, 100 * _US),
    )
}
"""Presets: nominal per-direction bandwidth (B/s) and α (s); effective β = nominal × efficiency
(0.8 → e.g. nvlink4 360 GB/s). Vendors quote bidirectional sums and network rates in bits; the
values here are per direction, in bytes (reference, "Units"). Sources of the added rows:

- nvlink2: NVIDIA Tesla V100 data sheet, "NVLink 300 GB/s" (6 links, bidirectional) → 150 GB/s.
- nvlink3 / nvlink4 / nvlink5: NVIDIA A100 (600 GB/s), H100 / H200 SXM (900 GB/s) and B200 / B300 /
  GB200 (1.8 TB/s) data sheets, bidirectional per GPU → 300 / 450 / 900 GB/s.
- xgmi_mi250x: AMD Instinct MI250X data sheet, 8 Infinity Fabric links, "up to 800 GB/s" peak
  aggregate (bidirectional) → 400 GB/s; xgmi_mi300x: MI300X and MI325X data sheets, 7 links of
  128 GB/s, 896 GB/s aggregate → 448 GB/s; xgmi_mi355x: MI355X data sheet, 7 links of 153.6 GB/s,
  1,075 GB/s aggregate → 537.6 GB/s. xGMI is a mesh, not a switch: the aggregate is what RCCL's
  rings reach using every link at once; one peer alone gets one link (64 / 76.8 GB/s).
- pcie3 / pcie4 / pcie5: PCI-SIG base specifications 3.0 / 4.0 / 5.0, 8 / 16 / 32 GT/s × 16 lanes
  (≈ 15.75 / 31.5 / 63 GB/s each way after encoding), rounded to 16 / 32 / 64 GB/s as the reference
  rounds Gen4 and Gen5.
- ib_edr / ib_hdr / ib_ndr / ib_xdr: NVIDIA ConnectX-5 (100 Gb/s), ConnectX-6 (200), ConnectX-7
  (400) and ConnectX-8 SuperNIC (800 Gb/s) data sheets, per port per direction → 12.5 / 25 / 50 /
  100 GB/s; roce200 / roce400: the same NICs in Ethernet mode (200 / 400 GbE).
- slingshot11: HPE Slingshot 11 (Cassini NIC) data sheet, 200 Gb/s per port → 25 GB/s.
- efa_100: AWS EC2 P5 instance specifications, 3,200 Gb/s of EFA as 32 network cards → 100 Gb/s
  = 12.5 GB/s each; α as for the other RDMA NICs above.
- loopback_gloo: no data sheet: gloo's TCP transport over the loopback device between processes of
  one CPU host. Set from this project's own `collect sweep` on a 2-core machine
  (fixtures/sweep_2rank, ok fits): all_reduce α ≈ 111 µs per step, β ≈ 2.2 GB/s; reduce_scatter
  204 µs, 1.1 GB/s — so α 100 µs and an effective 2 GB/s (nominal 2.5). A rough reference only (no
  degraded-link warning is raised against it): fit a sweep for anything quantitative.
"""

DEVICE_PRESETS: tuple[tuple[str, str, str], ...] = (
    # (regex searched in the device name as traces spell it, case-insensitive, intra-node preset,
    #  typical inter-node NIC preset of such systems). First match wins: PCIe cards before SXM.
    (r"V100.*PCIE", "pcie3", "ib_edr"),
    (r"V100", "nvlink2", "ib_edr"),  # "Tesla V100-SXM2-32GB"
    (r"A100.*PCIE", "pcie4", "ib_hdr"),
    (r"A100", "nvlink3", "ib_hdr"),  # "NVIDIA A100-SXM4-80GB", "A100-SXM4-40GB", "NVIDIA A100-PG509-200"
    (r"A800", "nvlink3", "ib_hdr"),
    (r"H100.*PCIE", "pcie5", "ib_ndr"),
    (r"H100|H200|H800|H20\b|GH200", "nvlink4", "ib_ndr"),  # "NVIDIA H100 80GB HBM3"
    (r"B200|B300|GB200|GB300", "nvlink5", "ib_xdr"),  # "NVIDIA B200"
    (r"MI250|MI210", "xgmi_mi250x", "roce200"),  # "AMD Instinct MI250X / MI250"
    (r"MI300|MI325", "xgmi_mi300x", "roce400"),  # "AMD Instinct MI300X"
    (r"MI355|MI350", "xgmi_mi355x", "roce400"),
)
"""Device name → (intra-node preset, typical NIC preset) by the first matching pattern.
The NIC column is a guess about the system (DGX/HGX defaults: ConnectX-5 with V100, -6 with A100,
-7 with H100/H200, -8 with B200/GB200; RoCE on MI systems), used only for groups that span hosts
and always reported as an assumption."""


def device_presets(device_name: str | None) -> tuple[str, str] | None:
    """(intra-node preset, typical inter-node NIC preset) for a device name, or None if unknown.

    ``device_presets('Tesla V100-SXM2-32GB')`` → ('nvlink2', 'ib_edr'). Matching is by
    :data:`DEVICE_PRESETS` (regex search, case-insensitive, first match). A CPU-only run
    (device None) has no GPU preset: see ``loopback_gloo``.
    """
    import re

    if not device_name:
        return None
    for pattern, intra, nic in DEVICE_PRESETS:
        if re.search(pattern, str(device_name), re.I):
            return intra, nic
    return None


def presets_for_device(device_name: str | None, backend: str | None = None, hosts: int = 1) -> list[str]:
    """The presets that describe a run's links: the device's intra-node preset, and its systems'
    typical NIC when the ranks span several hosts (:func:`device_presets`); [] for an unknown
    device (``backend`` is accepted for callers that know it; the device decides)."""
    got = device_presets(device_name)
    if got is None:
        return []
    intra, nic = got
    return [intra] + ([nic] if hosts > 1 and nic else [])


def network_link(name: str, nics_per_node: int | None = None, gpus_per_node: int | None = None,
                 efficiency: float = DEFAULT_EFFICIENCY) -> Link:
    """The inter-node preset ``name`` as seen by one GPU when G GPUs of a node share ``nics_per_node`` NICs.

    β per GPU = NIC β × min(nics, G) / G (all G GPUs send across nodes at once, each gets its share
    of the node's NICs); α unchanged. ``nics_per_node`` None (or >= G) is the reference's
    assumption, one NIC per GPU. Raises BadInputError for an unknown preset or counts < 1.
    """
    link = link_from_preset(name, efficiency=efficiency)
    if nics_per_node is None:
        return link
    for label, v in (("--nics-per-node", nics_per_node), ("--gpus-per-node", gpus_per_node)):
        if v is None or isinstance(v, bool) or int(v) != v or int(v) < 1:
            raise BadInputError(f"bad {label} {v!r}: expected an integer >= 1")
    nics, g = int(nics_per_node), int(gpus_per_node)
    share = min(nics, g) / g
    if share >= 1:
        return link
    return Link(
        name=f"{link.name} ({nics} NIC{'s' if nics > 1 else ''}/{g} GPUs)",
        alpha_s=link.alpha_s,
        beta_Bps=link.beta_Bps * share,
        nominal_Bps=link.nominal_Bps * share,
        efficiency=link.efficiency,
        description=f"{link.description}, shared by {g} GPUs over {nics} NIC(s)",
    )


def _check_alpha(alpha_s: float) -> float:
    a = float(alpha_s)
    if not math.isfinite(a) or a < 0:
        raise BadInputError(f"bad α {alpha_s!r}: the per-message latency must be a finite number of seconds >= 0")
    return a


def _check_beta(beta_Bps: float) -> float:
    b = float(beta_Bps)
    if not math.isfinite(b) or b <= 0:
        raise BadInputError(f"bad β {beta_Bps!r}: the bandwidth must be a finite number of bytes/s > 0")
    return b


def _check_efficiency(efficiency: float) -> float:
    e = float(efficiency)
    if not math.isfinite(e) or not 0 < e <= 1:
        raise BadInputError(f"bad link efficiency {efficiency!r}: expected a fraction in (0, 1], e.g. 0.8")
    return e


def link_from_preset(name: str, efficiency: float = DEFAULT_EFFICIENCY) -> Link:
    """The preset link ``name`` (e.g. ``nvlink4``) with β = nominal × efficiency.

    ``link_from_preset('nvlink4')`` → α = 2e-6 s, β = 450e9 × 0.8 = 3.6e11 B/s.
    Names are matched case-insensitively, ``-`` read as ``_``.
    Raises BadInputError for an unknown name (listing the valid ones) or an
    efficiency outside (0, 1].
    """
    key = str(name).strip().lower().replace("-", "_")
    preset = LINK_PRESETS.get(key)
    if preset is None:
        raise BadInputError(f"unknown link {name!r}: expected one of {', '.join(LINK_PRESETS)}")
    eff = _check_efficiency(efficiency)
    return Link(
        name=preset.name,
        alpha_s=preset.alpha_s,
        beta_Bps=preset.nominal_Bps * eff,
        nominal_Bps=preset.nominal_Bps,
        efficiency=eff,
        description=preset.description,
    )


def custom_link(alpha_s: float, beta_Bps: float, name: str = "custom") -> Link:
    """A link from a measured or assumed α (seconds) and effective β (bytes/s).

    β is taken as already effective: nominal_Bps = beta_Bps, efficiency = 1.
    Raises BadInputError for α < 0, β <= 0 or non-finite values.
    """
    a = _check_alpha(alpha_s)
    b = _check_beta(beta_Bps)
    return Link(name=name, alpha_s=a, beta_Bps=b, nominal_Bps=b, efficiency=1.0, description="custom α/β")


def message_time(size_bytes: float, link: Link) -> float:
    """Time of one message: T(n) = α + n/β  (Hockney's model; reference, "One message").

    size_bytes: n, bytes (>= 0). Returns seconds. Raises BadInputError for n < 0.
    """
    n = _check_size(size_bytes)
    return link.alpha_s + n / link.beta_Bps


def n_half(link: Link) -> float:
    """Half-bandwidth message size n½ = α·β, bytes (nvlink4: 2 µs × 360 GB/s = 720 KB)."""
    return link.n_half_bytes


def achieved_fraction(size_bytes: float, link: Link) -> float:
    """Fraction of β one message of n bytes achieves: (n/T(n))/β = n / (n + α·β).

    Unitless in [0, 1); 0 for n = 0; 1 for a link with α = 0 and n > 0.
    Raises BadInputError for n < 0.
    """
    n = _check_size(size_bytes)
    denom = n + link.n_half_bytes
    return 0.0 if denom == 0 else n / denom


def _check_size(size_bytes: float) -> float:
    try:
        n = float(size_bytes)
    except (TypeError, ValueError):
        raise BadInputError(f"bad size {size_bytes!r}: expected a number of bytes") from None
    if math.isnan(n) or math.isinf(n):
        raise BadInputError(f"bad size {size_bytes!r}: expected a finite number of bytes")
    if n < 0:
        raise BadInputError(f"bad size {size_bytes!r}: a size in bytes cannot be negative")
    return n
