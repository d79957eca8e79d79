"""Nsight Systems SQLite ingest: the two real exports, hand-made nsys-shaped files, bad input.

The per-file facts are computed here with direct sqlite3 queries on the export
itself (independent of the reader), then compared with what landed in the store.
"""

from __future__ import annotations

from tracekit import analyses
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import shared_trace
from tracekit.cli import main
from tracekit.errors import FileError
from tracekit.ingest import ingest_paths
from tracekit.store import Store

SAXPY = "pipit_nsys_sqlite/saxpy-mpi-cuda_nsys_perlmutter0.sqlite"  # export schema 2.9.1
CLOVER = "pipit_nsys_sqlite/perlmutter-cloverleaf-cuda.sqlite"  # export schema 3.13.2


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _ingest(tmp_path, path, **kw):
    store = Store(tmp_path / "store")
    rid = ingest_paths([path], store, **kw)
    return analyses.connect(store), rid


# -- the real exports ---------------------------------------------------------------


@pytest.fixture(scope="module")
def saxpy(tmp_path_factory):
    p = shared_trace(SAXPY)
    con, rid = _ingest(tmp_path_factory.mktemp("saxpy"), p)
    return p, con, rid


@pytest.fixture(scope="module")
def clover(tmp_path_factory):
    p = shared_trace(CLOVER)
    con, rid = _ingest(tmp_path_factory.mktemp("clover"), p)
    return p, con, rid


def _count(con, where: str) -> int:
    return con.execute(f"SELECT count(*) FROM events WHERE {where}").fetchone()[0]


@pytest.mark.parametrize("which", ["saxpy", "clover"])
def test_real_export_counts_match_direct_queries(which, request):
    path, con, _ = request.getfixturevalue(which)
    db = _ro(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def bad(t):  # what the reader must quarantine
        return db.execute(f"SELECT count(*) FROM {t} WHERE start <= 0 OR end IS NULL OR end < start").fetchone()[0]

    nk = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    nm = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
    assert _count(con, "category = 'kernel'") == nk - bad("CUPTI_ACTIVITY_KIND_KERNEL")
    assert _count(con, "category = 'memcpy'") == nm - bad("CUPTI_ACTIVITY_KIND_MEMCPY")
    nvtx = 0
    if "NVTX_EVENTS" in tables:
        nvtx = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL").fetchone()[0]
    assert _count(con, "category = 'nvtx'") == nvtx
    # one API record per call (schema 2.x exports with backtraces hold two rows per call)
    calls = db.execute("SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    assert _count(con, "category IN ('runtime', 'driver')") == calls
    # every kernel links to its launch call with the same correlation id
    rows = con.execute(
        """SELECT k.correlation, l.correlation, l.name FROM events k
           LEFT JOIN events l ON l.event_id = k.launch_event_id AND l.rank = k.rank
           WHERE k.category = 'kernel'"""
    ).fetchall()
    assert rows and all(kc == lc and ln == "cudaLaunchKernel" for kc, lc, ln in rows)
    # the device name the run reports is the GPU the kernels ran on
    dev = db.execute(
        "SELECT g.name FROM TARGET_INFO_GPU g WHERE g.id = (SELECT min(deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
    ).fetchone()[0]
    assert con.execute("SELECT device_name, source FROM runs").fetchone() == (dev, "nsys")
    # times: the file's ns plus the session's UTC start
    base = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    first = db.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert con.execute("SELECT min(ts_ns) FROM events WHERE category = 'kernel'").fetchone()[0] == first + base
    # no NCCL in either file: no comm, and the report says so
    assert con.execute("SELECT count(*) FROM collectives").fetchone()[0] == 0
    assert con.execute("SELECT comm_ns, overlap_ratio FROM overlap_by_rank").fetchone() == (0, None)


def test_saxpy_facts(saxpy):
    _, con, _ = saxpy
    # checked by hand: 5 saxpy kernels, 15 memcpy (10 HtoD, 5 DtoH), 22 NVTX ranges, MPI rank 0 on host nid001608
    assert _count(con, "category = 'kernel' AND name LIKE 'saxpy(%'") == 5
    assert _count(con, "name = 'Memcpy HtoD (Pageable -> Device)'") == 10
    assert _count(con, "name = 'Memcpy DtoH (Device -> Pageable)'") == 5
    assert _count(con, "category = 'nvtx' AND name = 'MPI_Send'") == 10
    assert _count(con, "category = 'nvtx' AND name = 'saxpy'") == 5
    assert con.execute("SELECT rank, host, events, events_quarantined FROM ranks").fetchone() == (0, "nid001608", 99, 0)
    # runtime names lose their _vNNNN suffix (Kineto spelling)
    assert _count(con, "name = 'cudaLaunchKernel'") == 5 and _count(con, "name LIKE '%\\_v%' ESCAPE '\\'") == 0


def test_cloverleaf_facts(clover):
    _, con, _ = clover
    # checked by hand: 1312 kernels (968 par_ranged1d, 331 par_ranged2d, 13 par_reduce) on device 0 stream 7,
    # 279 memcpy, 1312 synchronisations without a stream (CPU side), 3048 API calls, no NVTX table
    assert con.execute(
        "SELECT device, track, count(*) FROM events WHERE category = 'kernel' GROUP BY ALL"
    ).fetchall() == [(0, 7, 1312)]
    assert _count(con, "category = 'kernel' AND name LIKE '%par_ranged1d_kernel%'") == 968
    assert _count(con, "category = 'kernel' AND name LIKE '%par_ranged2d_kernel%'") == 331
    assert _count(con, "category = 'kernel' AND name LIKE '%par_reduce_kernel%'") == 13
    assert con.execute(
        "SELECT track_kind, class, count(*) FROM events WHERE category = 'sync' GROUP BY ALL"
    ).fetchall() == [("cpu_thread", "sync", 1312)]
    # the CPU-side syncs sit on the thread that called cudaDeviceSynchronize (pid 1701896 = tid)
    assert con.execute("SELECT DISTINCT device, track FROM events WHERE category = 'sync'").fetchall() == [
        (1701896, 1701896)
    ]
    assert _count(con, "category IN ('runtime', 'driver')") == 3048
    assert _count(con, "category = 'nvtx'") == 0
    host, events, warnings = con.execute("SELECT host, events, warnings FROM ranks").fetchone()
    assert (host, events) == ("nid008553", 1312 + 279 + 1312 + 3048)
    assert any("taken as rank 0" in w for w in warnings)


# -- hand-made nsys-shaped exports ----------------------------------------------------

PID, TID = 4242, 4243
GTID = (1 << 56) | (PID << 24) | TID  # nsys packs (vm id, pid, tid) into globalTid
GPID = (1 << 56) | (PID << 24)


class _Nsys:
    """Builds a minimal file with the tables and columns the reader uses (schema 3.x spelling)."""

    def __init__(self, path: Path):
        self.path = path
        self.db = sqlite3.connect(path)
        self.db.executescript(
            """
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
            CREATE TABLE TARGET_INFO_GPU (id INT, name TEXT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, contextId INT,
                streamId INT, correlationId INT, globalPid INT, demangledName INT, shortName INT,
                mangledName INT, graphNodeId INT);
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
                correlationId INT, nameId INT, returnValue INT, callchainId INT);
            CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, rangeId INT, category INT, color INT,
                text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT, uint64Value INT,
                int64Value INT, doubleValue REAL, uint32Value INT, int32Value INT, floatValue REAL,
                jsonTextId INT, jsonText TEXT);
            INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.13.2');
            INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100 80GB HBM3');
            """
        )
        self.strings: dict[str, int] = {}

    def s(self, text: str) -> int:
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
            self.db.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[text], text))
        return self.strings[text]

    def kernel(self, name, start, end, stream, corr, node=None):
        self.db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, ?, ?, ?, ?, ?, ?, ?)",
            (start, end, stream, corr, GPID, self.s(name), self.s(name.split("(")[0]), self.s("_Z" + name[:8]), node),
        )

    def api(self, name, start, end, corr):
        self.db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, 0, NULL)",
            (start, end, GTID, corr, self.s(name)),
        )

    def nvtx(self, text, start, end, event_type=59, domain=0, json_text=None):
        self.db.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId, jsonText) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (start, end, event_type, text, GTID, domain, json_text),
        )

    def close(self) -> Path:
        self.db.commit()
        self.db.close()
        return self.path


NCCL_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"


def _nccl_file(path: Path, *, comm_init: bool = True, nranks: int = 4) -> Path:
    """One rank: an NCCL all-reduce launched inside its ncclAllReduce NVTX range, a GEMM overlapping it,
    then an all-gather. Times in ns (no session start table, so they are stored as written).

        CPU  NVTX ncclAllReduce [1000, 1300] ⊃ cudaLaunchKernel [1100, 1200] (corr 7)
             cudaLaunchKernel [1400, 1450] (corr 8)
             NVTX ncclAllGather [5000, 5300] ⊃ cudaLaunchKernel [5100, 5200] (corr 9)
        GPU  stream 20: NCCL all-reduce [2000, 3000];  stream 7: GEMM [2600, 3400]
             stream 20: NCCL all-gather [6000, 6500]
    comm = 1000 + 500, overlap = 400 → ratio 400 / 1500.
    """
    f = _Nsys(path)
    f.nvtx("NCCL", 10, None, event_type=75, domain=1)
    if comm_init:
        f.nvtx("ncclCommInitRank", 100, 900, domain=1, json_text=f'{{"Rank": 0, "No. of ranks": {nranks}, "CUDA device": 0}}')
    f.nvtx("ncclAllReduce", 1000, 1300, domain=1, json_text='{"Message size [bytes]": 4096, "Reduction operation": "Sum"}')
    f.api("cudaLaunchKernelExC_v11060", 1100, 1200, 7)
    f.kernel(NCCL_AR, 2000, 3000, 20, 7)
    f.api("cudaLaunchKernel_v7000", 1400, 1450, 8)
    f.kernel(GEMM, 2600, 3400, 7, 8)
    # the generic nsys payload layout: {"data": [{field: {type: value}}]}
    f.nvtx("ncclAllGather", 5000, 5300, domain=1, json_text='{"data": [{"Message size [bytes]": {"uint64": 1024}}]}')
    f.api("cudaLaunchKernelExC_v11060", 5100, 5200, 9)
    f.kernel(NCCL_AG, 6000, 6500, 20, 9)
    return f.close()


def test_nccl_nvtx_range_gives_op_and_size_and_overlap(tmp_path):
    p = _nccl_file(tmp_path / "rank0.sqlite")
    con, rid = _ingest(tmp_path, p)
    rows = con.execute(
        "SELECT op, size_bytes, wire_bytes, dtype, group_size, meta_source, approx, ts_ns, dur_ns FROM collectives ORDER BY ts_ns"
    ).fetchall()
    assert rows == [
        # S = the message size; wire = 2(k-1)/k·S with k = 4 from ncclCommInitRank
        ("all_reduce", 4096, 6144, "byte", 4, "record_param_comms", False, 2000, 1000),
        # NCCL's all-gather message is one rank's input: S = 4 × 1024, wire = 3/4·S
        ("all_gather", 4096, 3072, "byte", 4, "record_param_comms", False, 6000, 500),
    ]
    comm, compute, overlap, ratio = con.execute(
        "SELECT comm_ns, compute_ns, overlap_ns, overlap_ratio FROM overlap_by_rank"
    ).fetchone()
    assert (comm, compute, overlap) == (1500, 800, 400)
    assert ratio == pytest.approx(400 / 1500)
    # the NVTX ranges are stored on the launching thread, and the run is an nsys run on the H100
    assert con.execute("SELECT DISTINCT device, track FROM events WHERE category = 'nvtx'").fetchall() == [(PID, TID)]
    assert con.execute("SELECT source, device_name, backend FROM runs").fetchone() == (
        "nsys", "NVIDIA H100 80GB HBM3", "nccl"
    )
    # driver/runtime launch links by correlation
    assert con.execute(
        "SELECT count(*) FROM events WHERE category = 'kernel' AND launch_event_id IS NOT NULL"
    ).fetchone()[0] == 3


def test_all_gather_without_group_size_is_scaled_by_world_and_flagged(tmp_path):
    p = _nccl_file(tmp_path / "rank0.sqlite", comm_init=False)
    con, _ = _ingest(tmp_path, p)
    rows = dict(con.execute("SELECT op, (size_bytes, meta_source, approx) FROM collectives").fetchall())
    assert rows["all_reduce"] == (4096, "record_param_comms", False)
    # world size 1 (one file): the shard × 1, marked approximate
    assert rows["all_gather"] == (1024, "cpu_op_dims", True)


def test_nccl_kernel_outside_any_range_is_name_only(tmp_path):
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.api("cudaLaunchKernel_v7000", 100, 200, 1)
    f.kernel(NCCL_AR, 1000, 2000, 20, 1)
    con, _ = _ingest(tmp_path, f.close())
    assert con.execute("SELECT op, size_bytes, meta_source FROM collectives").fetchall() == [("all_reduce", None, "name_only")]


def test_quarantine_counts_bad_rows(tmp_path):
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.api("cudaLaunchKernel_v7000", 100, 200, 1)
    f.kernel(GEMM, 1000, 2000, 7, 1)
    f.kernel(GEMM, 0, 50, 7, 2)  # start 0
    f.kernel(GEMM, 3000, 2999, 7, 3)  # end before start
    f.nvtx("unfinished", 500, None)  # a range with no end
    con, _ = _ingest(tmp_path, f.close())
    events, quarantined = con.execute("SELECT events, events_quarantined FROM ranks").fetchone()
    assert (events, quarantined) == (2, 3)
    assert _count(con, "category = 'kernel'") == 1


def test_cuda_graph_only_capture_warns(tmp_path):
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.db.executescript(
        """CREATE TABLE CUDA_GRAPH_EVENTS (start INT, end INT, nameId INT, globalTid INT, correlationId INT,
               graphId INT, originalGraphNodeId INT, graphNodeId INT);
           INSERT INTO CUDA_GRAPH_EVENTS VALUES (50, 60, 1, 0, 3, 1, NULL, 1);"""
    )
    f.api("cudaGraphLaunch_v10000", 100, 200, 5)
    f.api("cudaGraphLaunch_v10000", 300, 400, 6)
    f.api("cudaLaunchKernel_v7000", 500, 600, 7)
    f.kernel(GEMM, 1000, 2000, 7, 7)  # an eager kernel outside the graphs
    con, _ = _ingest(tmp_path, f.close())
    (warnings,) = con.execute("SELECT warnings FROM ranks").fetchone()
    hit = [w for w in warnings if "CUDA graphs" in w]
    assert len(hit) == 1 and "2 graph launch(es)" in hit[0] and "invisible" in hit[0]


def test_cuda_graph_with_node_level_kernels_does_not_warn(tmp_path):
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.api("cudaGraphLaunch_v10000", 100, 200, 5)
    f.kernel(GEMM, 1000, 2000, 7, 5, node=11)
    f.kernel(NCCL_AR, 2000, 2500, 20, 5, node=12)
    con, _ = _ingest(tmp_path, f.close())
    (warnings,) = con.execute("SELECT warnings FROM ranks").fetchone()
    assert not any("CUDA graphs" in w for w in warnings)
    assert _count(con, "class = 'comm'") == 1


def test_graph_trace_table_warns_and_keeps_graph_spans(tmp_path):
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.db.executescript(
        """CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INT, end INT, deviceId INT, contextId INT,
               streamId INT, correlationId INT, globalPid INT, graphId INT, graphExecId INT);
           INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (1000, 5000, 0, 1, 7, 5, 0, 3, 1);"""
    )
    f.api("cudaGraphLaunch_v10000", 100, 200, 5)
    con, _ = _ingest(tmp_path, f.close())
    (warnings,) = con.execute("SELECT warnings FROM ranks").fetchone()
    assert any("1 whole-graph execution(s)" in w and "invisible" in w for w in warnings)
    assert con.execute(
        "SELECT name, class, ts_ns, dur_ns, launch_event_id IS NOT NULL FROM events WHERE category = 'cuda_graph'"
    ).fetchall() == [("CUDA Graph 3", "other", 1000, 4000, True)]


def test_sync_memset_and_profiler_steps(tmp_path):
    """Issue 3's sync case on nsys rows: NCCL [0,100] µs on one stream; on another stream a stream sync
    over [0,100] and a GEMM over [60,100] → overlap 40 %. Plus a memset, and NVTX ProfilerStep#3."""
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.db.executescript(
        """CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INT, end INT, deviceId INT, contextId INT,
               streamId INT, correlationId INT, globalPid INT, syncType INT, eventId INT);
           CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT, end INT, deviceId INT, contextId INT, streamId INT,
               correlationId INT, globalPid INT, value INT, bytes INT, graphNodeId INT, memKind INT);"""
    )
    us = 1000
    f.nvtx("ProfilerStep#3", 10, 500 * us)
    f.api("cudaLaunchKernel_v7000", 20, 30, 1)
    f.kernel(NCCL_AR, 1 * us, 101 * us, 20, 1)
    f.api("cudaStreamSynchronize_v3020", 40, 50, 2)
    f.db.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 1, 7, 2, ?, 3, 0)", (1 * us, 101 * us, GPID)
    )
    f.api("cudaLaunchKernel_v7000", 60, 70, 3)
    f.kernel(GEMM, 61 * us, 101 * us, 7, 3)
    f.api("cudaMemsetAsync_v3020", 80, 90, 4)
    f.db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (200000, 201000, 0, 1, 7, 4, ?, 0, 64, NULL, 2)", (GPID,))
    con, _ = _ingest(tmp_path, f.close())
    assert con.execute(
        "SELECT category, name, track_kind, track, class FROM events WHERE category IN ('sync', 'memset') ORDER BY 1"
    ).fetchall() == [("memset", "Memset (Device)", "gpu_stream", 7, "memory"), ("sync", "Stream Sync", "gpu_stream", 7, "sync")]
    assert con.execute("SELECT overlap_ratio FROM overlap_by_rank").fetchone()[0] == pytest.approx(0.4)
    assert con.execute("SELECT DISTINCT step FROM events WHERE track_kind = 'gpu_stream'").fetchall() == [(3,)]


def test_rank_from_file_name(tmp_path):
    f = _Nsys(tmp_path / "job_rank3.sqlite")
    f.api("cudaLaunchKernel_v7000", 100, 200, 1)
    f.kernel(GEMM, 1000, 2000, 7, 1)
    con, _ = _ingest(tmp_path, f.close())
    assert con.execute("SELECT rank FROM ranks").fetchall() == [(3,)]


def test_two_rank_files_make_one_run(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1):
        _nccl_file(d / f"rank{r}.sqlite", nranks=2)
    con, _ = _ingest(tmp_path, d)
    assert con.execute("SELECT world_size, source FROM runs").fetchone() == (2, "nsys")
    assert con.execute(
        "SELECT count(*), bool_and(complete) FROM collective_instances"
    ).fetchone() == (2, True)


# -- bad input ------------------------------------------------------------------------


def _bad_files(tmp_path) -> dict[str, tuple[Path, str]]:
    out = {}
    p = tmp_path / "other.sqlite"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE people (name TEXT)")
    db.commit()
    db.close()
    out["not nsys"] = (p, "not an Nsight Systems export")
    p = tmp_path / "garbage.sqlite"
    p.write_bytes(bytes(range(256)) * 8)
    out["garbage"] = (p, "not an SQLite database")
    p = tmp_path / "header_only.sqlite"
    p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    out["bad header"] = (p, "SQLite")
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    out["empty"] = (p, "empty file")
    return out


def _truncated_real(tmp_path) -> Path:
    src = shared_trace(CLOVER)
    data = src.read_bytes()
    p = tmp_path / "truncated.sqlite"
    p.write_bytes(data[: len(data) // 3])
    return p


@pytest.mark.parametrize("case", ["not nsys", "garbage", "bad header", "empty"])
def test_bad_sqlite_raises_file_error(tmp_path, case):
    p, text = _bad_files(tmp_path)[case]
    with pytest.raises(FileError) as ei:
        ingest_paths([p], Store(tmp_path / "store"))
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(p)) and text in msg


def test_truncated_real_export_raises_file_error(tmp_path):
    p = _truncated_real(tmp_path)
    with pytest.raises(FileError) as ei:
        ingest_paths([p], Store(tmp_path / "store"))
    assert str(ei.value).startswith(str(p)) and "\n" not in str(ei.value)


@pytest.mark.parametrize("case", ["not nsys", "garbage", "empty"])
def test_cli_ingest_bad_sqlite_exits_2(tmp_path, case, capsys):
    p, text = _bad_files(tmp_path)[case]
    store = tmp_path / "store"
    assert main(["ingest", str(p), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(p) in err and text in err
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())


def test_cli_ingest_good_sqlite_exits_0(tmp_path):
    p = _nccl_file(tmp_path / "rank0.sqlite")
    assert main(["ingest", str(p), "--store", str(tmp_path / "store")]) == 0
