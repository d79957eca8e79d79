"""nccl-tests logs as clusters write them: launcher tags inside rows, folders with failed jobs (exit 3),
headerless excerpts, over-long lines, lost rank lines (n from the busbw/algbw ratio)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import shared_trace, store_snapshot
from tracekit.cli import main
from tracekit.errors import FileError
from tracekit.ingest import ingest_paths
from tracekit.ingest.nccl_tests import MAX_LINE_CHARS, parse_nccl_tests, ranks_from_ratio
from tracekit.ingest.nccl_tests_run import read_log
from tracekit.store import Store

# A 4-rank all_reduce log, written by hand in nccl-tests' current layout. algbw = S / t / 1e9 and
# busbw = algbw · 2·3/4: 1048576 B / 25.10 µs = 41.78 GB/s → 62.66; 134217728 B / 520.3 µs = 257.96 → 386.94.
HEAD = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 128(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0
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
"""
ROWS = [
    ("           8             2     float     sum      -1", "    18.52    0.00    0.00       0    18.06    0.00    0.00       0"),
    ("     1048576        262144     float     sum      -1", "    25.10   41.78   62.66       0    24.87   42.16   63.24       0"),
    ("   134217728      33554432     float     sum      -1", "    520.3  257.96  386.94       0    519.8  258.21  387.32       0"),
]
FOOT = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 149.969\n"
EXPECTED = [(8, 18.52, 0.00, 18.06), (1048576, 25.10, 62.66, 24.87), (134217728, 520.3, 386.94, 519.8)]


def _plain_log(op_binary: str = "all_reduce_perf") -> str:
    return (f"# Collective test starting: {op_binary}\n" + HEAD
            + "".join(a + b + "\n" for a, b in ROWS) + FOOT)


def _values(log):
    return [(r.size_bytes, r.oop_time_us, r.oop_busbw, r.ip_time_us) for r in log.rows]


# ---------------------------------------------------------------------------------------------
# 1. launcher tags anywhere in a line


def test_mpirun_tags_inside_result_rows(tmp_path):
    """Open MPI tags each chunk a process writes: a row printed in two pieces with another rank's NCCL
    INFO line between them has tags in its middle, and its second half on the next line."""
    chatter = "[1,2]<stderr>:node01:40003:40003 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/IPC"
    lines = ["[1,0]<stdout>:" + line for line in _plain_log().splitlines()
             if not line.strip()[:1].isdigit()]
    body = []
    for first, second in ROWS:
        body.append(f"[1,0]<stdout>:{first}{chatter}")  # the row's first piece glued to another rank's chatter
        body.append(f"[1,0]<stdout>:{second}")
    for first, second in ROWS:  # every printed piece tagged on one line: preamble, out-of-place, in-place
        oop, ip = second[: len(second) // 2], second[len(second) // 2:]
        body.append(f"[1,0]<stdout>:{first}[1,0]<stdout>:{oop}[1,0]<stdout>:{ip}")
    text = "\n".join(lines[:-2] + body + lines[-2:]) + "\n"
    f = tmp_path / "tagged.log"
    f.write_text(text)
    log = parse_nccl_tests(f)
    assert log.quarantined == ()
    assert _values(log) == EXPECTED + EXPECTED
    assert {(r.root, r.redop, r.oop_wrong, r.ip_wrong) for r in log.rows} == {(-1, "sum", 0, 0)}
    assert log.group_size == 4 and log.op == "all_reduce"


def test_srun_label_fields_inside_a_row_are_dropped(tmp_path):
    # srun -l labels at the start of both pieces of a row cut by chatter, and one left inside a row
    text = _plain_log().replace(ROWS[1][0] + ROWS[1][1],
                                "0: " + ROWS[1][0] + " 0: " + ROWS[1][1])
    f = tmp_path / "all_reduce.log"
    f.write_text(text)
    assert _values(parse_nccl_tests(f)) == EXPECTED


# ---------------------------------------------------------------------------------------------
# 2. a folder with a failed job: the readable logs stored, the failure named, exit 3

FAILED_JOB = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51001 on     node02 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
node02:51001:51001 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>
node02:51001:51020 [0] NCCL WARN NET/IB : Got async event : port error
node02: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO for details)'
srun: error: node02: task 0: Exited with exit code 3
"""
# a job that died before nccl-tests printed anything: only its launcher's lines
FAILED_EARLY = """\
+ srun -N 2 --ntasks-per-node=8 /opt/nccl-tests/build/all_gather_perf -b 8 -e 1G -f 2 -g 1
srun: error: Unable to allocate resources: Invalid node name specified
"""


def _results_folder(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    (d / "all_reduce.log").write_text(_plain_log("all_reduce_perf"))
    (d / "all_gather.log").write_text(_plain_log("all_gather_perf").replace("sum   ", "none  "))
    (d / "reduce_scatter.log").write_text(_plain_log("reduce_scatter_perf"))
    (d / "slurm-77.out").write_text(FAILED_JOB)
    return d


def test_folder_with_a_failed_job_stores_the_rest_and_exits_3(tmp_path, capsys):
    d = _results_folder(tmp_path)
    store = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(store), "--run-id", "fleet"]) == 3
    err = capsys.readouterr().err
    reason = (f"{d / 'slurm-77.out'}: nccl-tests job failed before its first result row: line 8: "
              "srun: error: node02: task 0: Exited with exit code 3")
    assert f"skipped {reason}" in err
    assert "partial ingest: 1 log(s) could not be read" in err
    assert "not an nccl-tests log" not in err
    run = Store(store).run_dir("fleet")
    rows = pq.read_table(run / "collectives.parquet").to_pylist()
    # three logs × three sizes × (out-of-place, in-place)
    assert sorted({r["op"] for r in rows}) == ["all_gather", "all_reduce", "reduce_scatter"]
    assert len(rows) == 18
    cfg = json.loads(pq.read_table(run / "run.parquet").to_pylist()[0]["config"])
    assert cfg["skipped"] == [{"path": str(d / "slurm-77.out"), "reason": reason.split(": ", 1)[1]}]
    assert [lg["path"] for lg in cfg["logs"]] == [str(d / n) for n in ("all_gather.log", "all_reduce.log", "reduce_scatter.log")]
    warnings = pq.read_table(run / "ranks.parquet").to_pylist()[0]["warnings"]
    assert f"skipped {reason}" in warnings


def test_strict_keeps_all_or_nothing(tmp_path, capsys):
    d = _results_folder(tmp_path)
    store = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(store), "--strict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "slurm-77.out: nccl-tests job failed before its first result row" in err
    assert store_snapshot(store) == {}


def test_job_that_failed_before_any_output_is_found_and_named(tmp_path, capsys):
    d = _results_folder(tmp_path)
    (d / "slurm-78.out").write_text(FAILED_EARLY)
    store = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(store)]) == 3
    err = capsys.readouterr().err
    assert (f"skipped {d / 'slurm-78.out'}: nccl-tests job failed before its first result row: line 2: srun: error: "
            "Unable to allocate resources: Invalid node name specified") in err
    assert "partial ingest: 2 log(s)" in err


def test_every_log_failing_is_exit_2(tmp_path, capsys):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "slurm-1.out").write_text(FAILED_JOB)
    (d / "slurm-2.out").write_text(FAILED_EARLY)
    assert main(["ingest", str(d), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "slurm-1.out: nccl-tests job failed before its first result row" in err
    assert "(and 1 other log(s) could not be read either)" in err
    assert store_snapshot(tmp_path / "s") == {}


def test_failed_job_alone_is_named_not_called_not_a_log(tmp_path):
    f = tmp_path / "slurm-77.out"
    f.write_text(FAILED_JOB.replace("srun: error: node02: task 0: Exited with exit code 3\n", ""))
    with pytest.raises(FileError, match=r"failed before its first result row: line 7: node02: Test NCCL failure"):
        parse_nccl_tests(f)
    f.write_text("\n".join(FAILED_JOB.splitlines()[:4]) + "\n")  # cut off after its rank line, no error
    with pytest.raises(FileError, match=r"stopped before its first result row"):
        parse_nccl_tests(f)


def test_job_that_failed_mid_run_keeps_its_rows_and_is_warned_about(tmp_path):
    text = _plain_log().split("# Out of bounds")[0] + (
        "node01:40003:40010 [2] NCCL WARN Cuda failure 'an illegal memory access was encountered'\n"
        "srun: error: node01: task 2: Exited with exit code 1\n")
    f = tmp_path / "all_reduce.log"
    f.write_text(text)
    log = parse_nccl_tests(f)
    assert _values(log) == EXPECTED
    n = len(HEAD.splitlines()) + 1 + 3
    assert log.warnings == (f"all_reduce.log benchmark run 0: no footer after its last result row (line {n}): the "
                            f"job failed mid-run? its last error, line {n + 2}: srun: error: node01: task 2: "
                            "Exited with exit code 1",)


# ---------------------------------------------------------------------------------------------
# 3. headerless rows


def test_headerless_rows_read_from_their_command_line(tmp_path):
    f = tmp_path / "excerpt.md"
    f.write_text("Our numbers:\n\n```\n$ mpirun -np 4 ./build/all_reduce_perf -b 8 -e 128M -f 128 -g 1\n"
                 + "".join(a + b + "\n" for a, b in ROWS) + "```\n")
    log = parse_nccl_tests(f)
    assert _values(log) == EXPECTED
    assert (log.op, log.op_source, log.group_size, log.group_size_source) == ("all_reduce", "command", 4, "command")
    assert any("have no column header: read in nccl-tests' current layout" in w and "4 ranks" in w for w in log.warnings)


def test_command_rank_count():
    from tracekit.ingest.nccl_tests import _COMMAND, command_ranks

    def ranks(cmd):
        m = _COMMAND.search(cmd)
        return command_ranks(cmd, m.start("bin"), m.end())[0]

    assert ranks("mpirun -np 16 ./all_reduce_perf -b 8 -e 1G -g 1") == 16
    assert ranks("srun -N 2 --ntasks-per-node=8 all_gather_perf -g 1 -t 1") == 16
    assert ranks("./build/all_reduce_perf -b 8 -e 128M -g 8") == 8
    assert ranks("./build/all_reduce_perf -b 8 -e 128M -t 2 -g 4") == 8
    assert ranks("./build/alltoall_perf -n 100") == 1  # -n after the binary is nccl-tests' iteration count
    assert ranks("mpirun --hostfile h ./all_reduce_perf -g 1") is None


def test_headerless_rows_without_a_command_are_warned_about(tmp_path):
    f = tmp_path / "all_reduce.log"
    f.write_text("".join(a + b + "\n" for a, b in ROWS[:2]) + _plain_log())  # two stray rows, then a full log
    log = parse_nccl_tests(f)
    assert _values(log) == EXPECTED
    assert any("2 line(s) that look like result rows (lines 1-2) have no column header and were not read: "
               "no command line above them" in w for w in log.warnings)
    f.write_text("".join(a + b + "\n" for a, b in ROWS))  # nothing but rows
    with pytest.raises(FileError, match=r"3 result row\(s\) without a column header and no command line"):
        parse_nccl_tests(f)


# ---------------------------------------------------------------------------------------------
# 4. bounded lines, linear time


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_five_million_character_line_is_refused_at_once(tmp_path, capsys):
    f = tmp_path / "all_reduce.log"
    f.write_text(_plain_log() + "7" * 5_000_000 + "\n")
    t0 = time.perf_counter()
    assert main(["ingest", str(f), "--store", str(tmp_path / "s")]) == 2
    assert time.perf_counter() - t0 < 2.0
    err = capsys.readouterr().err
    n = len(_plain_log().splitlines()) + 1
    assert err == (f"tracekit: {f}: line {n}: 5,000,000 characters, over the 65,536-character limit of an "
                   "nccl-tests log line (not a log, or damaged)\n")


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
@pytest.mark.parametrize("unit", ["a", "a:", "h:1:1 ", "1 ", "/a_perf", "[1,0]<std"])
def test_longest_accepted_lines_read_in_linear_time(tmp_path, unit):
    """20 lines just under the limit, shaped to make a backtracking pattern quadratic: read in well
    under the time a quadratic scan would take (64 Ki² ≈ 4e9 steps per line)."""
    line = (unit * (MAX_LINE_CHARS // len(unit)))[: MAX_LINE_CHARS - 1]
    f = tmp_path / "all_reduce.log"
    f.write_text(_plain_log() + (line + "\n") * 20)
    t0 = time.perf_counter()
    log = parse_nccl_tests(f)
    assert time.perf_counter() - t0 < 5.0
    assert _values(log) == EXPECTED


LINE_STARTS = ["", "#  Rank  9 Group  0 Pid   7085 on   mi300-07 device  0 [0000:05:00] a", "# nThread 1 nGpus 1 ",
               "# Collective test starting: ", "# nccl-tests version 2.1 ", "# Out of bounds values : ",
               "#  size  count  type ", ROWS[0][0] + " ", "node:1:1 [0] NCCL INFO ", "$ mpirun -np 4 ", "host: "]
LINE_FILLS = [" ", "a", "1 ", "a:", "/a_", "x:1:1 ", "\t"]


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_every_line_shape_reads_in_linear_time(tmp_path):
    """Each kind of line nccl-tests prints, continued by 40,000 characters of a run that makes a
    backtracking pattern quadratic (a lazy name before trailing spaces took 25 s a line): the whole
    grid reads in seconds."""
    f = tmp_path / "all_reduce.log"
    lines = [start + (fill * 40_000)[:40_000] + "z" for start in LINE_STARTS for fill in LINE_FILLS]
    t0 = time.perf_counter()
    for line in lines:
        f.write_text(_plain_log() + line + "\n")
        try:
            parse_nccl_tests(f)
        except FileError:
            pass
    assert time.perf_counter() - t0 < 6.0


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_row_cut_by_chatter_never_grows_without_bound(tmp_path):
    """A row cut by NCCL chatter, then 50,000 lines of numbers glued to chatter: each would continue the
    cut row; the pieces are dropped once longer than any row (linear time, not a 2.5 MB row)."""
    cut = ROWS[0][0] + " node01:1:1 [0] NCCL INFO a\n"
    junk = "1 2 3 4 5 6 7 8 9 10 node01:1:1 [0] NCCL INFO b\n" * 50_000
    f = tmp_path / "all_reduce.log"
    f.write_text(_plain_log() + cut + junk)
    t0 = time.perf_counter()
    log = parse_nccl_tests(f)
    assert time.perf_counter() - t0 < 5.0
    assert _values(log) == EXPECTED
    n = len(_plain_log().splitlines()) + 1
    assert log.quarantined[0] == (n, "result row cut off by NCCL output and never continued")
    # each dropped piece holds at most 4096 characters of 21-character fragments + the row start
    assert len(log.quarantined) >= 50_000 * 21 // 4200


def test_long_field_quarantines_the_row(tmp_path):
    f = tmp_path / "all_reduce.log"
    f.write_text(_plain_log().replace("    18.52    0.00", "    18.52" + "0" * 70 + "    0.00"))
    log = parse_nccl_tests(f)
    assert _values(log) == EXPECTED[1:]
    assert log.quarantined[0][1] == "a field of 75 characters (longest accepted: 64)"


# ---------------------------------------------------------------------------------------------
# 5. n from the busbw/algbw ratio when the rank lines are missing

# A 16-process MPI all_reduce (-g 1, so "nThread 1 nGpus 1") whose rank lines were lost. By hand:
# 1073741824 B / 10737.42 µs = 100.00 GB/s, busbw = 100.00 · 2·15/16 = 187.50;
# 4194304 B / 104.86 µs = 40.00 GB/s, busbw = 75.00. (n = 15 would give 186.67 and 74.67.)
LOST_RANKS = """\
# nThread 1 nGpus 1 minBytes 4194304 maxBytes 1073741824 step: 256(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
     4194304       1048576     float     sum      -1   104.86   40.00   75.00       0   104.86   40.00   75.00       0
  1073741824     268435456     float     sum      -1  10737.4  100.00  187.50       0  10737.4  100.00  187.50       0
"""


def test_group_size_from_the_busbw_algbw_ratio(tmp_path):
    f = tmp_path / "all_reduce.log"
    f.write_text(LOST_RANKS)
    log = parse_nccl_tests(f)
    assert (log.group_size, log.group_size_source) == (16, "busbw_ratio")
    assert any("nThread × nGpus line gives 1 ranks, but its rows' busbw/algbw ratio (2·(n-1)/n) gives n = 16" in w
               for w in log.warnings)
    store = Store(tmp_path / "s")
    rid = ingest_paths([f], store)
    rows = pq.read_table(store.run_dir(rid) / "collectives.parquet").to_pylist()
    assert {r["group_size"] for r in rows} == {16}
    # all_reduce wire bytes per rank: 2·(n-1)/n · S
    assert rows[-1]["wire_bytes"] == 2 * 15 * 1073741824 // 16


def test_ratio_range_by_hand():
    lo, hi = ranks_from_ratio("all_reduce", [(100.00, 187.50)])
    # f in [187.495/100.005, 187.505/99.995] / 2 → n = 1/(1 - f/2) in [15.98, 16.02]
    assert 15.9 < lo < 16 < hi < 16.1
    lo, hi = ranks_from_ratio("all_gather", [(200.0, 175.0)])  # 7/8 → n = 8
    assert lo < 8 < hi and hi - lo < 0.05
    assert ranks_from_ratio("broadcast", [(100.0, 100.0)]) is None  # factor 1: no n in it
    assert ranks_from_ratio("all_reduce", [(0.5, 0.9)]) is None  # too few digits to tell


def test_ratio_kept_when_it_agrees_and_broadcast_untouched(tmp_path):
    f = tmp_path / "all_reduce.log"
    f.write_text(LOST_RANKS.replace("nGpus 1", "nGpus 16"))
    log = parse_nccl_tests(f)
    assert (log.group_size, log.group_size_source, log.warnings) == (16, "nthreads_ngpus", ())
    f = tmp_path / "broadcast.log"
    f.write_text(LOST_RANKS)
    assert parse_nccl_tests(f).group_size == 1  # busbw = algbw for every n: nothing to infer from


def test_ratio_recovers_the_fleet_group_sizes(tmp_path):
    """The fleet's all-node logs with their '# Rank' lines removed: the ratio gives back the rank count
    the rank lines said (10, 20, 40, 80) for every collective whose bus factor depends on n."""
    d = shared_trace("nccltests_h100_fleet/multi_node")
    for src in sorted(d.glob("nccl_N10_G*.log")):
        full = parse_nccl_tests(src)
        f = tmp_path / src.name
        f.write_text("\n".join(ln for ln in src.read_text().splitlines() if not re.search(r"#\s*Rank\s+\d+", ln)) + "\n")
        lost = parse_nccl_tests(f)
        for a, b in zip(full.groups, lost.groups):
            if a.op == "send":
                assert b.group_size_source == "nthreads_ngpus"
                continue
            assert (b.group_size, b.group_size_source) == (a.group_size, "busbw_ratio"), (src.name, a.op)


# ---------------------------------------------------------------------------------------------
# 6. nccl-tests' own JSON output (-J FILE, with the -I per-iteration report)

JSON_FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "inputs" / "nccl_tests_json" / "all_reduce_perf.json"


def test_json_output_read_like_the_text():
    log = read_log(JSON_FIXTURE)
    assert (log.op, log.op_source, log.group_size, log.group_size_source) == ("all_reduce", "command", 8, "rank_lines")
    assert (log.nccl_version, log.tests_version, log.layout) == ("2.27.3", "nccl-tests json v3", "json")
    assert [(r.size_bytes, r.count, r.dtype, r.redop, r.root) for r in log.rows] == [
        (1048576, 262144, "float", "sum", -1), (134217728, 33554432, "float", "sum", -1)]
    assert [(r.oop_time_us, r.oop_algbw, r.oop_busbw, r.ip_time_us, r.ip_busbw, r.ip_wrong) for r in log.rows] == [
        (40.0, 26.2144, 45.8752, 39.5, 46.455899, 0), (800.0, 167.77216, 293.60128, 798.0, 294.337123, 0)]
    # busbw = algbw · 2·7/8, as the fixture's NOTE.md computes
    assert all(abs(r.oop_busbw - r.oop_algbw * 1.75) < 1e-5 for r in log.rows)
    g = log.groups[0]
    assert g.hosts == ("node01",) and g.device_names == ("NVIDIA H100 80GB HBM3",)
    assert g.params["iters"] == 5 and g.params["n_gpus"] == 8
    assert g.per_iter == ({"size_bytes": 134217728, "half": "out-of-place", "n": 5, "skipped": 0, "min_us": 790.0,
                           "p50_us": 800.0, "p99_us": 810.0, "max_us": 810.0, "cv_pct": 0.883883},)


def test_json_output_ingested_beside_text_logs(tmp_path, capsys):
    d = tmp_path / "results"
    d.mkdir()
    (d / "ar.json").write_bytes(JSON_FIXTURE.read_bytes())
    (d / "all_gather.log").write_text(_plain_log("all_gather_perf"))
    store = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(store), "--run-id", "mixed"]) == 0
    run = Store(store).run_dir("mixed")
    rows = pq.read_table(run / "collectives.parquet").to_pylist()
    ar = [r for r in rows if r["op"] == "all_reduce"]
    assert [(r["size_bytes"], r["dur_ns"], r["log_busbw_gbps"], r["group_size"]) for r in ar] == [
        (1048576, 40000, 45.8752, 8), (1048576, 39500, 46.455899, 8),
        (134217728, 800000, 293.60128, 8), (134217728, 798000, 294.337123, 8)]
    cfg = json.loads(pq.read_table(run / "run.parquet").to_pylist()[0]["config"])
    g = next(g for g in cfg["groups"] if g["op"] == "all_reduce")
    assert g["per_iter"][0]["p99_us"] == 810.0 and g["tests_version"] == "nccl-tests json v3"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t[: len(t) // 2], "not valid JSON"),  # a job killed mid-run
    (lambda t: t.replace('"version":3', '"version":9'), "format version 9: this reader knows [1, 2, 3]"),
    (lambda t: t.replace('"bus_bw":45.875200', '"bus_bw":inf'), "not valid JSON"),
    (lambda t: t.replace(t[t.index('"results":'):t.index(',"out_of_bounds"')], '"results":[]')
     .replace('"errors":[]', '"errors":["unhandled cuda error"]'),
     "has no results (the job failed before its first row?): unhandled cuda error"),
])
def test_bad_json_output_is_one_line_exit_2(tmp_path, capsys, edit, message):
    f = tmp_path / "ar.json"
    f.write_text(edit(JSON_FIXTURE.read_text()))
    assert main(["ingest", str(f), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(f) in err
    assert store_snapshot(tmp_path / "s") == {}


def test_json_result_with_nan_is_quarantined(tmp_path):
    f = tmp_path / "ar.json"
    f.write_text(JSON_FIXTURE.read_text().replace('"time":40.000000', '"time":"nan"'))
    log = read_log(f)
    assert [r.size_bytes for r in log.rows] == [134217728]
    assert log.quarantined == ((1, "results[0]: out_of_place.time 'nan' is not a number"),)


# ---------------------------------------------------------------------------------------------
# 1-rank runs: labelled as such, no peak busbw, the no-model reason says "1 rank"

ONE_RANK = """\
# nThread 1 nGpus 1 minBytes 64 maxBytes 1048576 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  40001 on     node01 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
          64            16     float     sum      -1     4.10    0.02    0.00       0     3.90    0.02    0.00       0
        4096          1024     float     sum      -1     4.20    0.98    0.00       0     4.00    1.02    0.00       0
     1048576        262144     float     sum      -1    10.50   99.86    0.00       0    10.40  100.82    0.00       0
"""


def test_one_rank_run_is_labelled_and_has_no_peak_or_model(tmp_path, capsys):
    f = tmp_path / "all_reduce.log"
    f.write_text(ONE_RANK)
    store = tmp_path / "s"
    assert main(["ingest", str(f), "--store", str(store), "--run-id", "one"]) == 0
    assert "1 rank: nothing crosses a link (busbw is 0 by definition)" in capsys.readouterr().err
    assert main(["analyze", "--store", str(store), "--run", "one", "--json", "--link", "nvlink4"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["peak_busbw"] == []
    assert [(r["op"], r["count"], r["peak_busbw_gbps"], r["peak_busbw_size_bytes"]) for r in rep["collectives"]] == [
        ("all_reduce", 6, None, None)]
    assert {r["peak_busbw_gbps"] for r in rep["by_size"]} == {None}
    assert {r["status_reason"] for r in rep["fit"]} == {"1 rank: the collective moves no data between ranks"}
    assert {(r["reference"], r["no_model_reason"]) for r in rep["references"]} == {
        ("no model", "1 rank: the collective moves no data between ranks")}


def test_json_host_name_longer_than_the_writer_prints_is_refused(tmp_path):
    f = tmp_path / "ar.json"
    f.write_text(JSON_FIXTURE.read_text().replace('"hostname":"node01"', '"hostname":"' + "n" * 5000 + '"', 1))
    with pytest.raises(FileError, match=r"config.devices\[0\].hostname of 5,000 characters \(its writer prints at "
                                        r"most 1024\)"):
        read_log(f)


def test_text_per_iteration_columns_kept_like_the_json(tmp_path):
    """A text log printed with -I: each half's i_min i_max i_p99 i_cv% (µs, µs, µs, %) are kept per size
    and half with the JSON reader's keys (n, skipped and p50 are not printed: None)."""
    text = (HEAD.replace("  #wrong     time   algbw   busbw  #wrong",
                         "  #wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%")
            + ROWS[2][0] + "    520.3  257.96  386.94       0    510.0    530.5    530.5     1.20"
            + "    519.8  258.21  387.32       0    509.1    531.0    531.0     1.31\n")
    f = tmp_path / "all_reduce.log"
    f.write_text(text)
    log = parse_nccl_tests(f)
    assert _values(log) == EXPECTED[2:]
    assert log.groups[0].per_iter == (
        {"size_bytes": 134217728, "half": "out-of-place", "n": None, "skipped": None, "min_us": 510.0,
         "p50_us": None, "p99_us": 530.5, "max_us": 530.5, "cv_pct": 1.2},
        {"size_bytes": 134217728, "half": "in-place", "n": None, "skipped": None, "min_us": 509.1,
         "p50_us": None, "p99_us": 531.0, "max_us": 531.0, "cv_pct": 1.31})


def _json_twin_text(t_first: str = "40.00") -> str:
    """The stdout log of the job that wrote the JSON fixture, printed as nccl-tests prints (2 decimals)."""
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid  {70001 + r} on     node01 device {r:2d} [0000:{0x18 + 16 * r:02x}:00] "
                    "NVIDIA H100 80GB HBM3\n" for r in range(8))
    return ("# Collective test starting: all_reduce_perf\n"
            "# nThread 1 nGpus 8 minBytes 1048576 maxBytes 134217728 step: 128(factor) warmup iters: 5 iters: 5 "
            "agg iters: 1 validation: 1 graph: 0\n#\n# Writing JSON output to ar.json\n# Using devices\n" + ranks
            + "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
            + f"     1048576        262144     float     sum      -1    {t_first}   26.21   45.88       0    39.50   26.55   46.46       0\n"
            + "   134217728      33554432     float     sum      -1   800.00  167.77  293.60       0   798.00  168.19  294.34       0\n")


def test_text_twin_of_a_json_file_is_read_once(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "ar.json").write_bytes(JSON_FIXTURE.read_bytes())
    (d / "slurm-9.out").write_text(_json_twin_text())
    store = Store(tmp_path / "s")
    rid = ingest_paths([d], store)
    run = store.run_dir(rid)
    rows = pq.read_table(run / "collectives.parquet").to_pylist()
    assert [(r["pg_name"], r["dur_ns"], r["log_busbw_gbps"]) for r in rows][:2] == [
        ("nccl_tests:all_reduce", 40000, 45.8752), ("nccl_tests:all_reduce", 39500, 46.455899)]
    assert len(rows) == 4
    warnings = pq.read_table(run / "ranks.parquet").to_pylist()[0]["warnings"]
    assert "slurm-9.out benchmark run 0 (lines 1-16) is the text twin of ar.json (nccl-tests -J): read once, from the JSON" in warnings
    # a time that differs beyond its printed digits is another run: both kept
    (d / "slurm-9.out").write_text(_json_twin_text("40.02"))
    rid = ingest_paths([d], store, replace=True)
    assert len(pq.read_table(store.run_dir(rid) / "collectives.parquet").to_pylist()) == 8


def test_json_written_under_a_probed_name_is_found_in_a_folder(tmp_path):
    """nccl-tests writes FILE.0, FILE.1... when FILE exists: such files of a folder are read too."""
    from tracekit.ingest import expand_paths

    d = tmp_path / "job"
    d.mkdir()
    (d / "ar.json.0").write_bytes(JSON_FIXTURE.read_bytes())
    (d / "notes.json.1").write_text('{"a": 1}')  # not nccl-tests' JSON: left out
    assert [p.name for p in expand_paths([d])] == ["ar.json.0"]
    store = Store(tmp_path / "s")
    rid = ingest_paths([d], store)
    assert len(pq.read_table(store.run_dir(rid) / "collectives.parquet").to_pylist()) == 4
