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
        LinkPreset("nvlink4", "H100 NVLink 4 via NVSwitch", 450 * _GB, 2 * _US),
        LinkPreset("nvlink5", "B200 NVLink 5", 900 * _GB, 2 * _US),
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
    )
}
"""The reference's presets: nominal per-direction bandwidth (B/s) and α (s).
Effective β = nominal × efficiency (0.8 → e.g. nvlink4 360 GB/s)."""


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
