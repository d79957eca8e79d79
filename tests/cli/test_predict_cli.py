"""`tracekit predict`: the calculator's forms, its JSON, and one-line exit-2 errors."""

import json

import pytest

from tracekit.cli import main


def run(capsys, *args):
    rc = main(["predict", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *args):
    rc, out, err = run(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_all_reduce_ring_json(capsys):
    data = run_json(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "4", "--link", "nvlink4")
    assert data["op"] == "all_reduce" and data["size_bytes"] == 1e8 and data["ranks"] == 4
    assert data["link"]["beta_Bps"] == 3.6e11 and data["link"]["alpha_s"] == 2e-6
    (p,) = data["predictions"]
    # α term 2·3·2 µs = 12 µs; β term 2·3/4·1e8/3.6e11 = 416.667 µs
    assert p["algo"] == "ring"
    assert p["alpha_term_s"] == pytest.approx(12e-6)
    assert p["beta_term_s"] == pytest.approx(1.5e8 / 3.6e11)
    assert p["time_s"] == pytest.approx(12e-6 + 1.5e8 / 3.6e11)
    assert p["steps"] == 6 and p["bytes_per_rank_sent"] == pytest.approx(1.5e8)
    assert p["verdict"] == "bandwidth-bound" and p["n_half_bytes"] == pytest.approx(720e3)
    for key in ("time_s", "alpha_term_s", "beta_term_s", "steps", "bytes_per_rank_sent", "verdict", "n_half_bytes"):
        assert key in p


def test_all_algorithms(capsys):
    data = run_json(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "4", "--link", "nvlink4", "--algo", "all")
    assert [p["algo"] for p in data["predictions"]] == [
        "ring", "recursive_doubling", "rabenseifner", "tree", "double_binary_tree", "nvls"]
    assert data["skipped"] == []
    data = run_json(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "6", "--link", "nvlink4", "--algo", "all")
    assert [p["algo"] for p in data["predictions"]] == ["ring", "tree", "double_binary_tree", "nvls"]
    assert [s["algo"] for s in data["skipped"]] == ["recursive_doubling", "rabenseifner"]


def test_table_output(capsys):
    rc, out, err = run(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "4", "--link", "nvlink4", "--algo", "all")
    assert rc == 0 and err == ""
    for text in ("ring", "rabenseifner", "nvls", "428.7 µs", "12 µs", "bandwidth-bound", "720 KB"):
        assert text in out


def test_machine_table_notes_print_no_markup(capsys):
    # the notes under `--machine ... --algo all` are styled, not "[dim]...[/dim]" text
    rc, out, _ = run(capsys, "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8", "--link-in",
                     "nvlink4", "--link-out", "ib_ndr", "--nics-per-node", "8", "--algo", "all")
    assert rc == 0 and "collnet_direct (NCCL): no CollNet (IB SHARP) on this machine" in out
    assert "[dim]" not in out and "[/dim]" not in out


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all", "broadcast", "send"])
def test_other_ops(capsys, op):
    data = run_json(capsys, op, "--bytes", "1MB", "--ranks", "8", "--link", "ib_ndr")
    (p,) = data["predictions"]
    assert p["op"] == op and p["time_s"] > 0
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        # (k−1)·α + (k−1)/k·D/β = 7·5 µs + 7/8·1e6/4e10 s = 35 µs + 21.875 µs
        assert p["time_s"] == pytest.approx(35e-6 + 21.875e-6)
    if op == "send":
        # α + D/β = 5 µs + 25 µs
        assert p["time_s"] == pytest.approx(30e-6)


def test_broadcast_algorithms(capsys):
    data = run_json(capsys, "broadcast", "--bytes", "100MB", "--ranks", "8", "--link", "nvlink4", "--algo", "all")
    assert [p["algo"] for p in data["predictions"]] == ["ring", "tree", "scatter_allgather"]
    # pipelined ring: 7·2 µs + 1e8/3.6e11 s = 14 µs + 277.778 µs
    assert data["predictions"][0]["time_s"] == pytest.approx(14e-6 + 1e8 / 3.6e11)


def test_alpha_beta_override(capsys):
    # --alpha alone overrides only α: 2·3·1 µs = 6 µs, β stays 360 GB/s
    data = run_json(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "4", "--link", "nvlink4", "--alpha", "1us")
    assert data["link"]["alpha_s"] == 1e-6 and data["link"]["beta_Bps"] == 3.6e11
    assert data["predictions"][0]["alpha_term_s"] == pytest.approx(6e-6)
    # --beta alone overrides only β
    data = run_json(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "4", "--link", "nvlink4", "--beta", "180GB/s")
    assert data["link"]["alpha_s"] == 2e-6 and data["link"]["beta_Bps"] == 1.8e11
    # both, without a preset: a custom link
    data = run_json(capsys, "all_reduce", "--bytes", "100MB", "--ranks", "4", "--alpha", "2us", "--beta", "900GB/s bidirectional")
    assert data["link"]["name"] == "custom" and data["link"]["beta_Bps"] == 4.5e11


def test_hierarchical(capsys):
    data = run_json(
        capsys,
        "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8",
        "--link-in", "nvlink4", "--link-out", "ib_ndr", "--algo", "hierarchical",
    )
    assert data["algo"] == "hierarchical" and len(data["phases"]) == 3
    # phase 2: 2·3·5 µs + 2·3/4·(1e9/8)/4e10 s = 30 µs + 4.6875 ms
    assert data["phases"][1]["time_s"] == pytest.approx(30e-6 + 4.6875e-3)
    # flat ring over 32 ranks as NCCL lays it out: one NIC per GPU (8 per node) and the rings use
    # all of them: β = min(nvlink4 360, 8 × 40) = 320 GB/s; 2·31·5 µs + 2·31/32·1e9/3.2e11 s
    assert data["flat_ring"]["time_s"] == pytest.approx(310e-6 + 6.0546875e-3)
    assert "all 8 NICs" in data["flat_assumption"]
    assert data["time_s"] == pytest.approx(sum(p["time_s"] for p in data["phases"]))
    assert data["link_in"]["name"] == "nvlink4" and data["link_out"]["name"] == "ib_ndr"
    rc, out, _ = run(
        capsys,
        "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8",
        "--link-in", "nvlink4", "--link-out", "ib_ndr", "--algo", "hierarchical",
    )
    assert rc == 0 and "flat ring" in out and "hierarchical total" in out and "6.365 ms" in out


def test_overlap(capsys):
    data = run_json(capsys, "overlap", "--compute", "1ms", "--comm", "1ms", "--chunks", "8", "--alpha-chunk", "10us")
    assert data["time_s"] == pytest.approx(1205e-6)  # 125 + 135 + 7·135 µs
    assert data["no_overlap_s"] == pytest.approx(2e-3)
    data = run_json(capsys, "overlap", "--compute", "1ms", "--comm", "1ms", "--chunks", "best", "--alpha-chunk", "10us")
    assert data["chunks"] == 10 and data["time_s"] == pytest.approx(1.2e-3) and data["searched"] is True
    data = run_json(capsys, "overlap", "--compute", "1ms", "--comm", "1ms", "--two-batch")
    assert data["model"] == "two_batch" and data["time_s"] == pytest.approx(1.5e-3)
    rc, out, _ = run(capsys, "overlap", "--compute", "1ms", "--comm", "1ms", "--chunks", "8", "--alpha-chunk", "10us")
    assert rc == 0 and "1.205 ms" in out


def test_best_chunks_needs_a_chunk_cost(capsys):
    # α_c = 0: T(n) = c/n + a/n + (n−1)·max(c, a)/n falls with every n, so 'best' would be the search limit
    rc, out, err = run(capsys, "overlap", "--compute", "1ms", "--comm", "800us", "--chunks", "best")
    assert rc == 2 and out == "" and "--chunks best needs --alpha-chunk > 0" in err and err.count("\n") == 1
    # the optimum at the limit is said: 1 ms / 1 ns per chunk puts √(c/α_c) ≈ 1,000 far past 64
    rc, out, err = run(capsys, "overlap", "--compute", "1ms", "--comm", "800us", "--chunks", "best",
                       "--alpha-chunk", "1ns", "--max-chunks", "64")
    assert rc == 0 and "best n = 64" in out
    assert "the best n is the search limit (--max-chunks 64)" in err


def test_transfer(capsys):
    data = run_json(capsys, "transfer", "--bytes", "1.342GB", "--link", "ib_ndr", "--nics", "8", "--layers", "80")
    assert data["bulk_s"] == pytest.approx(4.19875e-3)  # 5 µs + 1.342e9 / 3.2e11
    assert data["layered_exposed_s"] == pytest.approx(57.421875e-6)  # 5 µs + 16.775e6 / 3.2e11
    assert data["nics"] == 8 and data["layers"] == 80


def test_pp_decode(capsys):
    data = run_json(
        capsys, "pp-decode", "--stages", "8", "--microbatches", "8", "--stage-time", "1ms",
        "--transfer", "0.1ms", "--tokens", "100",
    )
    assert data["mean_time_per_token_s"] == pytest.approx(8.77e-3)  # (99·8.7 + 7 + 8.7) ms / 100
    assert data["utilisation"] == pytest.approx(800 / 877)
    assert data["token_latency_s"] == pytest.approx(8.7e-3)


def test_links(capsys):
    data = run_json(capsys, "links")
    assert {l["name"] for l in data["links"]} >= {"nvlink4", "ib_ndr", "eth25", "hbm3"}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["all_reduce", "--bytes", "-1", "--ranks", "4", "--link", "nvlink4"], "negative"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "1", "--link", "nvlink4"], "at least 2 ranks"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "6", "--link", "nvlink4", "--algo", "rabenseifner"], "power-of-two"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "6", "--link", "nvlink4", "--algo", "recursive_doubling"], "power-of-two"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "4", "--link", "nvlink9"], "unknown link 'nvlink9'"),
        (["all_reduce", "--bytes", "1XB", "--ranks", "4", "--link", "nvlink4"], "byte size"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "4", "--link", "nvlink4", "--alpha", "2 parsecs"], "time"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "4", "--link", "nvlink4", "--beta", "360GB"], "bandwidth"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "4"], "no link"),
        (["all_reduce", "--bytes", "1MB", "--link", "nvlink4"], "--ranks"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "4", "--link", "nvlink4", "--algo", "bogus"], "no algorithm"),
        (["all_gather", "--bytes", "1MB", "--ranks", "4", "--link", "nvlink4", "--algo", "nvls"], "no algorithm"),
        (["all_reduce", "--bytes", "1GB", "--nodes", "4", "--algo", "hierarchical"], "needs --gpus-per-node"),
        (["all_gather", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8", "--link-in", "nvlink4",
          "--link-out", "ib_ndr", "--algo", "hierarchical"], "all_reduce algorithm"),
        (["overlap", "--compute", "1ms", "--comm", "1ms"], "--chunks"),
        (["overlap", "--compute", "1ms", "--comm", "1ms", "--chunks", "0"], "chunk count"),
        (["overlap", "--compute", "1ms", "--comm", "1ms", "--chunks", "many"], "--chunks"),
        (["transfer", "--bytes", "1GB", "--link", "ib_ndr", "--nics", "0"], "NIC count"),
        (["pp-decode", "--stages", "0", "--microbatches", "8", "--stage-time", "1ms", "--tokens", "1"], "stage count"),
        (["all_reduce", "--bytes", "1MB", "--ranks", "four", "--link", "nvlink4"], "four"),
    ],
)
def test_bad_values_exit_2_with_one_line(capsys, args, needle):
    rc, out, err = run(capsys, *args)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tracekit: ")
    assert needle in lines[0]


def test_double_binary_tree_listed_and_hand_checked(capsys):
    data = run_json(capsys, "all_reduce", "--bytes", "1GB", "--ranks", "8", "--link", "nvlink4", "--algo", "all")
    (p,) = [q for q in data["predictions"] if q["algo"] == "double_binary_tree"]
    # 2·⌈log₂8⌉·α + 2·D/β = 2·3·2 µs + 2·1e9/360e9 s = 12 µs + 5,555.556 µs
    assert p["alpha_term_s"] == pytest.approx(12e-6, rel=1e-12)
    assert p["beta_term_s"] == pytest.approx(2e9 / 360e9, rel=1e-12)
    assert p["time_s"] == pytest.approx(5.567555555555556e-3, rel=1e-12)
    # D* = 6α·β/2 = 3 · 720 KB; fixed latency = its α term
    assert p["crossover_bytes"] == pytest.approx(2.16e6) and p["fixed_latency_s"] == pytest.approx(12e-6)
    rc, out, _ = run(capsys, "all_reduce", "--bytes", "1GB", "--ranks", "8", "--link", "nvlink4", "--algo", "all")
    assert rc == 0 and "double_binary_tree" in out and "5.568 ms" in out


def test_nics_per_node(capsys):
    # 4 nodes × 8 GPUs sharing 4 NDR NICs per node: β_out per GPU = 40 GB/s × 4/8 = 20 GB/s
    data = run_json(
        capsys,
        "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8", "--nics-per-node", "4",
        "--link-in", "nvlink4", "--link-out", "ib_ndr", "--algo", "hierarchical",
    )
    assert data["link_out"]["beta_Bps"] == pytest.approx(20e9)
    # phase 2: 2·3·5 µs + 2·3/4·(1e9/8)/2e10 s = 30 µs + 9.375 ms
    assert data["phases"][1]["time_s"] == pytest.approx(30e-6 + 9.375e-3)
    # flat ring over 32 ranks: its rings use the node's 4 NICs, β = min(360, 4 × 40) = 160 GB/s:
    # 2·31·5 µs + 2·31/32·1e9/1.6e11 s = 310 µs + 12.109375 ms (not a 1/8 share of a NIC per step)
    assert data["flat_ring"]["time_s"] == pytest.approx(310e-6 + 12.109375e-3)
    assert "all 62 steps at the network's α" in data["flat_assumption"]
    rc, out, _ = run(
        capsys,
        "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8", "--nics-per-node", "4",
        "--link-in", "nvlink4", "--link-out", "ib_ndr", "--algo", "hierarchical",
    )
    assert rc == 0 and "flat ring over 32 ranks" in out
    # flat multi-node prediction on the shared NICs
    data = run_json(capsys, "all_reduce", "--bytes", "1GB", "--nodes", "4", "--gpus-per-node", "8",
                    "--nics-per-node", "4", "--link", "ib_ndr")
    (p,) = data["predictions"]
    # the ring over the node's 4 NICs: 4 × 40 = 160 GB/s
    assert data["ranks"] == 32 and p["time_s"] == pytest.approx(310e-6 + 12.109375e-3)
    assert "all 4 NICs" in data["ring_assumption"] and "share 4 NIC(s)" in data["assumption"]
    rc, out, err = run(capsys, "all_reduce", "--bytes", "1GB", "--ranks", "32", "--nics-per-node", "4", "--link", "ib_ndr")
    assert rc == 2 and "--gpus-per-node" in err
