"""The machine inferred from the inputs (tracekit.ingest.nccl_tests.nic_facts / machine_facts,
tracekit/analyses/machine.py): hosts, ranks per host, GPU, NICs and the locality class per group,
from nccl-tests "Using devices" lines, NCCL INFO NET lines and trace host names."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES, shared_trace
from tracekit import analyses
from tracekit.analyses.machine import classify
from tracekit.ingest import ingest_paths
from tracekit.ingest.nccl_tests import machine_facts, nic_facts, parse_nccl_tests
from tracekit.report.data import build_report, machine_lines
from tracekit.store import Store

_HEADER = ["#", "#                                                     out-of-place                       in-place",
           "#       size         count    type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
           "#        (B)    (elements)                             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]


def _log(path, hosts: list[str], per_host: int, chatter: list[str] = (), gpu="NVIDIA H100 80GB HBM3"):
    """An all_reduce_perf log: ``per_host`` ranks on each of ``hosts``, two sizes, NCCL chatter lines first."""
    lines = list(chatter) + ["# nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 "
                             "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    r = 0
    for h in hosts:
        for d in range(per_host):
            lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r} on {h} device {d:2d} [0000:1b:00] {gpu}")
            r += 1
    lines += _HEADER
    lines += ["     1048576        262144     float     sum      -1    100.0   10.49   18.35      0    100.0   10.49   "
              "18.35      0",
              "     2097152        524288     float     sum      -1    180.0   11.65   20.39      0    180.0   11.65   "
              "20.39      0",
              "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 19.37", "#"]
    path.write_text("\n".join(lines) + "\n")
    return path


IB_LINES = [
    "nodeA:1001:1001 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/IB [3]mlx5_5:1/IB ; "
    "OOB ib0:10.0.0.1<0>",
    "nodeA:1002:1002 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/IB [3]mlx5_5:1/IB ; "
    "OOB ib0:10.0.0.1<0>",
    "nodeB:2001:2001 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/IB [3]mlx5_5:1/IB ; "
    "OOB ib0:10.0.0.2<0>",
    "nodeB:2001:2001 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
]


def test_nic_lines_ib_roce_socket_ofi(tmp_path):
    f = tmp_path / "chatter.log"
    f.write_text("\n".join(IB_LINES + [
        "nodeC:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_2:1/RoCE [1]mlx5_3:1/RoCE [RO]; OOB eth0:10.1.0.3<0>",
        "nodeD:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.2.0.4<0>",
        "nodeE:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)",
    ]) + "\n")
    got = nic_facts(f)
    assert got == {
        "nodeA": dict(transport="IB", nics=4, names=["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5"]),
        "nodeB": dict(transport="IB", nics=4, names=["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5"]),
        "nodeC": dict(transport="RoCE", nics=2, names=["mlx5_2", "mlx5_3"]),
        "nodeD": dict(transport="Socket", nics=1, names=["eth0"]),
        "nodeE": dict(transport="OFI:efa", nics=4, names=[]),
    }
    quiet = tmp_path / "quiet.log"
    quiet.write_text("# nothing from NCCL here\n")
    assert nic_facts(quiet) == {}


@pytest.mark.parametrize("hosts, per_host, locality", [
    (["nodeA"], 8, "intra_node"), (["nodeA", "nodeB"], 1, "inter_node"), (["nodeA", "nodeB"], 2, "mixed")])
def test_machine_from_rank_lines(tmp_path, hosts, per_host, locality):
    f = _log(tmp_path / "all_reduce.log", hosts, per_host, IB_LINES)
    (g,) = parse_nccl_tests(f).groups
    m = machine_facts(g, nic_facts(f))
    assert (m["hosts"], m["nodes"], m["ranks_per_host"], m["gpu"], m["locality"]) == (
        hosts, len(hosts), per_host, "NVIDIA H100 80GB HBM3", locality)
    # NCCL printed its NICs for nodeA and nodeB: 4 each
    assert (m["nics_per_node"], m["nic"]) == (4, "IB mlx5_0,mlx5_3,mlx5_4,mlx5_5")
    assert m["source"] == "nccl-tests 'Using devices', NCCL INFO NET lines" and m["locality_reason"] is None


def test_no_rank_lines_is_unknown_with_reason(tmp_path):
    f = tmp_path / "all_reduce.log"
    f.write_text("\n".join(["# nThread 1 nGpus 8 minBytes 1048576 maxBytes 1048576 step: 2(factor) warmup iters: 5 "
                            "iters: 20 agg iters: 1 validation: 1 graph: 0"] + _HEADER + [
        "     1048576        262144     float     sum      -1    100.0   10.49   18.35      0    100.0   10.49   "
        "18.35      0"]) + "\n")
    (g,) = parse_nccl_tests(f).groups
    m = machine_facts(g, nic_facts(f))
    assert (m["locality"], m["nodes"], m["source"]) == ("unknown", 0, None)
    assert m["locality_reason"] == "the log has no 'Using devices' rank lines naming hosts"
    # in the store and the report's JSON: no host known is no node count (NULL), not "0 nodes"
    store = Store(tmp_path / "s")
    ingest_paths([f], store, run_id="nohosts")
    con = analyses.connect(store)
    assert con.execute("SELECT nodes, hosts_unknown, locality FROM group_machine").fetchall() == [(None, 8, "unknown")]
    assert [m["nodes"] for m in build_report(store, "nohosts", con=con)["machine"]] == [None]
    con.close()


def test_classify_rules():
    assert classify({"a": 2}, 0) == ("intra_node", None)
    assert classify({"a": 1, "b": 1}, 3) == ("inter_node", None)  # two known hosts, whatever the unknown ones
    assert classify({"a": 2, "b": 1}, 0) == ("mixed", None)
    assert classify({"a": 1}, 1) == ("unknown", "one host known, 1 rank(s) with no host recorded")
    assert classify({}, 2) == ("unknown", "no input names the host of any of its ranks")


def test_group_machine_in_the_store_and_the_report(tmp_path):
    store = Store(tmp_path / "s")
    ingest_paths([_log(tmp_path / "all_reduce.log", ["nodeA", "nodeB"], 2, IB_LINES)], store, run_id="log")
    ingest_paths([FIXTURES / "defects" / "two_hosts"], store, run_id="hosts")
    ingest_paths([FIXTURES / "defects" / "two_hosts" / "rank0.json"], store, run_id="half")
    con = analyses.connect(store)
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT run_id, hosts, nodes, hosts_unknown, ranks_per_host, nics_per_node, locality, locality_reason, source "
        "FROM group_machine ORDER BY run_id").fetchall()}
    assert rows["log"] == ("nodeA,nodeB", 2, 0, 2, 4, "mixed", None, "nccl-tests 'Using devices', NCCL INFO NET lines")
    assert rows["hosts"] == ("node-a,node-b", 2, 0, 1, None, "inter_node", None, "trace host names (ranks.host)")
    assert rows["half"] == ("node-a", 1, 1, 1, None, "unknown", "one host known, 1 rank(s) with no host recorded",
                            "trace host names (ranks.host)")
    # the class reaches the instances and the reference: a 2 × 2 H100 job across hosts gets the NIC preset
    # over the 4 NICs per node its log names (each of the 2 GPUs of a node has its own NIC: ib_ndr unshared)
    assert con.execute("SELECT DISTINCT locality FROM instance_locality WHERE run_id = 'log'").fetchall() == [("mixed",)]
    ref = con.execute("SELECT locality, link, link_note FROM collective_reference WHERE run_id = 'log'").fetchone()
    assert ref[:2] == ("mixed", "ib_ndr") and "4 NICs per node (NCCL INFO NET lines)" in ref[2]
    rep = build_report(store, "log", con=con)
    con.close()
    assert machine_lines(rep) == [
        "machine: 2 node(s) × 2 rank(s) of NVIDIA H100 80GB HBM3, 4 NICs/node (IB mlx5_0,mlx5_3,mlx5_4,mlx5_5), "
        "mixed, 1 group(s) on nodeA, nodeB (source: nccl-tests 'Using devices', NCCL INFO NET lines)"]
    assert rep["machine"][0]["hosts"] == ["nodeA", "nodeB"]


def test_superbench_single_node_is_intra_node(tmp_path):
    folder = shared_trace("superbench_nccl_tests_a100x8")
    store = Store(tmp_path / "s")
    ingest_paths([folder], store, run_id="sb")
    con = analyses.connect(store)
    got = con.execute("SELECT DISTINCT locality, nodes, locality_reason FROM group_machine").fetchall()
    con.close()
    # the superbench logs: 8 A100 of one host when they print rank lines; otherwise unknown, with why
    assert got and all(loc in ("intra_node", "unknown") for loc, _, _ in got)
    assert all((loc == "intra_node") == (n == 1) and (loc == "unknown") == (why is not None) for loc, n, why in got)
