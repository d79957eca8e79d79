"""The machine a collective ran on: nodes, GPUs per node, intra-node link, NICs.

A :class:`Machine` is what the NCCL tuning model (:mod:`tracekit.model.nccl_tuning`)
and the multi-node comparators need to know about the hardware, nothing more.
It is built three ways, and every fact records where it came from
(:meth:`Machine.source`):

- a named preset, :data:`MACHINE_PRESETS` / :func:`machine_preset`
  (``dgx-h100``, ``dgx-a100``, ``p5.48xlarge``, ``gh200-slingshot``, ``mi300x-oam``);
- a TOML machine file, :func:`load_machine_file` (``--machine FILE``);
- the constructor (or :func:`make_machine`), by code that infers the machine from its inputs.

Links are names of :data:`tracekit.model.links.LINK_PRESETS` (β per GPU per direction; effective
= nominal × efficiency). Vendor figures behind each preset are cited in :data:`MACHINE_PRESETS`.

TOML file (all keys optional except that the result needs ``gpus_per_node`` and ``link_in``,
which a ``preset`` provides)::

    preset = "dgx-h100"          # start from a preset; the keys below override it
    name = "my-cluster"
    nodes = 4                    # hosts
    gpus_per_node = 8            # alias: gpus
    gpu = "H100 SXM5"
    link_in = "nvlink4"          # or nvlink = 4 (2..5), or xgmi = "mi300x" (mi250x, mi300x, mi355x)
    nic = "ib_ndr"               # a network link preset
    nics_per_node = 8            # alias: nics
    nvls = true                  # NVSwitch with NVLink SHARP (NCCL's NVLS algorithms)
    collnet = false              # in-network reduction over the NICs (IB SHARP: NCCL's CollNet)
    channels = 16                # NCCL channels (see Machine.channels)
    arch = "hopper"              # volta, ampere, hopper, blackwell, cdna
    cpu = "intel"                # intel, amd, arm

    [[hosts]]                    # host groups that differ from the above
    names = ["gpu-a*", "gpu-b01"]   # host names or fnmatch patterns
    preset = "dgx-a100"          # ... same keys as the top level

Errors: :class:`tracekit.errors.FileError`, one line naming the file and the key.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from tracekit.errors import BadInputError, FileError
from tracekit.model.links import LINK_PRESETS, Link, link_from_preset, DEFAULT_EFFICIENCY

__all__ = [
    "Machine",
    "MachineFile",
    "MACHINE_PRESETS",
    "ARCHES",
    "CPU_VENDORS",
    "machine_preset",
    "make_machine",
    "load_machine_file",
    "resolve_machine",
    "machine_for_device",
]

ARCHES = ("volta", "ampere", "hopper", "blackwell", "cdna")
"""GPU architecture families the NCCL tables distinguish (volta / ampere / hopper rows; blackwell and
AMD cdna use the hopper and ampere rows, an approximation stated in nccl_tuning)."""

CPU_VENDORS = ("intel", "amd", "arm")
"""Host CPU vendors: NCCL's network post overhead and its multi-node LL bandwidth cap depend on it."""

_NVLINK_GEN = {2: "nvlink2", 3: "nvlink3", 4: "nvlink4", 5: "nvlink5"}
_XGMI = {"mi250x": "xgmi_mi250x", "mi300x": "xgmi_mi300x", "mi355x": "xgmi_mi355x"}


@dataclass(frozen=True)
class Machine:
    """One homogeneous set of nodes.

    name: preset name, file name or a label; nodes: hosts (None: not known, e.g. a preset, which
    describes one node); gpus_per_node: GPUs per host; gpu: GPU model as a vendor names it;
    link_in: intra-node link preset (e.g. ``nvlink4``); nic: inter-node NIC preset (e.g.
    ``ib_ndr``, None for a machine with no network); nics_per_node: NICs per host used for
    collectives (0 with no ``nic``); nvls: NVSwitch with NVLink SHARP (NCCL's NVLS / NVLS-tree);
    collnet: in-network reduction over the NICs (InfiniBand SHARP, NCCL's CollNet); nvswitch:
    GPUs meet at a switch rather than a mesh (NCCL's CollNet-direct needs it); arch: one of
    :data:`ARCHES`; cpu: one of :data:`CPU_VENDORS`; channels: NCCL channels (parallel rings /
    trees) a collective uses — NCCL's topology search picks it at run time (logged as ``NCCL INFO
    ... N coll channels``); the presets give a typical value and only the per-channel bandwidth
    caps of NCCL's model depend on it; efficiency: effective / nominal bandwidth of the link
    presets (0.8 by default, reference "Units"); sources: (field, where the value came from)
    pairs, read with :meth:`source`.

    Raises BadInputError (from ``__post_init__``) for counts < 1, an unknown link preset, arch or
    CPU vendor.
    """

    name: str
    gpus_per_node: int
    link_in: str
    nic: str | None = None
    nics_per_node: int = 0
    nodes: int | None = None
    gpu: str = ""
    nvls: bool = False
    collnet: bool = False
    nvswitch: bool = False
    arch: str = "hopper"
    cpu: str = "intel"
    channels: int = 16
    efficiency: float = DEFAULT_EFFICIENCY
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for label, v, low in (("gpus_per_node", self.gpus_per_node, 1), ("channels", self.channels, 1),
                              ("nics_per_node", self.nics_per_node, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise BadInputError(f"machine {self.name!r}: bad {label} {v!r}: expected an integer >= {low}")
        if self.nodes is not None and (isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1):
            raise BadInputError(f"machine {self.name!r}: bad nodes {self.nodes!r}: expected an integer >= 1")
        for label, v in (("link_in", self.link_in), ("nic", self.nic)):
            if v is not None and _preset_key(v) not in LINK_PRESETS:
                raise BadInputError(
                    f"machine {self.name!r}: unknown {label} {v!r}: expected one of {', '.join(LINK_PRESETS)}")
        if self.nic is None and self.nics_per_node:
            raise BadInputError(f"machine {self.name!r}: nics_per_node {self.nics_per_node} without a nic preset")
        if self.nic is not None and self.nics_per_node < 1:
            raise BadInputError(f"machine {self.name!r}: nic {self.nic!r} needs nics_per_node >= 1")
        if self.arch not in ARCHES:
            raise BadInputError(f"machine {self.name!r}: unknown arch {self.arch!r}: expected one of {', '.join(ARCHES)}")
        if self.cpu not in CPU_VENDORS:
            raise BadInputError(f"machine {self.name!r}: unknown cpu {self.cpu!r}: expected one of {', '.join(CPU_VENDORS)}")
        object.__setattr__(self, "link_in", _preset_key(self.link_in))
        if self.nic is not None:
            object.__setattr__(self, "nic", _preset_key(self.nic))

    def source(self, fact: str) -> str:
        """Where ``fact`` (a field name) came from, e.g. ``'preset dgx-h100'``; ``'default'`` if not recorded."""
        for f, s in self.sources:
            if f == fact:
                return s
        return "default"

    @property
    def intra_link(self) -> Link:
        """The intra-node :class:`Link` (β per GPU per direction, effective)."""
        return link_from_preset(self.link_in, efficiency=self.efficiency)

    @property
    def nic_link(self) -> Link | None:
        """One NIC as a :class:`Link` (β of one NIC per direction, effective), None without a network."""
        return None if self.nic is None else link_from_preset(self.nic, efficiency=self.efficiency)

    @property
    def intra_is_nvlink(self) -> bool:
        """True when GPUs of a node talk over NVLink or xGMI (NCCL's NVLink latency row), False for PCIe."""
        return self.link_in.startswith(("nvlink", "xgmi"))

    def with_nodes(self, nodes: int, source: str = "given") -> Machine:
        """This machine with ``nodes`` hosts (the source of ``nodes`` set to ``source``)."""
        return replace(self, nodes=nodes, sources=_set_source(self.sources, "nodes", source))

    def describe(self) -> str:
        """One line: ``dgx-h100: 8 × H100 SXM5 per node over nvlink4, 8 × ib_ndr NICs, NVLS``."""
        nodes = f"{self.nodes} nodes × " if self.nodes else ""
        net = f"{self.nics_per_node} × {self.nic} NICs" if self.nic else "no network"
        extras = [w for w, on in (("NVLS", self.nvls), ("CollNet", self.collnet)) if on]
        gpu = f" {self.gpu}" if self.gpu else " GPUs"
        return f"{self.name}: {nodes}{self.gpus_per_node} ×{gpu} per node over {self.link_in}, {net}" + (
            ", " + ", ".join(extras) if extras else "")

    def to_dict(self) -> dict:
        """Snake-case dict of the facts and ``sources`` as {field: source}."""
        d = {f: getattr(self, f) for f in ("name", "nodes", "gpus_per_node", "gpu", "link_in", "nic",
                                           "nics_per_node", "nvls", "collnet", "nvswitch", "arch", "cpu",
                                           "channels", "efficiency")}
        d["sources"] = dict(self.sources)
        return d


def _preset_key(name: str) -> str:
    return str(name).strip().lower().replace("-", "_")


def _set_source(sources: tuple[tuple[str, str], ...], fact: str, source: str) -> tuple[tuple[str, str], ...]:
    return tuple((f, s) for f, s in sources if f != fact) + ((fact, source),)


def _preset(name: str, cite: str, **facts: Any) -> Machine:
    src = f"preset {name} ({cite})"
    return Machine(name=name, sources=tuple((k, src) for k in facts), **facts)


MACHINE_PRESETS: dict[str, Machine] = {
    m.name: m
    for m in (
        # NVIDIA DGX H100 data sheet / user guide: 8 × H100 SXM5 80 GB, 4 × third-generation NVSwitch
        # (900 GB/s NVLink per GPU, NVLink SHARP), 8 × ConnectX-7 single-port 400 Gb/s InfiniBand for
        # the compute fabric, 2 × Intel Xeon Platinum 8480C.
        _preset("dgx-h100", "NVIDIA DGX H100 data sheet", gpus_per_node=8, gpu="H100 SXM5", link_in="nvlink4",
                nic="ib_ndr", nics_per_node=8, nvls=True, nvswitch=True, arch="hopper", cpu="intel", channels=16),
        # NVIDIA DGX A100 data sheet: 8 × A100 SXM4, 6 × second-generation NVSwitch (600 GB/s NVLink per
        # GPU; no NVLink SHARP), 8 × ConnectX-6 200 Gb/s HDR InfiniBand (compute), 2 × AMD EPYC 7742.
        _preset("dgx-a100", "NVIDIA DGX A100 data sheet", gpus_per_node=8, gpu="A100 SXM4", link_in="nvlink3",
                nic="ib_hdr", nics_per_node=8, nvls=False, nvswitch=True, arch="ampere", cpu="amd", channels=16),
        # AWS EC2 P5 instance page: p5.48xlarge = 8 × H100 80 GB with NVSwitch (900 GB/s NVLink per
        # GPU), 3,200 Gb/s of EFA networking as 32 network cards of 100 Gb/s, 3rd-gen AMD EPYC. EFA is
        # not InfiniBand: NCCL runs over it through the aws-ofi-nccl plugin. NVLS is left off: it needs
        # the NVSwitch fabric manager's multicast support, which the instance page does not state.
        _preset("p5.48xlarge", "AWS EC2 P5 instance specifications", gpus_per_node=8, gpu="H100 SXM",
                link_in="nvlink4", nic="efa_100", nics_per_node=32, nvls=False, nvswitch=True, arch="hopper",
                cpu="amd", channels=16),
        # HPE Cray EX254n blade (as in CSCS Alps): 4 × NVIDIA GH200 per node, the four Hoppers joined
        # all-to-all by NVLink 4 (18 links per GPU, no NVSwitch), one Slingshot 11 200 Gb/s Cassini NIC
        # per GH200, Grace (Arm) CPUs. HPE EX254n data sheet; NVIDIA GH200 data sheet (900 GB/s NVLink).
        _preset("gh200-slingshot", "HPE Cray EX254n data sheet; NVIDIA GH200 data sheet", gpus_per_node=4,
                gpu="GH200", link_in="nvlink4", nic="slingshot11", nics_per_node=4, nvls=False, nvswitch=False,
                arch="hopper", cpu="arm", channels=16),
        # AMD Instinct MI300X platform data sheet: 8 × MI300X OAM on one UBB, fully connected by
        # Infinity Fabric (xGMI, 896 GB/s aggregate per GPU), no switch. The NICs are not part of the
        # platform: 8 × 400 GbE RoCE (one per GPU) is what the OEM systems built on it ship (e.g. Dell
        # PowerEdge XE9680 MI300X configuration), stated as an assumption. RCCL, not NCCL, runs here.
        _preset("mi300x-oam", "AMD Instinct MI300X platform data sheet; NICs as OEM systems ship them",
                gpus_per_node=8, gpu="MI300X", link_in="xgmi_mi300x", nic="roce400", nics_per_node=8, nvls=False,
                nvswitch=False, arch="cdna", cpu="amd", channels=16),
    )
}
"""Named machines (one node each; ``nodes`` None). Vendor sources in the comments beside each
entry; each Machine's :meth:`~Machine.source` names its preset and data sheet."""


def machine_preset(name: str) -> Machine:
    """The preset ``name`` (case-insensitive, ``_`` read as ``-``), e.g. ``machine_preset('dgx-h100')``.

    Raises BadInputError naming the valid presets for an unknown name.
    """
    key = str(name).strip().lower().replace("_", "-")
    m = MACHINE_PRESETS.get(key)
    if m is None:
        raise BadInputError(f"unknown machine {name!r}: expected one of {', '.join(MACHINE_PRESETS)} or a TOML file")
    return m


def make_machine(gpus_per_node: int, link_in: str, nic: str | None = None, nics_per_node: int | None = None,
                 nodes: int | None = None, source: str = "given", name: str = "custom", **facts: Any) -> Machine:
    """A Machine from the facts one knows, every given fact attributed to ``source``.

    ``nics_per_node`` None with a ``nic``: one NIC per GPU (the reference's assumption, attributed to
    ``'assumed: one NIC per GPU'``). Other keyword facts as :class:`Machine`. Raises BadInputError as
    Machine does.
    """
    sources = [("gpus_per_node", source), ("link_in", source)]
    if nodes is not None:
        sources.append(("nodes", source))
    if nic is not None:
        sources.append(("nic", source))
        if nics_per_node is None:
            nics_per_node = gpus_per_node
            sources.append(("nics_per_node", "assumed: one NIC per GPU"))
        else:
            sources.append(("nics_per_node", source))
    sources += [(k, source) for k in facts]
    return Machine(name=name, gpus_per_node=gpus_per_node, link_in=link_in, nic=nic,
                   nics_per_node=int(nics_per_node or 0), nodes=nodes, sources=tuple(sources), **facts)


# -- the TOML machine file -----------------------------------------------------------------------

_INT_KEYS = {"nodes": 1, "gpus_per_node": 1, "nics_per_node": 0, "channels": 1}
_STR_KEYS = ("name", "gpu", "link_in", "nic", "arch", "cpu")
_BOOL_KEYS = ("nvls", "collnet", "nvswitch")
_ALIASES = {"gpus": "gpus_per_node", "nics": "nics_per_node", "link": "link_in"}
_KNOWN = set(_INT_KEYS) | set(_STR_KEYS) | set(_BOOL_KEYS) | set(_ALIASES) | {"preset", "nvlink", "xgmi", "efficiency"}


@dataclass(frozen=True)
class MachineFile:
    """A parsed machine file: ``default`` for every host, ``groups`` ((names, Machine), ...) for
    hosts that differ; :meth:`for_host` picks one. ``path`` is the file."""

    path: str
    default: Machine | None
    groups: tuple[tuple[tuple[str, ...], Machine], ...] = ()

    def for_host(self, host: str | None) -> Machine | None:
        """The Machine of host ``host`` (first group whose name or fnmatch pattern matches), else
        ``default`` (None when the file describes only groups and none matches)."""
        if host:
            for names, m in self.groups:
                if any(fnmatch.fnmatchcase(host, pat) for pat in names):
                    return m
        return self.default


def _machine_from_table(path: str, table: Mapping[str, Any], where: str, base: Machine | None) -> Machine | None:
    """One Machine from one TOML table (``where``: the key prefix for errors, e.g. ``hosts[1].``)."""
    src = f"machine file {os.path.basename(path)}"

    def bad(key: str, what: str) -> FileError:
        return FileError(path, f"key '{where}{key}': {what}")

    for key in table:
        if key not in _KNOWN and key != "names":
            raise bad(key, f"unknown key: expected one of {', '.join(sorted(_KNOWN))}")
    facts: dict[str, Any] = {}
    sources: dict[str, str] = dict(base.sources) if base is not None else {}
    if "preset" in table:
        if not isinstance(table["preset"], str):
            raise bad("preset", f"expected a preset name, got {table['preset']!r}")
        try:
            p = machine_preset(table["preset"])
        except BadInputError as e:
            raise bad("preset", str(e)) from None
        facts.update({f: getattr(p, f) for f in ("name", "gpus_per_node", "link_in", "nic", "nics_per_node", "gpu",
                                                 "nvls", "collnet", "nvswitch", "arch", "cpu", "channels")})
        sources.update(dict(p.sources))
    elif base is not None:
        facts.update({f: getattr(base, f) for f in ("name", "nodes", "gpus_per_node", "link_in", "nic", "nics_per_node",
                                                    "gpu", "nvls", "collnet", "nvswitch", "arch", "cpu", "channels",
                                                    "efficiency")})
    for raw, value in table.items():
        if raw in ("preset", "names"):
            continue
        key = _ALIASES.get(raw, raw)
        if key in _INT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < _INT_KEYS[key]:
                raise bad(raw, f"expected an integer >= {_INT_KEYS[key]}, got {value!r}")
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise bad(raw, f"expected true or false, got {value!r}")
        elif key == "efficiency":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise bad(raw, f"expected a fraction in (0, 1], got {value!r}")
            value = float(value)
        elif key == "nvlink":
            if value not in _NVLINK_GEN:
                raise bad(raw, f"expected an NVLink generation 2, 3, 4 or 5, got {value!r}")
            key, value = "link_in", _NVLINK_GEN[value]
        elif key == "xgmi":
            v = str(value).strip().lower()
            if v not in _XGMI:
                raise bad(raw, f"expected one of {', '.join(_XGMI)}, got {value!r}")
            key, value = "link_in", _XGMI[v]
        else:  # strings
            if not isinstance(value, str) or not value.strip():
                raise bad(raw, f"expected a name, got {value!r}")
            if key in ("link_in", "nic") and _preset_key(value) not in LINK_PRESETS:
                raise bad(raw, f"unknown link preset {value!r}: expected one of {', '.join(LINK_PRESETS)}")
            if key == "arch" and value not in ARCHES:
                raise bad(raw, f"expected one of {', '.join(ARCHES)}, got {value!r}")
            if key == "cpu" and value not in CPU_VENDORS:
                raise bad(raw, f"expected one of {', '.join(CPU_VENDORS)}, got {value!r}")
        facts[key] = value
        sources[key] = src
    if "nic" in facts and facts["nic"] is not None and not facts.get("nics_per_node"):
        if "gpus_per_node" in facts:
            facts["nics_per_node"] = facts["gpus_per_node"]
            sources["nics_per_node"] = "assumed: one NIC per GPU"
    missing = [k for k in ("gpus_per_node", "link_in") if k not in facts]
    if missing:
        if not table:
            return None
        raise FileError(path, f"table '{where or 'top level'}' lacks {' and '.join(missing)} (give them or a preset)")
    facts.setdefault("name", os.path.basename(path))
    try:
        return Machine(sources=tuple(sources.items()), **facts)
    except BadInputError as e:
        raise FileError(path, f"table '{where or 'top level'}': {e}") from None


def load_machine_file(path: str | os.PathLike) -> MachineFile:
    """Read a TOML machine file (format in the module docstring) with :mod:`tomllib`.

    The top-level keys give ``default`` (None when the file holds only ``[[hosts]]`` groups);
    each ``[[hosts]]`` table starts from the top level (or its own ``preset``) and needs ``names``.
    Raises FileError naming the file and the key for an unreadable file, bad TOML, an unknown key,
    a bad value, or a table without GPUs per node and intra-node link.
    """
    import tomllib

    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise FileError(p, f"cannot read the machine file ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise FileError(p, f"not valid TOML: {e}") from None
    hosts = data.pop("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        raise FileError(p, "key 'hosts': expected [[hosts]] tables")
    default = _machine_from_table(p, data, "", None)
    groups = []
    for i, h in enumerate(hosts):
        names = h.get("names")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise FileError(p, f"key 'hosts[{i}].names': expected a list of host names or patterns")
        m = _machine_from_table(p, h, f"hosts[{i}].", default)
        assert m is not None  # a group always has names, so it is not empty
        groups.append((tuple(names), m))
    if default is None and not groups:
        raise FileError(p, "no machine described: give a preset, or gpus_per_node and link_in, or [[hosts]] tables")
    return MachineFile(path=p, default=default, groups=tuple(groups))


def resolve_machine(spec: str) -> Machine:
    """``--machine SPEC``: a preset name, else a TOML file path (its default machine).

    Raises BadInputError for a name that is neither a preset nor an existing file, FileError for a
    bad file, and BadInputError when the file describes only host groups.
    """
    key = str(spec).strip().lower().replace("_", "-")
    if key in MACHINE_PRESETS:
        return MACHINE_PRESETS[key]
    if not os.path.exists(spec):
        raise BadInputError(
            f"--machine {spec!r}: neither a preset ({', '.join(MACHINE_PRESETS)}) nor an existing TOML file")
    mf = load_machine_file(spec)
    if mf.default is None:
        raise FileError(spec, "describes only [[hosts]] groups: give top-level keys for a single machine")
    return mf.default


def machine_for_device(device_name: str | None, gpus_per_node: int, nics_per_node: int | None = None,
                       nodes: int | None = None) -> Machine | None:
    """The machine a trace's device name implies, when nothing better is known; None for an unknown device.

    Links from :func:`tracekit.model.links.device_presets` (intra-node preset, typical NIC of such
    systems); ``nics_per_node`` None: one NIC per GPU. NVLS assumed on nvlink4 / nvlink5 devices
    (HGX/DGX H100, H200, B200 NVSwitch systems) except GH200 (NVLink without NVSwitch); arch from
    the intra-node link; CPU taken as Intel. Every fact's source says ``device <name>`` or
    ``assumed``. Raises BadInputError for counts < 1.
    """
    from tracekit.model.links import device_presets

    got = device_presets(device_name)
    if got is None:
        return None
    intra, nic = got
    src = f"device {device_name}"
    nvls = intra in ("nvlink4", "nvlink5") and "GH200" not in str(device_name).upper()
    arch = {"nvlink2": "volta", "pcie3": "volta", "nvlink3": "ampere", "pcie4": "ampere",
            "nvlink5": "blackwell"}.get(intra, "cdna" if intra.startswith("xgmi") else "hopper")
    m = make_machine(gpus_per_node, intra, nic=nic, nics_per_node=nics_per_node, nodes=nodes, source=src,
                     name=str(device_name), gpu=str(device_name), nvls=nvls, nvswitch=intra.startswith("nvlink"),
                     arch=arch)
    assumed = {"nic": f"assumed: typical NIC of {device_name} systems", "nvls": "assumed from the device",
               "nvswitch": "assumed from the device", "arch": "assumed from the device"}
    return replace(m, sources=tuple((f, assumed.get(f, s)) for f, s in m.sources))
