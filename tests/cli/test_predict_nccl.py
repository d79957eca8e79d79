"""`tracekit predict ... --algo nccl|all` across nodes, --machine, and the flat ring over every NIC.

Hand values: nvlink4 β_in = 450 × 0.8 = 360 GB/s, α_in 2 µs; ib_ndr β_NIC = 50 × 0.8 = 40 GB/s,
α 5 µs. NCCL constants: src/graph/tuning.cc, NCCL 2.20.3 (see tests/model/test_nccl_tuning.py).
"""

import json

import pytest

from tracekit.cli import main

ACCEPT = ["all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8", "--link-in", "nvlink4",
          "--link-out", "ib_ndr", "--nics-per-node", "8", "--algo", "all"]


def run(capsys, *args):
    rc = main(["predict", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *args):
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_all_across_nodes_lists_ring_tree_nvls_hierarchical(capsys):
    data = run_json(capsys, *ACCEPT)
    rows = {p["algo"]: p for p in data["predictions"]}
    # α–β flat ring over 32 ranks, NCCL's rings over all 8 NICs: β = min(360, 8 × 40) = 320 GB/s
    # 2·31·5 µs + 2·31/32 · 1e9 / 3.2e11 s = 310 µs + 6.0546875 ms
    ring = rows["ring (flat)"]
    assert ring["time_s"] == pytest.approx(310e-6 + 6.0546875e-3)
    assert "all 8 NICs" in ring["assumption"]
    # α–β hierarchical: 2 × (7·2 µs + 7/8·1e9/3.6e11) + (2·3·5 µs + 2·3/4·1.25e8/4e10)
    h = rows["hierarchical"]
    assert h["time_s"] == pytest.approx(58e-6 + 2 * 0.875e9 / 3.6e11 + 4.6875e-3)
    # NCCL ring/Simple: (8.4 + 54 × 3.4 + 8 × 14) × 1.4 = 425.6 µs; algbw 320 × 32/62 GB/s
    assert rows["ring/Simple"]["time_s"] == pytest.approx(425.6e-6 + 1e9 / (320e9 * 32 / 62))
    # NCCL tree at its best protocol, Simple: 2 × (7 × 28 + 2 × 28) = 504 µs; 294.4 × 0.5 GB/s
    assert rows["tree/Simple"]["time_s"] == pytest.approx(504e-6 + 1e9 / 147.2e9)
    # NCCL NVLS-tree: 23 + 2 × 2 × 14 = 79 µs; min(360, 320/2) × 5/6 GB/s
    assert rows["nvls_tree/Simple"]["time_s"] == pytest.approx(79e-6 + 1e9 / (160e9 * 5 / 6))
    assert "halved" in rows["nvls_tree/Simple"]["assumption"]
    # NVLS proper needs CollNet across nodes: listed, not run
    assert rows["nvls"]["time_s"] is None and "CollNet" in rows["nvls"]["assumption"]
    assert data["nccl_pick"] == "ring/Simple"
    assert data["machine"]["sources"]["nvls"].startswith("assumed")
    rc, out, _ = run(capsys, *ACCEPT)
    assert rc == 0
    for word in ("ring (flat)", "hierarchical", "tree/Simple", "nvls_tree/Simple", "* ring/Simple", "6.365 ms"):
        assert word in out
    assert "use all 8 NICs" in out  # the assumptions are printed under the table


def test_flat_ring_one_nic_per_node(capsys):
    # one NIC per node: every network step of every ring crosses that NIC, β = 40 GB/s (not 40/8):
    # 310 µs + 2·31/32·1e9/4e10 s = 310 µs + 48.4375 ms
    data = run_json(capsys, "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8",
                    "--nics-per-node", "1", "--link", "ib_ndr")
    (p,) = data["predictions"]
    assert p["time_s"] == pytest.approx(310e-6 + 48.4375e-3)
    assert "one NIC per node" in data["ring_assumption"]
    rc, out, _ = run(capsys, "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8",
                     "--nics-per-node", "1", "--link", "ib_ndr")
    assert rc == 0 and "48.75 ms" in out and "one NIC per node" in out.replace("\n", " ")
    # all_to_all has no ring: each GPU keeps its 1/8 share of the NIC: 31·5 µs + 31/32·1e9/5e9 s
    data = run_json(capsys, "all_to_all", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8",
                    "--nics-per-node", "1", "--link", "ib_ndr")
    (p,) = data["predictions"]
    assert p["time_s"] == pytest.approx(155e-6 + 31 / 32 * 1e9 / 5e9) and "ring_assumption" not in data


def test_nccl_table_at_scale(capsys):
    data = run_json(capsys, "all_reduce", "--bytes", "8", "--ranks", "2048", "--nodes", "256",
                    "--machine", "dgx-h100", "--algo", "nccl")
    assert data["nccl_pick"] == "tree/LL"
    best = next(p for p in data["predictions"] if p["label"] == "tree/LL")
    # 6.8 + 2 × (7 × 0.6 + 8 × 5.0) = 95.2 µs; algbw min(294.4/3.8, 20.4) × 0.5 = 10.2 GB/s
    assert best["time_s"] == pytest.approx(95.2e-6 + 8 / 10.2e9)
    assert best["verdict"] == "latency-bound"
    assert data["machine"]["name"] == "dgx-h100" and "2.20.3" in data["source"]
    rc, out, _ = run(capsys, "all_reduce", "--bytes", "8", "--ranks", "2048", "--nodes", "256",
                     "--machine", "dgx-h100", "--algo", "nccl")
    assert rc == 0 and "NCCL would pick tree/LL: 95.2 µs" in out
    # the table's algbw is nccl-tests' size / time (8 B / 95.2 µs = 84.03 KB/s), beside NCCL's β rate
    row = next(line for line in out.splitlines() if line.startswith("* tree/LL"))
    assert row.split()[8:12] == ["84.03", "KB/s", "10.2", "GB/s"]


def test_nccl_single_node_from_link(capsys):
    # 8 × nvlink4, 1 GB: NVLS 23 µs + 1e9 / (360 × 5/6 GB/s)
    data = run_json(capsys, "all_reduce", "--bytes", "1GB", "--ranks", "8", "--link", "nvlink4", "--algo", "nccl")
    assert data["nccl_pick"] == "nvls/Simple" and data["nodes"] == 1
    nvls = next(p for p in data["predictions"] if p["label"] == "nvls/Simple")
    assert nvls["time_s"] == pytest.approx(23e-6 + 1e9 / 300e9)


def test_machine_file_and_overrides(capsys, tmp_path):
    f = tmp_path / "hpc.toml"
    f.write_text('gpus = 4\nnvlink = 4\nnic = "slingshot11"\nnics = 4\ncpu = "arm"\n')
    # 2 nodes × 4: ring/Simple all_gather lat = 8.4 + 6 × max(3.4, 1 × 3) + 1 × 14 = 42.8 µs;
    # path min(360, 4 × 25 × 0.8 = 80) = 80 GB/s; algbw 80 × 8/7
    data = run_json(capsys, "all_gather", "--bytes", "1GB", "--nodes", "2", "--machine", str(f), "--algo", "nccl")
    ring = next(p for p in data["predictions"] if p["label"] == "ring/Simple")
    assert data["ranks"] == 8 and ring["time_s"] == pytest.approx(42.8e-6 + 1e9 / (80e9 * 8 / 7))
    # a command-line fact overrides the file's: 1 NIC → path 20 GB/s
    data = run_json(capsys, "all_gather", "--bytes", "1GB", "--nodes", "2", "--machine", str(f),
                    "--nics-per-node", "1", "--algo", "nccl")
    ring = next(p for p in data["predictions"] if p["label"] == "ring/Simple")
    assert ring["algbw_Bps"] == pytest.approx(20e9 * 8 / 7)
    assert data["machine"]["sources"]["nics_per_node"] == "command line"
    # --machine with --algo hierarchical takes the preset's links
    data = run_json(capsys, "all_reduce", "--bytes", "1GB", "--nodes", "4", "--machine", "dgx-h100",
                    "--algo", "hierarchical")
    assert data["link_in"]["name"] == "nvlink4" and data["flat_ring"]["time_s"] == pytest.approx(310e-6 + 6.0546875e-3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--machine", "dgx-q9", "--ranks", "8", "--algo", "nccl"], "neither a preset"),
        (["--ranks", "8", "--algo", "nccl"], "--link-in"),
        (["--ranks", "16", "--nodes", "2", "--link", "nvlink4", "--algo", "nccl"], "no NIC"),
        (["--ranks", "8", "--machine", "dgx-h100"], "--machine goes with"),
        (["--ranks", "8", "--link", "nvlink4", "--alpha", "1us", "--algo", "nccl"], "--alpha/--beta"),
    ],
)
def test_errors(capsys, args, message):
    rc, out, err = run(capsys, "all_reduce", "--bytes", "1MB", *args)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
