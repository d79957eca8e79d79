"""The machine description (tracekit.model.machine): presets, the TOML machine file, errors."""

import pytest

from tracekit.errors import BadInputError, FileError
from tracekit.model.machine import (
    MACHINE_PRESETS,
    Machine,
    load_machine_file,
    machine_preset,
    make_machine,
    resolve_machine,
)


def test_presets():
    assert set(MACHINE_PRESETS) == {"dgx-h100", "dgx-a100", "p5.48xlarge", "gh200-slingshot", "mi300x-oam"}
    h = machine_preset("DGX_H100")
    assert (h.gpus_per_node, h.link_in, h.nic, h.nics_per_node, h.nvls) == (8, "nvlink4", "ib_ndr", 8, True)
    assert h.intra_link.beta_Bps == pytest.approx(360e9) and h.nic_link.beta_Bps == pytest.approx(40e9)
    assert "DGX H100 data sheet" in h.source("nics_per_node")
    a = machine_preset("dgx-a100")
    assert (a.link_in, a.nic, a.arch, a.cpu, a.nvls) == ("nvlink3", "ib_hdr", "ampere", "amd", False)
    p5 = machine_preset("p5.48xlarge")
    # 32 × 100 Gb/s = 3,200 Gb/s of EFA: 32 × 12.5 GB/s nominal
    assert p5.nics_per_node * p5.nic_link.nominal_Bps == pytest.approx(400e9)
    g = machine_preset("gh200-slingshot")
    assert (g.gpus_per_node, g.nic, g.nics_per_node, g.nvswitch, g.cpu) == (4, "slingshot11", 4, False, "arm")
    assert machine_preset("mi300x-oam").link_in == "xgmi_mi300x"
    assert "dgx-h100" in h.describe() and "NVLS" in h.describe()
    with pytest.raises(BadInputError, match="unknown machine 'dgx-z'"):
        machine_preset("dgx-z")


def test_constructor_and_sources():
    m = make_machine(4, "nvlink4", nic="slingshot11", nodes=2, source="nccl-tests log")
    assert m.nics_per_node == 4 and m.source("nics_per_node") == "assumed: one NIC per GPU"
    assert m.source("nodes") == "nccl-tests log" and m.source("gpu") == "default"
    assert m.with_nodes(16, "hosts").nodes == 16
    assert m.to_dict()["sources"]["link_in"] == "nccl-tests log"
    with pytest.raises(BadInputError, match="unknown link_in 'nvlink9'"):
        Machine(name="x", gpus_per_node=8, link_in="nvlink9")
    with pytest.raises(BadInputError, match="gpus_per_node 0"):
        Machine(name="x", gpus_per_node=0, link_in="nvlink4")
    with pytest.raises(BadInputError, match="needs nics_per_node"):
        Machine(name="x", gpus_per_node=8, link_in="nvlink4", nic="ib_ndr")


def test_machine_file(tmp_path):
    f = tmp_path / "cluster.toml"
    f.write_text(
        'preset = "dgx-h100"\nnodes = 4\nnics = 4\n\n'
        '[[hosts]]\nnames = ["old-*"]\npreset = "dgx-a100"\n\n'
        '[[hosts]]\nnames = "amd01"\ngpus = 8\nxgmi = "mi300x"\nnic = "roce400"\narch = "cdna"\ncpu = "amd"\n'
    )
    mf = load_machine_file(f)
    d = mf.default
    assert (d.nodes, d.nics_per_node, d.nic, d.link_in) == (4, 4, "ib_ndr", "nvlink4")
    assert d.source("nics_per_node") == "machine file cluster.toml"
    assert d.source("nic").startswith("preset dgx-h100")
    assert mf.for_host("old-7").link_in == "nvlink3"
    amd = mf.for_host("amd01")
    assert (amd.link_in, amd.nic, amd.nics_per_node, amd.nodes) == ("xgmi_mi300x", "roce400", 4, 4)
    assert mf.for_host("new-1") is d
    assert resolve_machine(str(f)) == d
    g = tmp_path / "g.toml"
    g.write_text('gpus_per_node = 4\nnvlink = 4\nnic = "slingshot11"\n')
    m = resolve_machine(str(g))
    assert (m.link_in, m.nics_per_node, m.source("nics_per_node")) == ("nvlink4", 4, "assumed: one NIC per GPU")


@pytest.mark.parametrize(
    "text, message",
    [
        ('gpus = "eight"\nlink = "nvlink4"\n', "key 'gpus': expected an integer >= 1"),
        ('gpus = 8\nnvlink = 7\n', "key 'nvlink': expected an NVLink generation"),
        ('preset = "dgx-h100"\nnic = "ib_qdr9"\n', "key 'nic': unknown link preset"),
        ('preset = "dgx-h100"\ncolor = "green"\n', "key 'color': unknown key"),
        ('preset = "dgx-zz"\n', "key 'preset': unknown machine"),
        ('gpus = 8\n', "lacks link_in"),
        ('preset = "dgx-h100"\n[[hosts]]\ngpus = 4\n', "key 'hosts[0].names'"),
        ('preset = "dgx-h100"\n[[hosts]]\nnames = ["a"]\nnvls = "yes"\n', "key 'hosts[0].nvls': expected true or false"),
        ('gpus = [\n', "not valid TOML"),
    ],
)
def test_machine_file_errors(tmp_path, text, message):
    f = tmp_path / "m.toml"
    f.write_text(text)
    with pytest.raises(FileError, match="m.toml") as e:
        load_machine_file(f)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_resolve_machine_errors(tmp_path):
    with pytest.raises(BadInputError, match="neither a preset"):
        resolve_machine(str(tmp_path / "missing.toml"))
    f = tmp_path / "groups.toml"
    f.write_text('[[hosts]]\nnames = ["a"]\npreset = "dgx-h100"\n')
    with pytest.raises(FileError, match="only \\[\\[hosts\\]\\] groups"):
        resolve_machine(str(f))


def test_machine_for_device():
    from tracekit.model.machine import machine_for_device

    h = machine_for_device("NVIDIA H100 80GB HBM3", 8)
    assert (h.link_in, h.nic, h.nics_per_node, h.nvls, h.arch) == ("nvlink4", "ib_ndr", 8, True, "hopper")
    assert h.source("nic").startswith("assumed") and h.source("link_in") == "device NVIDIA H100 80GB HBM3"
    g = machine_for_device("NVIDIA GH200 480GB", 4, nics_per_node=4)
    assert g.nvls is False and g.nics_per_node == 4  # NVLink without NVSwitch: no NVLS
    v = machine_for_device("Tesla V100-SXM2-32GB", 8)
    assert (v.link_in, v.arch, v.nvls) == ("nvlink2", "volta", False)
    assert machine_for_device("Mystery GPU", 8) is None and machine_for_device(None, 8) is None
