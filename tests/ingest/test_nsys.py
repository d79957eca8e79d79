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
    path, con, _ = clover
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
    rank, host, events, warnings = con.execute("SELECT rank, host, events, warnings FROM ranks").fetchone()
    assert (host, events) == ("nid008553", 1312 + 279 + 1312 + 3048)
    # the rank is the launcher's: PMI_RANK in the environment nsys recorded for the process it launched
    # (META_DATA_CAPTURE), so it is no longer "taken as rank 0" for want of one
    env = dict(
        v.split("=", 1) for (v,) in _ro(path).execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:ENVIRONMENT_VARIABLE'"
        ) if v.startswith(("PMI_RANK=", "PMI_SIZE="))
    )
    assert env == {"PMI_RANK": '"0"', "PMI_SIZE": '"1"'}
    assert rank == 0 and not any("taken as rank 0" in w for w in warnings)


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


def test_all_gather_without_group_size_or_world_has_no_k(tmp_path):
    p = _nccl_file(tmp_path / "rank0.sqlite", comm_init=False)
    con, _ = _ingest(tmp_path, p)
    rows = dict(con.execute("SELECT op, (size_bytes, meta_source, approx, group_size) FROM collectives").fetchall())
    assert rows["all_reduce"] == (4096, "record_param_comms", False, None)
    # one file that declares no world size: k unknown (null, not 1), so the shard's S is unknown too
    assert rows["all_gather"] == (None, "cpu_op_dims", False, None)


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


# -- whole-job reports: several processes in one file, several files in one run ------------

import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from tests.conftest import FIXTURES  # noqa: E402

_spec = importlib.util.spec_from_file_location("make_nsys_job", FIXTURES / "nsys_job" / "make_nsys_job.py")
mk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk)


def _union(iv):
    """Merged intervals of [(start, end)] — written here, independent of tracekit.timeline.intervals."""
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(iv):
    return sum(e - s for s, e in iv)


def _intersection(a, b):
    return _length([(max(s1, s2), min(e1, e2)) for s1, e1 in a for s2, e2 in b if min(e1, e2) > max(s1, s2)])


def _kernels_by_process(path):
    """{pid: ([comm intervals], [compute intervals])} from the export, NCCL by kernel name."""
    db = _ro(path)
    out = {}
    for pid, name, s, e in db.execute(
        """SELECT (k.globalPid >> 24) & 16777215, n.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k
           JOIN StringIds n ON n.id = k.demangledName"""
    ):
        comm, comp = out.setdefault(pid, ([], []))
        (comm if name.startswith("nccl") else comp).append((s, e))
    return out


def _env_ranks(path):
    """{pid: RANK} from META_DATA_CAPTURE's PROCESS_<k>:PID / ENVIRONMENT_VARIABLE rows."""
    rows = _ro(path).execute("SELECT name, value FROM META_DATA_CAPTURE").fetchall()
    pids = {n.split(":")[0]: int(v) for n, v in rows if n.endswith(":PID")}
    return {pids[n.split(":")[0]]: int(v.split("=")[1].strip('"')) for n, v in rows
            if n.endswith(":ENVIRONMENT_VARIABLE") and v.startswith("RANK=")}


def _gpu_of_rank(con):
    return dict(con.execute("SELECT rank, min(device) FROM events WHERE track_kind = 'gpu_stream' GROUP BY rank").fetchall())


def test_job_report_gives_one_rank_per_process_and_per_process_overlap(tmp_path):
    p = mk.make_job(tmp_path / "job.sqlite")
    con, _ = _ingest(tmp_path, p)
    by_pid = _kernels_by_process(p)
    env = _env_ranks(p)
    assert sorted(env.items()) == [(5001, 0), (5002, 1)]
    expected = {}
    for pid, (comm, comp) in by_pid.items():
        c, k = _union(comm), _union(comp)
        expected[env[pid]] = (_length(c), _length(k), _intersection(c, k))
    assert expected == {0: (1500, 1900, 0), 1: (600, 1200, 0)}  # the NOTE's numbers
    got = con.execute("SELECT rank, comm_ns, compute_ns, overlap_ns, overlap_ratio FROM overlap_by_rank ORDER BY rank").fetchall()
    assert [(r, c, k, o) for r, c, k, o, _ in got] == [(r, *expected[r]) for r in (0, 1)]
    assert [x[4] for x in got] == [0.0, 0.0]
    # read as one rank (the reader before): NCCL on GPU 0 overlaps compute on GPU 1 in wall time
    comm = _union([iv for c, _ in by_pid.values() for iv in c])
    comp = _union([iv for _, k in by_pid.values() for iv in k])
    assert (_length(comm), _length(comp), _intersection(comm, comp)) == (1500, 3100, 900)
    # ranks on the report's clock, one host; world of 2; the launcher's CPU row left out, said so
    rows = con.execute("SELECT rank, host, clock_offset_ns, warnings FROM ranks ORDER BY rank").fetchall()
    assert [(r, h, o) for r, h, o, _ in rows] == [(0, "node-a", 0), (1, "node-a", 0)]
    assert rows[0][3] == ["1 CPU event(s) of 1 process(es) without GPU work (e.g. the launcher) left out"]
    assert rows[1][3] == []
    assert con.execute("SELECT world_size, backend, source FROM runs").fetchone() == (2, "nccl", "nsys")
    assert _gpu_of_rank(con) == {0: 0, 1: 1}
    assert con.execute("SELECT count(*) FROM events WHERE name = 'launch'").fetchone()[0] == 0
    # every event of a rank is on its own process' threads or its own GPU
    assert con.execute(
        "SELECT rank, track_kind, list(DISTINCT device ORDER BY device) FROM events GROUP BY ALL ORDER BY ALL"
    ).fetchall() == [(0, "cpu_thread", [5001]), (0, "gpu_stream", [0]), (1, "cpu_thread", [5002]), (1, "gpu_stream", [1])]


def test_job_report_correlation_ids_link_within_their_process(tmp_path):
    p = mk.make_job(tmp_path / "job.sqlite")
    db = _ro(p)
    # the file repeats correlation ids across processes (each process numbers its own)
    per_corr = db.execute(
        "SELECT correlationId, count(DISTINCT (globalPid >> 24) & 16777215) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1"
    ).fetchall()
    assert per_corr == [(1, 2), (2, 2), (3, 2), (4, 2)]
    # the launch each GPU op should link to: same process, same correlation id (from the file)
    want = {}
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        for pid, dev, corr, s, ls in db.execute(
            f"""SELECT (k.globalPid >> 24) & 16777215, k.deviceId, k.correlationId, k.start, r.start FROM {t} k
                JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                 AND (r.globalTid >> 24) & 16777215 = (k.globalPid >> 24) & 16777215"""
        ):
            want[(dev, corr, mk.UTC_START + s)] = (pid, mk.UTC_START + ls)
    con, _ = _ingest(tmp_path, p)
    got = {
        (dev, corr, ts): (lpid, lts)
        for dev, corr, ts, lpid, lts, lcorr in con.execute(
            """SELECT g.device, g.correlation, g.ts_ns, l.device, l.ts_ns, l.correlation FROM events g
               JOIN events l ON l.rank = g.rank AND l.event_id = g.launch_event_id
               WHERE g.track_kind = 'gpu_stream'"""
        ).fetchall()
        if lcorr == corr
    }
    assert len(want) == 10 and got == want
    warnings = [w for (ws,) in con.execute("SELECT warnings FROM ranks").fetchall() for w in ws]
    assert not any("before their own launch" in w for w in warnings)


def test_job_report_nvtx_metadata_on_nccl_kernels(tmp_path):
    p = mk.make_job(tmp_path / "job.sqlite")
    con, _ = _ingest(tmp_path, p)
    # from the payloads: all-reduce 1 MiB; the group's two 4096 B sends: all-to-all S = 8192; k = 2 (the
    # communicator's ncclCommInitRank); wire: 2(k-1)/k·S and (k-1)/k·S (DESIGN.md / alpha-beta.md)
    k, ar, a2a = 2, 1 << 20, 2 * 4096
    expect = []
    for rank, (ar_ts, ar_end) in ((0, (3100, 4100)), (1, (4000, 4100))):
        expect.append((rank, "all_reduce", ar, 2 * (k - 1) * ar // k, k, "nccl-comm-c0ffee", 0, "record_param_comms",
                       mk.UTC_START + ar_ts, ar_end - ar_ts))
        expect.append((rank, "all_to_all", a2a, (k - 1) * a2a // k, k, "nccl-comm-c0ffee", 1, "record_param_comms",
                       mk.UTC_START + 5200, 500))
    assert con.execute(
        """SELECT rank, op, size_bytes, wire_bytes, group_size, pg_name, seq, meta_source, ts_ns, dur_ns
           FROM collectives ORDER BY rank, ts_ns"""
    ).fetchall() == expect
    assert con.execute("SELECT op, complete, disagree FROM collective_instances ORDER BY seq").fetchall() == [
        ("all_reduce", True, False), ("all_to_all", True, False)
    ]
    warnings = [w for (ws,) in con.execute("SELECT warnings FROM ranks").fetchall() for w in ws]
    assert not any("no collective metadata" in w for w in warnings)


@pytest.mark.parametrize(
    "env, comm_init, swap, swap_gpus, gpu_of_rank, said",
    [
        (True, True, True, False, {0: 1, 1: 0}, None),  # RANK in the environment, against the GPU order
        (False, True, True, False, {0: 1, 1: 0}, "taken from NCCL's ncclCommInitRank"),  # NCCL's Rank
        (False, False, True, False, {0: 0, 1: 1}, "assigned by CUDA device and process order"),  # GPU order
        (False, False, False, True, {0: 0, 1: 1}, "assigned by CUDA device and process order"),  # GPU, not pid
    ],
)
def test_job_report_rank_sources(tmp_path, env, comm_init, swap, swap_gpus, gpu_of_rank, said):
    p = mk.make_job(tmp_path / "job.sqlite", env=env, comm_init=comm_init, swap=swap, swap_gpus=swap_gpus)
    con, _ = _ingest(tmp_path, p)
    assert _gpu_of_rank(con) == gpu_of_rank
    if swap_gpus:  # rank 0 is the process on GPU 0: B, pid 5002
        assert con.execute("SELECT DISTINCT device FROM events WHERE rank = 0 AND track_kind = 'cpu_thread'").fetchall() == [
            (5002,)
        ]
    rows = con.execute("SELECT rank, warnings FROM ranks ORDER BY rank").fetchall()
    for rank, warnings in rows:
        hits = [w for w in warnings if "rank" in w and ("NCCL" in w or "order" in w)]
        if said is None:
            assert hits == []
        else:
            assert len(hits) == 1 and hits[0].startswith(f"rank {rank} {said}")


def test_two_single_process_reports_make_one_run(tmp_path):
    d = tmp_path / "job"
    a = mk.make_rank_report(d / "report_a.sqlite", "A")
    b = mk.make_rank_report(d / "report_b.sqlite", "B", shift=1000)
    # the ranks, from SLURM_PROCID in each report's recorded launch environment
    env = {}
    for f in (a, b):
        (v,) = _ro(f).execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE value LIKE 'SLURM_PROCID=%'"
        ).fetchone()
        env[f.name] = int(v.split("=")[1].strip('"'))
    assert env == {"report_a.sqlite": 0, "report_b.sqlite": 1}
    con, _ = _ingest(tmp_path, d)
    assert con.execute("SELECT rank, host, clock_offset_ns, source_path FROM ranks ORDER BY rank").fetchall() == [
        (0, "node-a", 0, str(a.resolve())), (1, "node-b", 0, str(b.resolve()))
    ]
    assert con.execute("SELECT world_size, backend FROM runs").fetchone() == (2, "nccl")
    # B's session started 1000 ns earlier: on the UTC clock its kernels sit where the job's do
    assert con.execute(
        "SELECT min(ts_ns) FROM events WHERE rank = 1 AND category = 'kernel'"
    ).fetchone()[0] == mk.UTC_START + 3000
    assert con.execute("SELECT op, ranks_seen, complete FROM collective_instances ORDER BY seq").fetchall() == [
        ("all_reduce", 2, True), ("all_to_all", 2, True)
    ]
    assert [r[1:] for r in con.execute(
        "SELECT rank, comm_ns, overlap_ns FROM overlap_by_rank ORDER BY rank").fetchall()] == [(1500, 0), (600, 0)]


def test_reports_without_any_rank_are_numbered_in_file_order(tmp_path):
    d = tmp_path / "job"
    mk.make_rank_report(d / "n1.sqlite", "B", env=False)
    mk.make_rank_report(d / "n2.sqlite", "A", env=False)
    with sqlite3.connect(d / "n1.sqlite") as db:  # no ncclCommInitRank either: nothing tells the rank
        db.execute("DELETE FROM NVTX_EVENTS WHERE text = 'ncclCommInitRank'")
    with sqlite3.connect(d / "n2.sqlite") as db:
        db.execute("DELETE FROM NVTX_EVENTS WHERE text = 'ncclCommInitRank'")
    con, _ = _ingest(tmp_path, d)
    rows = con.execute("SELECT rank, source_path, warnings FROM ranks ORDER BY rank").fetchall()
    assert [(r, Path(sp).name) for r, sp, _ in rows] == [(0, "n1.sqlite"), (1, "n2.sqlite")]
    assert all(any("in file order" in w for w in ws) for _, _, ws in rows)
    assert _gpu_of_rank(con) == {0: 1, 1: 0}  # n1 holds B (GPU 1)


def test_committed_fixtures_are_what_the_maker_writes(tmp_path):
    made = {
        "job_2proc.sqlite": mk.make_job(tmp_path / "job_2proc.sqlite"),
        "per_rank/report_a.sqlite": mk.make_rank_report(tmp_path / "a.sqlite", "A"),
        "per_rank/report_b.sqlite": mk.make_rank_report(tmp_path / "b.sqlite", "B", shift=1000),
    }
    for rel, path in made.items():
        with sqlite3.connect(FIXTURES / "nsys_job" / rel) as c1, sqlite3.connect(path) as c2:
            assert list(c1.iterdump()) == list(c2.iterdump()), rel


def test_nsys_rep_without_nsys_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"\x00not sqlite, an nsys report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    store = tmp_path / "store"
    assert main(["ingest", str(rep), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(rep) in err
    assert "nsys export --type sqlite --output job.sqlite job.nsys-rep" in err
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())


def test_nsys_rep_is_exported_with_nsys_when_on_path(tmp_path, monkeypatch):
    made = mk.make_job(tmp_path / "made.sqlite")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "nsys-args.txt"
    fake = bindir / "nsys"
    # a stand-in for nsys: records its arguments and writes the export where --output says
    fake.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        f"open({str(log)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "a = sys.argv[1:]\n"
        f"shutil.copy({str(made)!r}, a[a.index('--output') + 1])\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"report bytes")
    con, _ = _ingest(tmp_path, rep)
    args = log.read_text().split()
    assert args[:5] == ["export", "--type", "sqlite", "--force-overwrite", "true"] and args[-1] == str(rep)
    assert con.execute("SELECT rank, source_path FROM ranks ORDER BY rank").fetchall() == [
        (0, str(rep.resolve())), (1, str(rep.resolve()))
    ]
    assert not Path(args[args.index("--output") + 1]).exists()  # the temporary export is removed


def test_job_report_reingest_is_a_no_op(tmp_path):
    from tests.conftest import store_snapshot

    p = mk.make_job(tmp_path / "job.sqlite")
    store = Store(tmp_path / "store")
    rid = ingest_paths([p], store)
    before = store_snapshot(tmp_path / "store")
    assert ingest_paths([p], store) == rid  # same file (its two ranks share its sha256): the same run
    assert store_snapshot(tmp_path / "store") == before


def test_nccl_send_outside_a_group_keeps_its_size_but_not_the_communicator_as_group(tmp_path):
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.nvtx("NCCL", 10, None, event_type=75, domain=1)
    f.nvtx("ncclAllReduce", 100, 300, domain=1, json_text='{"NCCL communicator ID": 255, "Message size [bytes]": 64}')
    f.api("cudaLaunchKernel_v7000", 150, 160, 1)
    f.kernel(NCCL_AR, 1000, 2000, 20, 1)
    f.nvtx("ncclSend", 400, 600, domain=1,
           json_text='{"NCCL communicator ID": 255, "Message size [bytes]": 4096, "Peer rank": 1}')
    f.api("cudaLaunchKernel_v7000", 450, 460, 2)
    f.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 3000, 4000, 20, 2)
    con, _ = _ingest(tmp_path, f.close())
    rows = con.execute("SELECT op, size_bytes, pg_name = 'nccl-comm-ff' FROM collectives ORDER BY ts_ns").fetchall()
    # the all-reduce's group is its communicator (0xff); the send's size is its message, its group is not
    assert rows == [("all_reduce", 64, True), ("send", 4096, False)]


def test_backend_is_nccl_with_nccl_kernels_even_without_algo_or_devices(tmp_path):
    """Only a SendRecv kernel (no algorithm in its name) and no TARGET_INFO_GPU rows: the reader
    before took such a run for gloo; the NCCL kernel says nccl."""
    f = _Nsys(tmp_path / "rank0.sqlite")
    f.db.execute("DELETE FROM TARGET_INFO_GPU")
    f.api("cudaLaunchKernel_v7000", 100, 200, 1)
    f.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 1000, 2000, 20, 1)
    con, _ = _ingest(tmp_path, f.close())
    assert con.execute("SELECT algo FROM collectives").fetchall() == [(None,)]
    assert con.execute("SELECT backend FROM runs").fetchone() == ("nccl",)


def test_job_report_nccl_send_recv_pair_across_ranks(tmp_path):
    p = mk.make_job(tmp_path / "job.sqlite", p2p=True)
    con, _ = _ingest(tmp_path, p)
    # A (rank 0) ncclSend peer 1, B (rank 1) ncclRecv peer 0, 2048 B: one p2p group 0->1; S = 2048, wire S / 0
    assert con.execute(
        """SELECT rank, op, pg_name, pg_ranks, group_size, size_bytes, wire_bytes FROM collectives
           WHERE op IN ('send', 'recv') ORDER BY rank"""
    ).fetchall() == [(0, "send", "p2p:0->1", [0, 1], 2, 2048, 2048), (1, "recv", "p2p:0->1", [0, 1], 2, 2048, 0)]
    assert con.execute(
        "SELECT ranks_seen, complete, disagree FROM collective_instances WHERE pg_name = 'p2p:0->1'"
    ).fetchall() == [(2, True, False)]


def test_nsys_rep_export_failure_is_one_line_and_store_unchanged(tmp_path, capsys, monkeypatch):
    from tests.conftest import store_snapshot

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nsys"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('Error: report is corrupt\\n')\nsys.exit(1)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rep = tmp_path / "job.nsys-rep"
    rep.write_bytes(b"broken")
    store = tmp_path / "store"
    before = store_snapshot(store)
    assert main(["ingest", str(rep), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(rep) in err and "nsys export failed: Error: report is corrupt" in err
    assert store_snapshot(store) == before


def test_directory_takes_the_export_not_its_report(tmp_path):
    from tracekit.ingest import expand_paths

    d = tmp_path / "d"
    d.mkdir()
    (d / "job.nsys-rep").write_bytes(b"r")
    (d / "job.sqlite").write_bytes(b"s")
    (d / "other.nsys-rep").write_bytes(b"r")
    assert [p.name for p in expand_paths([d])] == ["job.sqlite", "other.nsys-rep"]
