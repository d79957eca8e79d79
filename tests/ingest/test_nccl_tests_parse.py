"""The nccl-tests log parser, on the real superbench logs and on small hand-written logs."""

import json
from pathlib import Path

import pytest

from tracekit.errors import FileError
from tracekit.ingest.nccl_tests import parse_nccl_tests, strip_prefixes
from tracekit.model import busbw

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
SUPERBENCH = SHARED / "traces" / "superbench_nccl_tests_a100x8"

# Current nccl-tests layout, 4 MPI processes with one GPU each (so nThread × nGpus = 1 but the
# rank lines say 4). Written by hand; algbw = S/t/1e9 and busbw = algbw · 2·3/4, worked out as
# 1048576 B / 25.10 µs = 41.78 GB/s → ×1.5 = 62.66; 134217728 B / 520.3 µs = 257.96 → 386.94.
CURRENT_ALL_REDUCE = """\
# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 128(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid  40001 on     node01 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  40002 on     node01 device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  40003 on     node01 device  2 [0000:3a:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  40004 on     node01 device  3 [0000:5d:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    18.52    0.00    0.00       0    18.06    0.00    0.00       0
node01:40001:40001 [0] NCCL INFO Channel 00/32 : 0 1 2 3
     1048576        262144     float     sum      -1    25.10   41.78   62.66       0    24.87   42.16   63.24       0
   134217728      33554432     float     sum      -1    520.3  257.96  386.94       0    519.8  258.21  387.32     N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 149.969
#
# Collective test concluded: all_reduce_perf
"""

# Current layout with the timestamp column, no rank lines (truncated log) and no
# "Collective test starting" line: the op comes from the file name, the group from nThread × nGpus.
# reduce_scatter on 4: busbw = algbw · 3/4; 65536 B / 30.15 µs = 2.17 GB/s → 1.63.
TIMESTAMPED_REDUCE_SCATTER = """\
# nThread 1 nGpus 4 minBytes 65536 maxBytes 16777216 step: 256(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 0 graph: 0
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong           timestamp
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         %Y-%m-%d %H:%M:%S

       65536          4096     float     sum      -1    30.15    2.17    1.63    N/A    29.90    2.19    1.64    N/A  2025-03-01 10:15:02
node02:77:77 [1] NCCL WARN something harmless
    16777216       1048576     float     sum      -1    95.42  175.82  131.87    N/A    94.80  176.97  132.73    N/A  2025-03-01 10:15:03
"""


def _decimals(token: str) -> int:
    return len(token.split(".")[1]) if "." in token else 0


def _check_busbw_matches_print(path: Path, log) -> int:
    """Recompute busbw from size and the printed time with the model's factor; compare at printed precision.

    nccl-tests computes busbw from the unrounded time and prints both rounded, so the printed busbw
    must lie within busbw(t ± half a unit of t's last digit) widened by half a unit of its own last digit.
    """
    lines = path.read_text().splitlines()
    checked = 0
    for row in log.rows:
        tokens = lines[row.line - 1].split()
        if len(tokens) >= 2 and tokens[-2].count("-") == 2:  # trailing timestamp
            tokens = tokens[:-2]
        for half in (tokens[-8:-4], tokens[-4:]):
            t_txt, _algbw_txt, busbw_txt = half[0], half[1], half[2]
            t = float(t_txt)
            h_t = 0.5 * 10 ** -_decimals(t_txt)
            h_b = 0.5 * 10 ** -_decimals(busbw_txt)
            hi = busbw(log.op, row.size_bytes, (t - h_t) * 1e-6, log.group_size)
            lo = busbw(log.op, row.size_bytes, (t + h_t) * 1e-6, log.group_size)
            printed = float(busbw_txt)
            assert lo - h_b - 1e-9 <= printed <= hi + h_b + 1e-9, (path.name, row.line, half, lo, hi)
            checked += 1
    return checked


SUPERBENCH_FILES = {
    # file: (op, layout columns between type and time, rows, zero-size rows) — counted by hand
    "nccl_allreduce.log": ("all_reduce", ("redop",), 34, 2),
    "nccl_allgather.log": ("all_gather", (), 34, 5),
    "nccl_alltoall.log": ("all_to_all", ("redop",), 34, 5),
    "nccl_broadcast.log": ("broadcast", ("root",), 34, 2),
    "nccl_reduce.log": ("reduce", ("redop", "root"), 34, 2),
    "nccl_reducescatter.log": ("reduce_scatter", ("redop",), 34, 5),
}


def _superbench(name: str) -> Path:
    if not SUPERBENCH.is_dir():
        pytest.skip(f"needs the shared real traces at {SUPERBENCH} (absent in a fresh clone)")
    return SUPERBENCH / name


@pytest.mark.parametrize("name", sorted(SUPERBENCH_FILES))
def test_superbench_logs(name):
    op, middle, n_rows, n_zero = SUPERBENCH_FILES[name]
    path = _superbench(name)
    log = parse_nccl_tests(path)
    assert log.op == op and log.op_source == "filename"
    assert log.layout == "legacy"
    assert log.group_size == 8 and log.group_size_source == "rank_lines"
    assert [r[0] for r in log.ranks] == list(range(8)) and log.ranks[0][3] == "A100-SXM4-40GB"
    assert log.dtype == "float"
    assert log.params["n_gpus"] == 8 and log.params["max_bytes"] == 8589934592 and log.params["iters"] == 20
    assert log.columns[3 : 3 + len(middle)] == middle
    assert len(log.rows) == n_rows
    assert sum(r.size_bytes == 0 for r in log.rows) == n_zero
    assert log.rows[-1].size_bytes == 8 * 2**30
    assert all(r.oop_wrong is None and r.ip_wrong is None for r in log.rows)  # 'N/A'
    assert _check_busbw_matches_print(path, log) == 2 * n_rows


def test_superbench_details():
    ar = parse_nccl_tests(_superbench("nccl_allreduce.log"))
    # line 16 is 'hostname:3442:3442 [0] NCCL INFO Launch mode Parallel', so rows start at 17
    first, last = ar.rows[0], ar.rows[-1]
    assert (first.line, first.size_bytes, first.count, first.redop, first.root) == (17, 0, 0, "sum", None)
    assert (first.oop_time_us, first.ip_time_us) == (35.20, 34.05)
    assert (last.line, last.size_bytes, last.count) == (50, 8589934592, 2147483648)
    assert (last.oop_time_us, last.oop_algbw, last.oop_busbw) == (63896.0, 134.44, 235.26)
    assert (last.ip_time_us, last.ip_algbw, last.ip_busbw) == (63959.0, 134.30, 235.03)
    assert ar.avg_busbw == 68.4048
    # the old alltoall prints an empty redop field under a 'redop' header
    a2a = parse_nccl_tests(_superbench("nccl_alltoall.log"))
    assert all(r.redop is None and r.root is None for r in a2a.rows)
    assert a2a.rows[0].line == 16 and a2a.rows[0].oop_time_us == 1.63
    red = parse_nccl_tests(_superbench("nccl_reduce.log"))
    assert all(r.redop == "sum" and r.root == 0 for r in red.rows)
    bc = parse_nccl_tests(_superbench("nccl_broadcast.log"))
    assert all(r.redop is None and r.root == 0 for r in bc.rows)


def test_current_layout(tmp_path):
    path = tmp_path / "h100.log"  # the name says nothing: the op comes from the header
    path.write_text(CURRENT_ALL_REDUCE)
    log = parse_nccl_tests(path)
    assert (log.op, log.op_source, log.test_name) == ("all_reduce", "header", "all_reduce_perf")
    assert (log.group_size, log.group_size_source) == (4, "rank_lines")
    assert log.params["n_threads"] == 1 and log.params["n_gpus"] == 1
    assert (log.params["warmup_iters"], log.params["iters"], log.params["validation"]) == (1, 20, 1)
    # the library version is nccl-library=22703 = 2·10000 + 27·100 + 3
    assert log.layout == "current" and log.nccl_version == "2.27.3" and log.tests_version == "nccl-tests 2.17.6"
    assert log.ranks[3] == (3, "node01", 3, "NVIDIA H100 80GB HBM3")
    assert len(log.rows) == 3
    r = log.rows[1]
    assert (r.size_bytes, r.count, r.dtype, r.redop, r.root) == (1048576, 262144, "float", "sum", -1)
    assert (r.oop_time_us, r.oop_algbw, r.oop_busbw, r.oop_wrong) == (25.10, 41.78, 62.66, 0)
    assert (r.ip_time_us, r.ip_algbw, r.ip_busbw, r.ip_wrong) == (24.87, 42.16, 63.24, 0)
    assert log.rows[2].ip_wrong is None  # N/A
    assert log.avg_busbw == 149.969
    assert _check_busbw_matches_print(path, log) == 6


def test_timestamp_column_filename_op_and_thread_count(tmp_path):
    path = tmp_path / "reduce_scatter_perf_h100.txt"
    path.write_text(TIMESTAMPED_REDUCE_SCATTER)
    log = parse_nccl_tests(path)
    assert (log.op, log.op_source) == ("reduce_scatter", "filename")
    assert (log.group_size, log.group_size_source) == (4, "nthreads_ngpus")
    assert [r.size_bytes for r in log.rows] == [65536, 16777216]
    assert log.rows[1].ip_busbw == 132.73 and log.rows[1].ip_wrong is None
    assert _check_busbw_matches_print(path, log) == 4
    # --op names the collective only when the log and its file name do not: here it is ignored, with a warning
    forced = parse_nccl_tests(path, op="allgather")
    assert forced.op == "reduce_scatter"
    assert forced.warnings == ("reduce_scatter_perf_h100.txt benchmark run 0: --op all_gather ignored: "
                               "the file name says reduce_scatter",)


def test_not_an_nccl_tests_log(tmp_path):
    kineto = tmp_path / "rank0.json"
    kineto.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "ncclKernel", "ts": 1, "dur": 2}]}))
    with pytest.raises(FileError, match="not an nccl-tests log") as err:
        parse_nccl_tests(kineto)
    assert str(err.value).startswith(str(kineto)) and "\n" not in str(err.value)
    empty = tmp_path / "allreduce.log"
    empty.write_text("")
    with pytest.raises(FileError, match="not an nccl-tests log"):
        parse_nccl_tests(empty)
    binary = tmp_path / "allreduce.bin"
    binary.write_bytes(b"\x1f\x8b\x08\x00" + bytes(100))
    with pytest.raises(FileError, match="not an nccl-tests log"):
        parse_nccl_tests(binary)


def test_header_without_rows_and_unknown_op(tmp_path):
    header_only = "\n".join(CURRENT_ALL_REDUCE.splitlines()[:13]) + "\n"
    failed = tmp_path / "all_reduce.log"
    failed.write_text(header_only)
    with pytest.raises(FileError, match="no result rows"):
        parse_nccl_tests(failed)
    nameless = tmp_path / "results.log"
    nameless.write_text(TIMESTAMPED_REDUCE_SCATTER)
    with pytest.raises(FileError, match="which collective"):
        parse_nccl_tests(nameless)
    assert parse_nccl_tests(nameless, op="reduce_scatter").op == "reduce_scatter"


def test_missing_file(tmp_path):
    with pytest.raises(FileError, match="cannot read"):
        parse_nccl_tests(tmp_path / "nope.log")


def test_malformed_row_is_quarantined(tmp_path):
    bad = CURRENT_ALL_REDUCE.replace("    25.10   41.78", "    fast   41.78")
    path = tmp_path / "all_reduce.log"
    path.write_text(bad)
    log = parse_nccl_tests(path)
    assert [r.size_bytes for r in log.rows] == [8, 134217728]
    assert log.quarantined == ((16, "time 'fast' is not a number"),)
    assert log.warnings == ("all_reduce.log benchmark run 0 (all_reduce): 1 result row(s) quarantined "
                            "(line 16: time 'fast' is not a number)",)


def test_concatenated_runs_keep_their_own_op_and_group(tmp_path):
    # A sweep script appending two tests to one file: the second is an all_gather on 2 ranks.
    lines = CURRENT_ALL_REDUCE.replace("all_reduce_perf", "all_gather_perf").splitlines(keepends=True)
    second = "".join(line for line in lines if "Rank  2" not in line and "Rank  3" not in line)
    path = tmp_path / "sweep.log"
    path.write_text(CURRENT_ALL_REDUCE + second)
    log = parse_nccl_tests(path)
    assert (log.op, log.group_size) == ("all_reduce", 4)  # the first test's
    assert [(r.op, r.group_size) for r in log.rows] == [("all_reduce", 4)] * 3 + [("all_gather", 2)] * 3


# ---------------------------------------------------------------------------------------------
# Logs as clusters write them (fixtures/nccl_tests/, written by hand; see its NOTE.md)

NT = Path(__file__).resolve().parents[2] / "fixtures" / "nccl_tests"

# Each row read by hand from the fixture with the launcher prefixes and NCCL INFO/WARN lines taken
# out (two rows are cut by an INFO line and go on on the next line):
# (line, size, count, redop, root, oop time, algbw, busbw, #wrong, ip time, algbw, busbw, #wrong)
SLURM_TABLE = [
    (30, 8, 2, "sum", -1, 30.12, 0.00, 0.00, 0, 29.87, 0.00, 0.00, 0),
    (31, 1024, 256, "sum", -1, 31.40, 0.03, 0.06, 0, 31.22, 0.03, 0.06, 0),
    (32, 131072, 32768, "sum", -1, 45.60, 2.87, 5.39, 0, 45.10, 2.91, 5.45, 0),
    (34, 16777216, 4194304, "sum", -1, 160.0, 104.86, 196.61, 0, 158.4, 105.92, 198.59, 0),
]
MI300X_TABLE = [
    (20, 1024, 32, "none", -1, 12.50, 0.08, 0.07, 0, 12.30, 0.08, 0.07, 0),
    (21, 262144, 8192, "none", -1, 20.48, 12.80, 11.20, 0, 20.00, 13.11, 11.47, 3),
    (22, 67108864, 2097152, "none", -1, 512.0, 131.07, 114.69, 0, 508.0, 132.10, 115.59, 0),
]
H100_MD_TABLE = [
    (24, 1048576, 262144, "sum", -1, 19.20, 54.61, 95.57, 0, 19.00, 55.19, 96.58, 0),
    (25, 4194304, 1048576, "sum", -1, 38.40, 109.23, 191.15, 5, 38.10, 110.09, 192.65, 0),
    (26, 67108864, 16777216, "sum", -1, 300.0, 223.70, 391.47, 0, 298.0, 225.20, 394.10, 0),
]
A100_MD_TABLE = [
    (47, 1048576, 262144, "sum", -1, 80.00, 13.11, 13.11, 0, 79.50, 13.19, 13.19, 0),
    (48, 8388608, 2097152, "sum", -1, 400.0, 20.97, 20.97, 0, 398.0, 21.08, 21.08, 0),
    (49, 67108864, 16777216, "sum", -1, 2900.0, 23.14, 23.14, 0, 2890.0, 23.22, 23.22, 0),
]


def _table(rows):
    return [(r.line, r.size_bytes, r.count, r.redop, r.root, r.oop_time_us, r.oop_algbw, r.oop_busbw, r.oop_wrong,
             r.ip_time_us, r.ip_algbw, r.ip_busbw, r.ip_wrong) for r in rows]


def test_srun_prefixes_and_rows_cut_by_nccl_info():
    log = parse_nccl_tests(NT / "slurm-4242.out")
    assert _table(log.rows) == SLURM_TABLE
    (g,) = log.groups
    # the file name says nothing: the op comes from the command line srun ran
    assert (g.op, g.op_source, g.test_name) == ("all_reduce", "command", "all_reduce_perf")
    assert g.command == "srun -l --nodes 2 --ntasks-per-node 8 ./build/all_reduce_perf -b 8 -e 16M -f 128 -g 1"
    assert (g.group_size, g.group_size_source) == (16, "rank_lines")  # ' 0: ' .. '15: ' prefixes, 16 rank lines
    assert g.hosts == ("gpu-a01", "gpu-a02") and g.device_names == ("NVIDIA H100 80GB HBM3",)
    assert g.ranks[10] == (10, "gpu-a02", 2, "NVIDIA H100 80GB HBM3")
    # nccl-library=21903 → 2.19.3 (the INFO line's 'NCCL version 2.19.3+cuda12.3' agrees)
    assert (g.library, g.library_version, g.tests_version) == ("nccl", "2.19.3", "nccl-tests 2.13.9")
    assert (g.oob_values, g.oob_failed, g.avg_busbw) == (0, False, 50.77)
    assert (g.first_line, g.last_line) == (1, 36)
    assert log.quarantined == () and log.warnings == ()


def test_rccl_tests_with_mpirun_tags():
    log = parse_nccl_tests(NT / "mi300x_bench.log")
    assert _table(log.rows) == MI300X_TABLE
    (g,) = log.groups
    assert (g.op, g.op_source, g.group_size) == ("all_gather", "command", 8)
    assert g.command.startswith("mpirun -np 8 --tag-output ./build/all_gather_perf")
    assert g.device_names == ("AMD Instinct MI300X",) and g.hosts == ("mi300-07",)
    assert (g.library, g.library_version, g.tests_version) == ("rccl", "2.20.5+hip6.2", "rccl-tests develop:a7809b3")
    assert (g.oob_values, g.oob_failed) == (3, True)


def test_markdown_fences_and_two_runs_in_one_file():
    log = parse_nccl_tests(NT / "two_runs.md")
    assert [g.index for g in log.groups] == [0, 1]
    h100, a100 = log.groups
    assert _table(h100.rows) == H100_MD_TABLE and _table(a100.rows) == A100_MD_TABLE
    assert [r.group for r in log.rows] == [0, 0, 0, 1, 1, 1]
    assert (h100.op_source, h100.test_name, h100.command, h100.group_size) == ("header", "all_reduce_perf", None, 8)
    assert h100.hosts == ("gpu-b07",) and h100.oob_values is None and not h100.oob_failed  # footer cut off
    assert (a100.op_source, a100.command, a100.group_size, a100.group_size_source) == (
        "command", "./build/all_reduce_perf -b 1M -e 64M -f 8 -g 2", 2, "rank_lines")
    assert a100.device_names == ("NVIDIA A100-SXM4-80GB",) and (a100.oob_values, a100.avg_busbw) == (0, 19.12)
    assert (h100.first_line, h100.last_line, a100.first_line, a100.last_line) == (8, 26, 34, 49)


@pytest.mark.parametrize("line, want", [
    (" 0: # nThread 1", "# nThread 1"),
    ("12:     1024   256  float", "    1024   256  float"),
    ("[1,0]<stdout>:# Using devices", "# Using devices"),
    ("[1,12]<stderr>:host:1:2 [3] NCCL INFO x", "host:1:2 [3] NCCL INFO x"),
    ("gpu-b07: #  Rank  0 Group", "#  Rank  0 Group"),
    ("gpu-b07:      1048576", "     1048576"),
    ("gpu-b07:  3: # nested", "# nested"),
    # not prefixes: rccl-tests' own version line, NCCL's 'host:pid:tid', prose
    ("rccl-tests: Version develop:a7809b3", "rccl-tests: Version develop:a7809b3"),
    ("gpu-a01:51001:51001 [0] NCCL INFO Bootstrap", "gpu-a01:51001:51001 [0] NCCL INFO Bootstrap"),
    ("Note: the run above", "Note: the run above"),
])
def test_strip_prefixes(line, want):
    assert strip_prefixes(line) == want


BAD_VALUES = [
    # (replace in row 16 of CURRENT_ALL_REDUCE, with, the reason quarantined)
    ("    25.10   41.78", "      nan   41.78", "time is nan"),
    ("    25.10   41.78", "      inf   41.78", "time is inf"),
    ("    25.10   41.78", "    -1   41.78", "time -1 is negative"),
    ("   41.78   62.66", "   41.78   12345678901234567890123", "busbw 12345678901234567890123 is out of range"),
    ("   62.66       0    24.87", "   62.66     inf    24.87", "#wrong is inf"),
    ("   62.66       0    24.87", "   62.66      -1    24.87", "#wrong -1 is negative"),
    ("   62.66       0    24.87", "   62.66     2.5    24.87", "#wrong 2.5 is not a whole number"),
    ("     1048576        262144", "    -1048576        262144", "size -1048576 is negative"),
    ("     1048576        262144", "  99999999999999999999999        262144", "size 99999999999999999999999 is out"),
    ("   42.16   63.24       0", "   42.16", "fields, too few for its header"),
]


@pytest.mark.parametrize("old, new, reason", BAD_VALUES)
def test_bad_numbers_are_quarantined_with_the_line(tmp_path, old, new, reason):
    lines = CURRENT_ALL_REDUCE.splitlines(keepends=True)
    assert old in lines[15]
    lines[15] = lines[15].replace(old, new, 1)
    path = tmp_path / "all_reduce.log"
    path.write_text("".join(lines))
    log = parse_nccl_tests(path)
    assert [r.size_bytes for r in log.rows] == [8, 134217728]
    ((line, why),) = log.quarantined
    assert line == 16 and reason in why
    assert len(log.warnings) == 1 and "line 16" in log.warnings[0] and "1 result row(s) quarantined" in log.warnings[0]


def test_every_row_bad_is_refused(tmp_path):
    path = tmp_path / "all_reduce.log"
    text = CURRENT_ALL_REDUCE.replace("18.52", "nan").replace("25.10", "nan").replace("520.3", "-5")
    path.write_text(text)
    with pytest.raises(FileError, match=r"no usable result rows: all 3 quarantined \(line 14: time is nan\)"):
        parse_nccl_tests(path)


def test_group_size_out_of_range(tmp_path):
    path = tmp_path / "reduce_scatter.log"
    path.write_text(TIMESTAMPED_REDUCE_SCATTER.replace("nGpus 4", "nGpus 0"))
    with pytest.raises(FileError, match=r"run of 0 ranks: out of range"):
        parse_nccl_tests(path)


def test_os_errors_name_the_file(tmp_path, monkeypatch):
    import errno

    d = tmp_path / "all_reduce.log"
    d.mkdir()
    with pytest.raises(FileError, match="cannot read") as err:
        parse_nccl_tests(d)
    assert str(err.value).startswith(str(d))
    f = NT / "slurm-4242.out"
    real = Path.read_bytes

    def eio(self):
        if self == f:
            raise OSError(errno.EIO, "Input/output error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", eio)
    with pytest.raises(FileError, match="slurm-4242.out: cannot read: Input/output error"):
        parse_nccl_tests(f)


def test_cut_row_that_never_goes_on_is_quarantined(tmp_path):
    # the 1048576 row is cut by an INFO line and the log goes on with the next row: the cut row is
    # quarantined, the next row read whole (not glued to the fragment)
    lines = CURRENT_ALL_REDUCE.splitlines(keepends=True)
    lines[15] = "     1048576        262144     float     sum      -1node01:40001:40009 [0] NCCL INFO Connected\n"
    path = tmp_path / "all_reduce.log"
    path.write_text("".join(lines))
    log = parse_nccl_tests(path)
    assert [(r.line, r.size_bytes, r.oop_time_us) for r in log.rows] == [(14, 8, 18.52), (17, 134217728, 520.3)]
    assert log.quarantined == ((16, "result row cut off by NCCL output and never continued"),)


def test_header_again_after_a_footer_is_a_new_run_of_the_same_setup(tmp_path):
    # a script running the same binary twice into one log, the second time printing only the table
    table = CURRENT_ALL_REDUCE.splitlines(keepends=True)[10:19]  # the header lines, rows and footer
    path = tmp_path / "twice.log"
    path.write_text(CURRENT_ALL_REDUCE + "".join(table))
    log = parse_nccl_tests(path)
    assert [(g.index, g.op, g.group_size, len(g.rows)) for g in log.groups] == [(0, "all_reduce", 4, 3),
                                                                                (1, "all_reduce", 4, 3)]
    assert log.groups[1].first_line == 23 and log.groups[1].hosts == ("node01",)  # the 21-line log, then its header
