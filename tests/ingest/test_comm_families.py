"""Collectives implemented outside NCCL (tracekit/ingest/comm_families.py), on hand-made traces
(fixtures/handmade/comm_families/, written by fixtures/handmade/make_comm_families.py; every
expected number is worked out in fixtures/handmade/NOTE.md) and on the real B200 vLLM trace."""

from __future__ import annotations

from tracekit import analyses

import gzip
import json
import math
import re

import pytest

from tests.conftest import FIXTURES, shared_trace
from tracekit.cli import main
from tracekit.errors import BadInputError
from tracekit.ingest import ingest_paths
from tracekit.ingest import comm_families as cf
from tracekit.ingest.attribute import dtype_bytes, parse_kernel_name
from tracekit.model import CANONICAL_OPS
from tracekit.store import Store

H = FIXTURES / "handmade" / "comm_families"
ROWS = "SELECT rank, op, size_bytes, wire_bytes, group_size, pg_name, seq, dtype, meta_source, approx FROM collectives"


def _ingest(tmp_path, name, **kw):
    store = Store(tmp_path / "store")
    ingest_paths([H / name], store, run_id="x", **kw)
    return analyses.connect(store)


# -- the table ------------------------------------------------------------------------------------


def test_table_is_well_formed_and_wired_into_the_readers():
    for fam in cf.FAMILIES:
        for k in fam.kernels:
            re.compile(k.pattern)
            assert k.op is None or k.op in CANONICAL_OPS
            assert k.pattern in cf.BUILTIN_COMM_PATTERNS  # comm by name
        for c in fam.cpu_ops:
            assert c.op in CANONICAL_OPS and c.buffer >= 0
            assert c.name.startswith(cf.COMM_CPU_PREFIX)  # its metadata row is kept


@pytest.mark.parametrize("name, op", [
    # names as the projects' kernels demangle (sources in comm_families' docstring)
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long)", "all_reduce"),
    ("void c10d::symmetric_memory::two_shot_all_reduce_kernel_inplace<float, 8, 8>(float**, unsigned long)", "all_reduce"),
    ("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long)", "all_gather"),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals)", "all_reduce"),
    ("void quickreduce::allreduce_prototype_twoshot<AllReduceTwoshot<__half, CodecQ4<__half, 8>, true>, __half>(...)", "all_reduce"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, true, false>(tensorrt_llm::kernels::AllReduceParams)", "all_reduce"),
    ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<(AllReduceFusionPattern)1, half, 8, true>(...)", "all_reduce"),
    ("void tensorrt_llm::kernels::mnnvl::twoshotAllreduceKernel<__nv_bfloat16>(...)", "all_reduce"),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*, int*)", "all_to_all"),
    ("void deep_ep::internode::combine<__nv_bfloat16, 2, 8, 16, 4096>(int4*, float*)", "all_to_all"),
    ("void alltoall_on_stream_kernel<float>(int, float*, float const*, unsigned long)", "all_to_all"),
    ("void fcollect_on_stream_kernel<int>(int, int*, int const*, unsigned long)", "all_gather"),
    ("c10d::nvshmem_extension::allToAllV(void*, void*, long*, unsigned long, int)", "all_to_all"),
    ("void allreduce7<(Op)0, __half>(__half*, __half*, __half*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*)", "all_reduce"),
    ("void allgather6<true>(void*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, unsigned long)", "all_gather"),
])
def test_family_kernel_names_give_their_op(name, op):
    assert cf.kernel_op(name) == (True, op)
    assert parse_kernel_name(name) == (op, None, None)


@pytest.mark.parametrize("name", [
    "void mscclpp::executionKernel<__half, false>(int, __half*, __half*)",  # the plan decides
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*)",  # helper: no payload op
    "c10d::nvshmem_extension::exchangeSplitAndOffset(long*, int)",
])
def test_family_kernels_without_an_op_of_their_own(name):
    assert cf.kernel_op(name) == (True, None)


@pytest.mark.parametrize("name", [
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int)",
    "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*)",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4> >(Flash_fwd_params)",
    "void dispatch_kernel<float>(float*)",
    "fused_add_rmsnorm_kernel",
])
def test_compute_kernels_are_not_families(name):
    assert cf.kernel_op(name) == (False, None)


def _rows(**ops):
    return [dict(name=n, **v) for n, v in ops.items()]


def test_resolve_family_sizes_from_the_buffer_named_by_the_table():
    # vllm::all_gather(tensor, dim, world_size, group): the input is one rank's shard
    r = cf.resolve_family("void vllm::cross_device_reduce_1stage<float, 2>(...)", [
        dict(name="vllm::all_gather", input_dims=[[4, 1024], [], [], []], input_type=["float", "", "", ""],
             concrete=["", "0", "2", "tp"]),
    ], dtype_bytes)
    assert (r["op"], r["size_bytes"], r["all_gather_shard"], r["pg_name"], r["meta_source"]) == (
        "all_gather", 4 * 1024 * 4, True, "tp", "cpu_op_dims")
    # an unreadable dtype leaves the size unknown, never a guess
    r = cf.resolve_family("multimem_all_reduce_kernel", [
        dict(name="symm_mem::multimem_all_reduce_", input_dims=[[10]], input_type=["c10::Mystery"])], dtype_bytes)
    assert (r["op"], r["size_bytes"], r["meta_source"]) == ("all_reduce", None, "cpu_op_dims")
    # all_to_all_vdev's input is a symmetric buffer: S only bounded, the row approx
    r = cf.resolve_family("c10d::nvshmem_extension::allToAllV(void*)", [
        dict(name="symm_mem::all_to_all_vdev", input_dims=[[64, 8], [64, 8], [3, 2], []],
             input_type=["c10::BFloat16", "c10::BFloat16", "long int", ""])], dtype_bytes)
    assert (r["op"], r["size_bytes"], r["approx"]) == ("all_to_all", 64 * 8 * 2, True)


def test_standard_metadata_inside_a_family_op_wins():
    # vllm::all_reduce falling back to torch.distributed: c10d::allreduce_ / record_param_comms inside it
    enclosing = [dict(name="record_param_comms"), dict(name="c10d::allreduce_"),
                 dict(name="vllm::all_reduce", input_dims=[[8]], input_type=["float"])]
    assert cf.resolve_family("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                             enclosing, dtype_bytes) is None
    # pynccl under vllm::all_reduce: no standard op, the family op sizes the NCCL kernel
    r = cf.resolve_family("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", enclosing[2:], dtype_bytes)
    assert (r["op"], r["size_bytes"]) == ("all_reduce", 32)
    # a helper kernel never takes the enclosing call's op
    r = cf.resolve_family("c10d::nvshmem_extension::exchangeSplitAndOffset(long*)",
                          [dict(name="symm_mem::all_to_all_vdev", input_dims=[[4]], input_type=["float"])], dtype_bytes)
    assert (r["op"], r["size_bytes"], r["meta_source"]) == (None, None, "name_only")


@pytest.mark.parametrize("text, kernel", [
    ("foo_kernel=all_gather", cf.Kernel("foo_kernel", "all_gather")),
    ("foo_kernel=AllGather", cf.Kernel("foo_kernel", "all_gather")),
    ("foo_kernel", cf.Kernel("foo_kernel", None)),
    ("a(?=b)", cf.Kernel("a(?=b)", None)),  # a lookahead is a regex, not REGEX=OP
])
def test_parse_comm_pattern(text, kernel):
    assert cf.parse_comm_pattern(text) == kernel


@pytest.mark.parametrize("text", ["foo=notanop", "foo=sendrecv", "(=all_reduce"])
def test_parse_comm_pattern_rejects(text):
    with pytest.raises(BadInputError, match="--comm-pattern"):
        cf.parse_comm_pattern(text)


# -- hand-made traces -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def symm(tmp_path_factory):
    c = _ingest(tmp_path_factory.mktemp("symm"), "symm_mem")
    yield c
    c.close()


def test_symm_mem_multimem_all_reduce_rows(symm):
    # S = 1,048,576 BFloat16 × 2 B; wire = 2(2−1)/2 · S; group "7" named by the op's third input
    assert symm.execute(ROWS + " ORDER BY rank").fetchall() == [
        (0, "all_reduce", 2097152, 2097152, 2, "7", 0, "c10::BFloat16", "cpu_op_dims", False),
        (1, "all_reduce", 2097152, 2097152, 2, "7", 0, "c10::BFloat16", "cpu_op_dims", False),
    ]
    assert symm.execute("SELECT rank, count(*) FROM events WHERE class = 'comm' GROUP BY ALL ORDER BY rank").fetchall() == [
        (0, 1), (1, 1)]


def test_symm_mem_bandwidth_and_overlap_exact(symm):
    # rank 0 [1020, 1070) µs, rank 1 [1030, 1070): last arrival 1030, sync = median(40, 40) = 40 µs
    sync, algbw, busbw = symm.execute("SELECT sync_time_ns, algbw_gbps, busbw_gbps FROM collective_bandwidth").fetchone()
    assert sync == 40_000
    assert algbw == pytest.approx(2097152 / 40_000, rel=1e-12)  # 52.4288 GB/s (B/ns = GB/s)
    assert busbw == pytest.approx(2097152 / 40_000 * 2 * (2 - 1) / 2, rel=1e-12)
    # rank 0: comm [20, 70), GEMM [40, 100) → overlap 30 µs of 50; rank 1 has no compute
    assert symm.execute(
        "SELECT rank, comm_ns, compute_ns, overlap_ns, exposed_comm_ns, overlap_ratio FROM overlap_by_rank ORDER BY rank"
    ).fetchall() == [(0, 50_000, 60_000, 30_000, 20_000, 0.6), (1, 40_000, 0, 0, 40_000, 0.0)]


def test_vllm_custom_all_reduce(tmp_path):
    con = _ingest(tmp_path, "vllm_custom_ar.json")
    assert con.execute(ROWS + " ORDER BY ts_ns").fetchall() == [
        # innermost op _C_custom_ar::all_reduce(fa, inp, ...): inp = 8 × 4096 BFloat16
        (0, "all_reduce", 65536, 65536, 2, "0", 0, "c10::BFloat16", "cpu_op_dims", False),
        # vllm::all_reduce(tensor, group) alone: 16 × 4096 float
        (0, "all_reduce", 262144, 262144, 2, "0", 1, "float", "cpu_op_dims", False),
    ]
    # one rank: sync time = the kernel's own 10 µs and 8 µs
    assert con.execute("SELECT busbw_gbps FROM collective_bandwidth ORDER BY seq").fetchall() == [
        (pytest.approx(65536 / 10_000),), (pytest.approx(262144 / 8_000),)]
    # comm [20, 30) ∪ [112, 120) = 18 µs; GEMM [25, 55): overlap [25, 30) = 5 µs
    assert con.execute("SELECT comm_ns, compute_ns, overlap_ns FROM overlap_by_rank").fetchone() == (18_000, 30_000, 5_000)


def test_deepep_dispatch_combine_pair(tmp_path):
    con = _ingest(tmp_path, "deepep.json")
    # no torch op launches DeepEP: the op from the names, sizes unknown; notify_dispatch is
    # communication (it waits on the peers) but no call of its own
    assert con.execute("SELECT op, size_bytes, meta_source, seq FROM collectives ORDER BY ts_ns").fetchall() == [
        (None, None, "name_only", None), ("all_to_all", None, "name_only", 0), ("all_to_all", None, "name_only", 1)]
    assert con.execute("SELECT count(*) FROM events WHERE class = 'comm'").fetchone() == (3,)
    # comm [100, 124) ∪ [200, 230) = 54 µs; compute [110, 210): overlap 14 + 10 = 24 µs
    assert con.execute("SELECT comm_ns, compute_ns, overlap_ns, exposed_comm_ns, overlap_ratio FROM overlap_by_rank"
                       ).fetchone() == (54_000, 100_000, 24_000, 30_000, pytest.approx(24 / 54, rel=1e-12))


def test_user_comm_pattern_with_op(tmp_path):
    con = _ingest(tmp_path, "user_kernel.json", comm_patterns=["foo_kernel=all_gather"])
    assert con.execute("SELECT op, size_bytes, meta_source, group_size FROM collectives").fetchall() == [
        ("all_gather", None, "name_only", 2)]
    assert con.execute("SELECT name FROM events WHERE class = 'comm'").fetchall() == [
        ("my_lib::foo_kernel<float>(float*, int)",)]
    # a bare REGEX: comm, op unknown
    con2 = _ingest(tmp_path / "bare", "user_kernel.json", comm_patterns=["foo_kernel"])
    assert con2.execute("SELECT op FROM collectives").fetchall() == [(None,)]
    # without a pattern it is compute
    con3 = _ingest(tmp_path / "none", "user_kernel.json")
    assert con3.execute("SELECT count(*) FROM collectives").fetchone() == (0,)
    # the user's families apply only inside their own ingest
    assert cf.kernel_op("my_lib::foo_kernel<float>(float*, int)") == (False, None)


def test_user_comm_pattern_unknown_op_exits_2(tmp_path, capsys):
    rc = main(["ingest", str(H / "user_kernel.json"), "--store", str(tmp_path / "s"), "--comm-pattern", "foo=allgathr"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--comm-pattern" in err and "allgathr" in err and len(err.strip().splitlines()) == 1


# -- the real trace -------------------------------------------------------------------------------


def test_b200_multimem_all_reduces_are_comm_with_their_size(tmp_path):
    path = shared_trace("tracelens_b200_r0of8/eager_trace.json.gz")
    with gzip.open(path) as fh:
        events = json.load(fh)["traceEvents"]
    # expected, from the JSON alone: each symm_mem::multimem_all_reduce_'s first input, BFloat16
    ops = [e for e in events if e.get("name") == "symm_mem::multimem_all_reduce_"]
    assert {e["args"]["Input type"][0] for e in ops} == {"c10::BFloat16"}
    want = sorted(math.prod(e["args"]["Input Dims"][0]) * 2 for e in ops)
    n_kernels = sum(1 for e in events if e.get("cat") == "kernel" and "multimem_all_reduce_kernel" in e["name"])
    assert len(want) == n_kernels == 73
    store = Store(tmp_path / "store")
    ingest_paths([path], store, run_id="b200")
    con = analyses.connect(store)
    got = con.execute("SELECT size_bytes, group_size, meta_source, e.class, e.dur_ns FROM collectives c "
                      "JOIN events e USING (run_id, rank, event_id) WHERE op = 'all_reduce' ORDER BY size_bytes").fetchall()
    assert [g[0] for g in got] == want
    assert {g[1:4] for g in got} == {(8, "cpu_op_dims", "comm")}  # group "0": the 8-rank default group
    assert con.execute("SELECT count(*) FROM events WHERE name LIKE '%multimem_all_reduce_kernel%' AND class <> 'comm'"
                       ).fetchone() == (0,)
    # one rank: sync time = the kernel's (clipped) duration; busbw = S/t · 2(8−1)/8
    bw = con.execute("SELECT size_bytes, sync_time_ns, busbw_gbps FROM collective_bandwidth WHERE op = 'all_reduce'").fetchall()
    assert sorted(s for s, _, _ in bw) == want
    for s, t, b in bw:
        assert b == pytest.approx(s / t * 2 * 7 / 8, rel=1e-12)
    assert sorted(t for _, t, _ in bw) == sorted(g[4] for g in got)
