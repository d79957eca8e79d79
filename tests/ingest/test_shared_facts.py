"""Per-file facts of the real traces in ../shared/traces, verified by hand.

The expected numbers were counted with plain-Python scripts over the raw JSON
(noted next to each), independent of tracekit's reader.
"""

from __future__ import annotations

from tracekit import analyses
import pytest

from tests.conftest import shared_trace
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _con(tmp_path, rel):
    store = Store(tmp_path / "s")
    ingest_paths([shared_trace(rel)], store)
    return analyses.connect(store)


def test_pyper_sendrecv_kernels_told_apart_by_launching_op(tmp_path):
    """80 ncclKernel_SendRecv kernels on 3 NCCL streams; the enclosing nccl:* op of each launch
    (correlation → cudaLaunchKernel → nccl:* on that thread) gives 45 all_to_all, 10
    reduce_scatter, 10 all_reduce, 10 all_gather; 5 were launched outside the capture."""
    con = _con(tmp_path, "hta_pyper_a100_r0of16/rank0.json.gz")
    rows = dict(con.execute("SELECT coalesce(op, '?'), count(*) FROM collectives GROUP BY 1").fetchall())
    assert rows == {"all_to_all": 45, "reduce_scatter": 10, "all_reduce": 10, "all_gather": 10, "?": 5}
    per_stream = con.execute(
        "SELECT e.track, coalesce(c.op, '?'), count(*) FROM collectives c JOIN events e USING (run_id, rank, event_id) "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert per_stream == [
        (84, "?", 1), (84, "all_reduce", 10), (84, "all_to_all", 25),
        (285, "?", 2), (285, "all_gather", 10), (285, "reduce_scatter", 10),
        (363, "?", 2), (363, "all_to_all", 20),
    ]
    # the unattributed ones are comm (they occupy the timeline) but carry no size
    assert con.execute("SELECT count(*), count(size_bytes) FROM collectives WHERE op IS NULL").fetchone() == (5, 0)
    assert con.execute("SELECT count(*) FROM events WHERE class = 'comm'").fetchone() == (80,)


def test_nccl_parser_metadata_on_kernels(tmp_path):
    """21 NCCL kernels on stream 40 with 'Collective name': 15 allreduce, 6 broadcast."""
    con = _con(tmp_path, "hta_nccl_parser_a100_r0of2/nccl_data.json.gz")
    rows = con.execute(
        "SELECT op, count(*), min(meta_source), max(meta_source), min(group_size) FROM collectives GROUP BY op ORDER BY op"
    ).fetchall()
    assert rows == [("all_reduce", 15, "kernel_args", "kernel_args", 2), ("broadcast", 6, "kernel_args", "kernel_args", 2)]
    assert con.execute("SELECT DISTINCT e.track FROM collectives c JOIN events e USING (run_id, rank, event_id)").fetchall() == [(40,)]
    # the first all_reduce kernel: 6,637,568 Float elements
    assert con.execute("SELECT max(size_bytes) FILTER (WHERE op = 'all_reduce') FROM collectives").fetchone()[0] == 31502336


def test_tracelens_new_kernel_naming_on_compute_stream(tmp_path):
    """One ncclDevKernel_AllGather_RING_LL on stream 7, where all 768 kernels run; out 201,088 BFloat16.
    (The trace's other collectives are symmetric-memory all-reduces: tests/ingest/test_comm_families.py.)"""
    con = _con(tmp_path, "tracelens_b200_r0of8/eager_trace.json.gz")
    assert con.execute(
        "SELECT op, size_bytes, group_size, pg_name, algo, proto FROM collectives WHERE meta_source = 'kernel_args'"
    ).fetchall() == [("all_gather", 402176, 8, "3", "RING", "LL")]
    assert con.execute("SELECT count(*), count(DISTINCT track) FROM events WHERE category = 'kernel'").fetchone() == (768, 1)


def test_ddp_allreduces_without_sizes(tmp_path):
    """2,020 ncclKernel_AllReduce on stream 14; record_param_comms and nccl:all_reduce carry no sizes."""
    con = _con(tmp_path, "hta_ddp_v100_r1of2/df_index_resolver.json.gz")
    assert con.execute(
        "SELECT op, count(*), count(size_bytes), min(meta_source) FROM collectives GROUP BY op"
    ).fetchall() == [("all_reduce", 2020, 0, "name_only")]
    assert con.execute("SELECT events FROM ranks").fetchone() == (123379,)


def test_world_size_one_has_metadata_but_no_comm_kernels(tmp_path):
    con = _con(tmp_path, "hta_ws1_record_param_comms_v100/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    assert con.execute("SELECT count(*) FROM collectives").fetchone() == (0,)
    assert con.execute("SELECT world_size FROM runs").fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM events WHERE name = 'record_param_comms'").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM events WHERE category = 'kernel'").fetchone() == (4350,)


def test_cpu_only_gloo(tmp_path):
    """10 gloo:all_reduce user annotations on 2 gloo threads; sizes from their Input Dims × float."""
    con = _con(tmp_path, "hta_cpu_only_gloo/v_b8cce2c")
    rows = con.execute("SELECT op, count(*), min(size_bytes), min(group_size), min(meta_source) FROM collectives GROUP BY op").fetchall()
    assert rows == [("all_reduce", 10, 321271 * 4, 300, "cpu_op_dims")]
    assert con.execute("SELECT backend, world_size FROM runs").fetchone() == ("gloo", 300)


@pytest.mark.parametrize("rel, kernels", [("kineto_legacy_2021/worker0.pt.trace.json.gz", 9564),
                                          ("kineto_legacy_2021/worker0.1623143089861.pt.trace.json.gz", 8772)])
def test_oldest_format(tmp_path, rel, kernels):
    """Capitalised categories ('Kernel') and string tids ('stream 7')."""
    con = _con(tmp_path, rel)
    assert con.execute("SELECT count(*), min(track), max(track) FROM events WHERE category = 'kernel'").fetchone() == (kernels, 7, 7)
    assert con.execute("SELECT count(*) FROM events WHERE category = 'runtime'").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM events WHERE class = 'compute'").fetchone() == (kernels,)


@pytest.mark.parametrize("rel, device, kernels", [
    ("single_gpu_compute/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "AMD Instinct MI300X VF", 1516),
    ("single_gpu_compute/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "NVIDIA H100 80GB HBM3", 1465),
    ("single_gpu_compute/mi250/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "AMD Radeon Graphics", 14),
])
def test_single_gpu_compute(tmp_path, rel, device, kernels):
    con = _con(tmp_path, rel)
    assert con.execute("SELECT device_name FROM runs").fetchone() == (device,)
    assert con.execute("SELECT count(*) FROM events WHERE class = 'compute'").fetchone() == (kernels,)
    assert con.execute("SELECT count(*) FROM collectives").fetchone() == (0,)


def test_no_shared_trace_has_quarantined_events(tmp_path):
    """Counted by hand: no X event in the shared traces has a missing/non-positive ts or a negative dur."""
    for rel in ["param_dlrm_8rank_v100", "hta_pyper_a100_r0of16/rank0.json.gz"]:
        store = Store(tmp_path / rel.replace("/", "_"))
        ingest_paths([shared_trace(rel)], store)
        assert analyses.connect(store).execute("SELECT sum(events_quarantined) FROM ranks").fetchone() == (0,)
