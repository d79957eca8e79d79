"""Parser for nccl-tests (and rccl-tests) text logs: ``all_reduce_perf`` and friends.

Pure: reads one file, returns a :class:`NcclTestsLog`; turning it into store
tables is someone else's job (:mod:`tracekit.ingest.nccl_tests_run`).

Logs as clusters write them
---------------------------
Before a line is read, it is cleaned:

- Markdown code fences (lines starting with three backticks or tildes) are
  dropped, so a log pasted into a ``.md`` file reads like the log itself;
- ``mpirun --tag-output`` tags (``[1,0]<stdout>:``) are removed wherever they
  are: Open MPI tags every piece a process writes, so a row printed in pieces
  carries one at each piece (:func:`untag`);
- rank prefixes are stripped (up to three, nested): ``srun -l`` (``0: ``,
  `` 12: `` — the width changes with the rank count), ``mpirun
  --tag-output`` (``[1,0]<stdout>:``), and ``pdsh``-style ``host: `` (taken
  as a prefix only when what follows is nccl-tests output: a ``#`` line, a
  number, NCCL chatter or a command); inside a result row, a whole field
  ending in a colon (``3:``, ``node01:``) is such a label and dropped;
- NCCL chatter (``host:pid:tid [dev] NCCL INFO|WARN|TRACE ...``) is dropped,
  also when it lands in the middle of a result row: the text before it (the
  chatter's host name glued to the row's last field is told apart by the
  field's shape: an integer, a decimal, ``N/A`` or a reduction name) is kept
  and joined with the next line of output, where the row goes on. The
  chatter's ``NCCL version`` / ``RCCL version`` is read on the way.

Layouts
-------
- current nccl-tests / rccl-tests: ``size count type redop root time algbw
  busbw #wrong`` for out-of-place then in-place, ``#wrong`` a number or
  ``N/A``, a ``# Collective test starting: all_reduce_perf`` line, rank
  lines ``#  Rank  0 Group  0 Pid 1234 on host device  0 [0000:1b:00] NVIDIA
  H100`` (rccl-tests: ``... AMD Instinct MI300X``); optional extras: a
  trailing timestamp column, per-iteration columns (``i_min i_max i_p99
  i_cv%``) after each half, ``cputime`` for ``time``;
- older nccl-tests (e.g. the superbench A100 logs): an ``error`` column
  holding ``N/A``, ``root`` only for broadcast/reduce, no ``redop`` for
  all_gather, an empty ``redop`` field for alltoall, rank lines without
  ``Group``, zero-size rows.
- version lines: ``# nccl-tests version 2.17.6 nccl-headers=22703
  nccl-library=22703`` (library 2.27.3: the code is major·10000 + minor·100 +
  patch), ``rccl-tests: Version develop:a7809b3`` or ``# rccl-tests version
  ...``; the library from chatter ``NCCL version 2.18.3+cuda12.2`` /
  ``RCCL version 2.18.3+hip6.1``.
- the footer ``# Out of bounds values : N OK|FAILED`` (nccl-tests' total of
  the rows' wrong values) and ``# Avg bus bandwidth : X``.

Benchmark runs (groups)
-----------------------
One header and its rows form one :class:`NcclTestsGroup`; a file may hold
several (a sweep script appending runs). A new group starts at a command
line, a version line, a ``Collective test starting`` line, a ``# nThread``
line or a rank line met after the current group's rows or footer. Each
group keeps its own op, command line, ranks, hosts, device, versions and
footer.

The collective of a group is taken from, in order: the ``Collective test
starting`` line (``op_source`` ``header``), the command line in the log
(``command``: a line invoking ``.../all_reduce_perf ...``), the file name
(``filename``: ``nccl_allreduce.log``, ``all_gather_perf.txt``, ...), the
``op`` argument (``argument``, the CLI's ``--op``). An ``op`` argument that
disagrees with what the log says is ignored with a warning. The group size
is the number of distinct ``# Rank N`` lines, else nThread × nGpus from the
parameter line (which undercounts multi-process MPI runs), else the command
line's (:func:`command_ranks`). Without rank lines, the size is checked against
the rows' busbw/algbw ratio for the collectives whose bus factor depends on n
(:func:`ranks_from_ratio`): when the ratio allows one size only and it is
another, that size is used (``busbw_ratio``) with a warning.
``group_size_source`` says which.

Result rows met before any column header are read in the current layout when
a command line above them names the op and the rank count (an excerpt pasted
under its command; warned), else left out with a warning naming their lines.

Failed jobs and bounds
----------------------
A log without result rows whose job printed an error (``NCCL WARN``, ``srun:
error``, ``Test NCCL failure``) is refused as a job that "failed before its
first result row", naming the last such line; one with nccl-tests' own lines
(parameters, rank lines) but no error as one that "stopped" before it. A line
over MAX_LINE_CHARS refuses the file (naming the line) before any pattern
runs on it, and every pattern is linear in the line, so a file is read in
time linear in its size; a row field over MAX_TOKEN_CHARS quarantines the row.
nccl-tests' JSON output (``-J``) is read by :mod:`tracekit.ingest.nccl_tests_json`
(:func:`tracekit.ingest.nccl_tests_run.read_log` picks the reader).

Validation
----------
A result row whose fields are not numbers, or whose numbers are NaN, inf,
negative or out of range (size or count above 2**50, time above 1e9 µs,
algbw/busbw above 1e6 GB/s, #wrong not a whole number), or that has too few
fields for its header, is quarantined: left out of the rows, counted in
``quarantined`` with its line number and the reason. Times are kept as
printed: microseconds and GB/s (GB = 1e9).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import BadInputError, FileError
from tracekit.model.ops import canonical_op

__all__ = ["NcclTestsRow", "NcclTestsGroup", "NcclTestsLog", "parse_nccl_tests", "strip_prefixes"]

MAX_SIZE_BYTES = 1 << 50
"""Largest size/count accepted in a result row (1 PiB; nccl-tests sweeps stop at tens of GB)."""
MAX_TIME_US = 1e9
"""Largest time accepted, µs (1000 s for one collective, averaged over iterations)."""
MAX_BW_GBPS = 1e6
"""Largest algbw/busbw accepted, GB/s (1 PB/s: no link comes near)."""
MAX_RANKS = 1 << 20
"""Largest group size accepted (the same bound as the trace readers')."""
MAX_LINE_CHARS = 1 << 16
"""Longest line accepted, characters (64 Ki). nccl-tests' own lines are under 300 characters and NCCL's
longest INFO lines (ring/tree channel lists) a few KB at thousands of ranks; a longer line means the
file is not a log (or is damaged), and the file is refused naming that line."""
MAX_TOKEN_CHARS = 64
"""Longest field accepted in a result row, characters: a longer one quarantines the row."""


@dataclass(frozen=True)
class NcclTestsRow:
    """One result row.

    size_bytes: nccl-tests S; count: elements; dtype: the ``type`` column;
    redop / root: None when the layout has no such column or the field is
    empty; oop_* (out-of-place) and ip_* (in-place): time_us (µs), algbw and
    busbw (GB/s, GB = 1e9, as printed), wrong (int, or None for ``N/A``);
    oop_* are None for a row that printed only the in-place half; line: 1-based
    line number in the file (of the row's start when chatter split it); op,
    group_size: collective and communicator size of the run the row belongs
    to; group: index of that run (:class:`NcclTestsGroup`) in the file.
    """

    line: int
    op: str
    group_size: int
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    oop_time_us: float | None
    oop_algbw: float | None
    oop_busbw: float | None
    oop_wrong: int | None
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None
    group: int = 0


@dataclass(frozen=True)
class NcclTestsGroup:
    """One benchmark run in a log: one header and its rows.

    index: 0-based, in file order; first_line / last_line: the lines it spans
    (1-based); op, op_source (header / command / filename / argument),
    test_name (``all_reduce_perf`` from the ``Collective test starting``
    line, else the command's binary, else None); command: the command line
    found in the log, as printed (None when absent); group_size and
    group_size_source (rank_lines / nthreads_ngpus); ranks: (rank, host,
    device index, device name) per rank line; hosts: distinct hosts of the
    rank lines in rank order; device_names: distinct device names;
    library: ``nccl`` or ``rccl`` (rccl when the log says rccl-tests or RCCL,
    or names an AMD device), library_version (``2.27.3``, from the chatter or
    the nccl-tests version line) and tests_version (``nccl-tests 2.17.6`` /
    ``rccl-tests develop:a7809b3``), each None when the log does not say;
    layout (``current`` / ``legacy``), columns, params (the ``# nThread`` line
    as a dict), dtype (None when rows mix types), rows, avg_busbw (GB/s, None
    when absent or not finite), oob_values / oob_failed (the ``Out of bounds
    values : N OK|FAILED`` footer; None / False without one), quarantined:
    (line, reason) per row left out; per_iter: the per-iteration summaries of ``-I``,
    one dict per size and half (size_bytes, half, n, skipped, min_us, p50_us, p99_us, max_us, cv_pct:
    a text log's ``i_min i_max i_p99 i_cv%`` columns leave n, skipped and p50_us None; the JSON
    output has them all, :mod:`tracekit.ingest.nccl_tests_json`); empty without ``-I``.
    """

    index: int
    first_line: int
    last_line: int
    op: str
    op_source: str
    test_name: str | None
    command: str | None
    group_size: int
    group_size_source: str
    ranks: tuple[tuple[int, str, int, str], ...]
    hosts: tuple[str, ...]
    device_names: tuple[str, ...]
    library: str | None
    library_version: str | None
    tests_version: str | None
    layout: str
    columns: tuple[str, ...]
    params: dict
    dtype: str | None
    rows: tuple[NcclTestsRow, ...]
    avg_busbw: float | None
    oob_values: int | None
    oob_failed: bool
    quarantined: tuple[tuple[int, str], ...]
    per_iter: tuple[dict, ...] = ()


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed nccl-tests log.

    groups: the benchmark runs in file order (:class:`NcclTestsGroup`); rows:
    all their rows in file order; quarantined: (line, reason) of every row
    left out; warnings: one line each (quarantined rows, an ``op`` argument
    that was ignored). The other fields are the first group's, for a log
    holding one run: op (canonical collective: all_reduce, all_gather,
    reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, send),
    test_name, op_source, dtype, group_size, group_size_source, layout,
    columns, ranks, params, avg_busbw, nccl_version (the library version:
    NCCL's or RCCL's, None when the log does not say), tests_version.
    """

    path: str
    op: str
    test_name: str | None
    op_source: str
    dtype: str | None
    group_size: int
    group_size_source: str
    layout: str
    columns: tuple[str, ...]
    rows: tuple[NcclTestsRow, ...]
    ranks: tuple[tuple[int, str, int, str], ...] = field(default=())
    params: dict = field(default_factory=dict)
    avg_busbw: float | None = None
    nccl_version: str | None = None
    tests_version: str | None = None
    groups: tuple[NcclTestsGroup, ...] = field(default=())
    quarantined: tuple[tuple[int, str], ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())


# nccl-tests binaries and log-file spellings, separators stripped, longest first
# so that "reducescatter" wins over "reduce" and "allreduce".
_FILENAME_OPS = (
    ("reducescatter", "reduce_scatter"),
    ("alltoallv", "all_to_all"),
    ("alltoall", "all_to_all"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("hypercube", "all_gather"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send"),
    ("scatter", "scatter"),
    ("gather", "gather"),
    ("reduce", "reduce"),
)

_RANK_LINE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+"
    r"device\s+(?P<dev>\d+)\s+\[[^\]]*\]\s*(?P<name>.*)$"  # (name stripped after: a lazy .*?\s*$ is quadratic)
)
_PARAMS_LINE = re.compile(r"^#\s*nThread\s+(?P<nthread>\d+)\s+nGpus\s+(?P<ngpus>\d+)\b(?P<rest>.*)$")
_TEST_START = re.compile(r"^#\s*Collective test starting:\s*(?P<name>\S+)")
_TEST_END = re.compile(r"^#\s*Collective test concluded")
_TESTS_VERSION = re.compile(r"^#?\s*(?P<kind>[nr]ccl)-tests:?\s+version\s+(?P<v>\S+)(?P<rest>.*)$", re.I)
_LIB_CODE = re.compile(r"\bnccl-library=(?P<code>\d{4,6})\b")
_LIB_VERSION = re.compile(r"\b(?P<lib>NCCL|RCCL) version\s+(?P<v>\d[^\s,]*)")
_AVG_BUSBW = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(?P<v>\S+)")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(?P<n>\S+)\s*(?P<verdict>OK|FAILED)?", re.I)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}$")
_INT = re.compile(r"[+-]?\d+$")
_FENCE = re.compile(r"^\s*(?:```|~~~)")
# a line invoking a test binary: ".../build/all_reduce_perf -b 8", "all_gather_perf_mpi", "alltoall_perf"
_COMMAND = re.compile(r"(?:^|[\s/=\"'])(?P<bin>[a-z_]+_perf)(?:_mpi)?(?=[\s\"';|&)]|$)")
# NCCL's debug output: "host:pid:tid [dev] NCCL INFO ..." (RCCL prints the same)
# (the host starts a whitespace-separated token: the search starts only there, so it stays linear)
_CHATTER = re.compile(r"(?<!\S)(?P<who>[^\s:]+):\d+:\d+\s+\[\d+\]\s+NCCL\s+(?:INFO|WARN|TRACE|ABORT)\b")
_CHATTER_BARE = re.compile(r"^\s*(?:\S+:\d+:\d+\s+)?(?:\[\d+\]\s+)?NCCL\s+(?:INFO|WARN|TRACE|ABORT)\b")
# the last field of a row fragment glued to the chatter's host name: an integer, a decimal, N/A, a reduction
_FIELD_HEAD = re.compile(r"(?:N/A|premulsum|mulsum|prod|none|sum|max|min|avg|[+-]?\d+(?:\.\d+)?)")

_SRUN = re.compile(r"^\s*\d+:\s")
# mpirun --tag-output's tag anywhere in a line: Open MPI tags each chunk a process writes, so a result row
# printed in pieces, with another rank's NCCL output between them, carries tags in its middle
_MPIRUN_ANY = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:")
# a whole field that is a launcher's label (srun -l "12:", pdsh "host:"): never a result-row field
_TAG_TOKEN = re.compile(r"[A-Za-z0-9][\w.-]*:$")
# the last error a failed job printed: NCCL's WARN lines, srun's errors, nccl-tests' own failure lines
_JOB_ERROR = re.compile(r"\bNCCL\s+WARN\b|\bsrun:\s+error\b|\bTest\s+(?:NCCL\s+|CUDA\s+)?failure\b"
                        r"|\bNCCL\s+failure\b|\bCUDA\s+failure\b", re.I)
# the options of a command line that give its rank count: before the test binary, the launcher's
# (mpirun/mpiexec -np/-n/--np, srun -n/--ntasks, or srun -N/--nodes with --ntasks-per-node); after it,
# the test's -g/--ngpus and -t/--nthreads (nccl-tests' defaults: 1 thread, 1 GPU per process)
_LAUNCHER = re.compile(r"(?:^|[\s/])(?:mpirun|mpiexec|srun|orterun|prun|aprun|jsrun|flux)(?=\s|$)")
_CMD_PROCS = re.compile(r"(?:^|\s)(?:-np|-n|--np|--ntasks)[\s=]+(\d+)(?=\s|$)")
_CMD_NODES = re.compile(r"(?:^|\s)(?:-N|--nodes)[\s=]+(\d+)(?=\s|$)")
_CMD_PER_NODE = re.compile(r"(?:^|\s)--ntasks-per-node[\s=]+(\d+)(?=\s|$)")
_CMD_GPUS = re.compile(r"(?:^|\s)(?:-g|--ngpus)[\s=]+(\d+)(?=\s|$)")
_CMD_THREADS = re.compile(r"(?:^|\s)(?:-t|--nthreads)[\s=]+(\d+)(?=\s|$)")
_MPIRUN = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:\s?")
_PDSH = re.compile(r"^[A-Za-z0-9][\w.-]*:\s")

_PARAM_FIELDS = (
    (re.compile(r"\bminBytes\s+(\d+)"), "min_bytes"),
    (re.compile(r"\bmaxBytes\s+(\d+)"), "max_bytes"),
    (re.compile(r"\bwarmup iters:\s*(\d+)"), "warmup_iters"),
    (re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)"), "iters"),
    (re.compile(r"\bvalidation:\s*(\d+)"), "validation"),
)

_HALF_BASE = ("time", "algbw", "busbw", "wrong")
_PENDING_MAX_CHARS = 4096  # a row cut by chatter and continued over more text than this is dropped
# the columns of rows read without a header (today's layout, nccl-tests' writeResultHeader)
_HEADERLESS = (["redop", "root"], 4, False, "current")
_HEADERLESS_COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                       "time", "algbw", "busbw", "#wrong")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")


def _op_from_filename(path: Path) -> str | None:
    key = re.sub(r"[^a-z]", "", path.name.lower())
    for needle, op in _FILENAME_OPS:
        if needle in key:
            return op
    return None


def _looks_like_output(rest: str) -> bool:
    """What follows a ``host: `` prefix is nccl-tests output (so the prefix is pdsh's)."""
    s = rest.lstrip()
    return (not s or s[0] == "#" or s[0].isdigit() or _CHATTER_BARE.match(s) is not None
            or _COMMAND.search(s) is not None or _SRUN.match(rest) is not None)


def strip_prefixes(line: str) -> str:
    """``line`` without launcher prefixes: ``srun -l`` (``12: ``), ``mpirun --tag-output``
    (``[1,0]<stdout>:``), ``pdsh`` (``host: ``, only before nccl-tests output); up to three."""
    for _ in range(3):
        m = _MPIRUN.match(line) or _SRUN.match(line)
        if m is None:
            m = _PDSH.match(line)
            if m is None or not _looks_like_output(line[m.end():]):
                return line
        line = line[m.end():]
    return line


def untag(line: str) -> str:
    """``line`` without ``mpirun --tag-output`` tags (``[1,0]<stdout>:``) wherever they are.

    Open MPI tags every chunk a process writes, so a row printed in pieces carries a tag at each
    piece; the tag is removed and the pieces joined as written (a piece glued to another rank's NCCL
    chatter is then split off by :func:`_split_chatter`)."""
    return _MPIRUN_ANY.sub("", line) if "]<std" in line else line


def _drop_tag_tokens(tokens: list[str]) -> list[str]:
    """A row's fields without launcher labels left inside it (``3:``, ``node01:``): a result field
    never ends with a colon."""
    return [t for t in tokens if not _TAG_TOKEN.match(t)] if any(t.endswith(":") for t in tokens) else tokens


def command_ranks(command: str, start: int, end: int) -> tuple[int | None, str]:
    """(rank count, how it was found) of a command line whose test binary spans ``command[start:end]``.

    Ranks = processes × threads × GPUs: processes from the launcher's options before the binary
    (``mpirun -np P``, ``srun -n P`` or ``srun -N nodes --ntasks-per-node T``; 1 when no launcher is
    named), threads and GPUs from the test's ``-t`` / ``-g`` after it (default 1 each, as nccl-tests'
    own defaults in its common.cu). None when a launcher is named without its process count."""
    before, after = command[:start], command[end:]
    procs: int | None
    m = _CMD_PROCS.search(before)
    if m:
        procs = int(m.group(1))
    else:
        nodes, per = _CMD_NODES.search(before), _CMD_PER_NODE.search(before)
        if nodes and per:
            procs = int(nodes.group(1)) * int(per.group(1))
        elif _LAUNCHER.search(before):
            return None, "a launcher without its process count"
        else:
            procs = 1
    threads = _CMD_THREADS.search(after)
    gpus = _CMD_GPUS.search(after)
    n = procs * (int(threads.group(1)) if threads else 1) * (int(gpus.group(1)) if gpus else 1)
    return n, "command"


def _split_chatter(line: str) -> tuple[str | None, str | None]:
    """(row text before NCCL chatter, the chatter) for a line holding chatter; (None, None) otherwise.

    The row text is None when the line is chatter alone. A row cut by chatter ends with its last
    field glued to the chatter's host name (``... -1node01:40001:40001 [0] NCCL INFO``); that
    field is recovered by its shape (_FIELD_HEAD).
    """
    m = _CHATTER.search(line)
    if m is None:
        m2 = _CHATTER_BARE.match(line)
        return (None, line) if m2 else (None, None)
    before, who = line[: m.start("who")], m.group("who")
    if len(before.split()) < 2:  # a row fragment holds at least size and count
        return None, line[m.start("who"):]
    head = _FIELD_HEAD.match(who)
    glued = head.group(0) if head and head.end() < len(who) else ""
    return before + glued, line[m.start("who") + len(glued):]


def _row_start(tokens: list[str]) -> bool:
    """The tokens begin a result row: size and count (integers), then more."""
    return len(tokens) >= 3 and _INT.match(tokens[0]) is not None and _INT.match(tokens[1]) is not None


def _finite(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _parse_header(tokens: list[str]) -> tuple[list[str], int, bool, str] | None:
    """Columns of a ``# size count type ...`` header: (middle columns, per-half width, timestamp?, layout)."""
    if len(tokens) < 4 or tokens[:3] != ["size", "count", "type"]:
        return None
    time_names = ("time", "cputime")
    try:
        first_time = next(i for i, tok in enumerate(tokens) if tok in time_names)
    except StopIteration:
        return None
    middle = tokens[3:first_time]
    rest = tokens[first_time:]
    layout = "legacy" if "error" in rest else "current"
    per_iter = "i_min" in rest
    half = len(_HALF_BASE) + (len(_PER_ITER) if per_iter else 0)
    timestamp = "timestamp" in rest
    return middle, half, timestamp, layout


class _Bad(Exception):
    """A result row to quarantine; the message is the reason."""


def _value(text: str, what: str, hi: float) -> float:
    try:
        v = float(text)
    except ValueError:
        raise _Bad(f"{what} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise _Bad(f"{what} is {text}")
    if v < 0:
        raise _Bad(f"{what} {text} is negative")
    if v > hi:
        raise _Bad(f"{what} {text} is out of range (above {hi:g})")
    return v


def _whole(text: str, what: str) -> int:
    if not _INT.match(text):
        v = _value(text, what, MAX_SIZE_BYTES)  # raises for nan/inf/negative/huge/non-numbers
        if v != int(v):
            raise _Bad(f"{what} {text} is not a whole number")
        return int(v)
    n = int(text)
    if n < 0:
        raise _Bad(f"{what} {text} is negative")
    if n > MAX_SIZE_BYTES:
        raise _Bad(f"{what} {text} is out of range (above 2**50)")
    return n


def _wrong(text: str) -> int | None:
    if text.upper() == "N/A":
        return None
    return _whole(text, "#wrong")


def _half(tokens: list[str] | None) -> tuple:
    if tokens is None:
        return None, None, None, None
    return (_value(tokens[0], "time", MAX_TIME_US), _value(tokens[1], "algbw", MAX_BW_GBPS),
            _value(tokens[2], "busbw", MAX_BW_GBPS), _wrong(tokens[3]))


def _library_from_code(code: str) -> str | None:
    """``22703`` → ``2.27.3`` (NCCL_VERSION_CODE = major·10000 + minor·100 + patch since 2.9;
    major·1000 + minor·100 + patch before: ``2708`` → ``2.7.8``)."""
    n = int(code)
    if n >= 10000:
        return f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    return f"{n // 1000}.{n // 100 % 10}.{n % 100}"


class _Group:
    """A benchmark run being read."""

    def __init__(self, index: int, line: int):
        self.index = index
        self.first_line = self.last_line = line
        self.header_test: str | None = None  # from "Collective test starting"
        self.command: str | None = None
        self.command_bin: str | None = None
        self.command_op: str | None = None
        self.ranks: dict[int, tuple[int, str, int, str]] = {}
        self.params: dict = {}
        self.header: tuple[list[str], int, bool, str] | None = None
        self.columns: tuple[str, ...] = ()
        self.rows: list[dict] = []
        self.quarantined: list[tuple[int, str]] = []
        self.avg_busbw: float | None = None
        self.oob: tuple[int, bool] | None = None
        self.tests_version: str | None = None
        self.library: str | None = None
        self.library_version: str | None = None
        self.command_ranks: int | None = None  # the rank count its command line gives (command_ranks)
        self.headerless: list[int] = []  # lines of result rows met before any column header, not read
        self.headerless_read: int | None = None  # line of the first row read without a header
        self.closed = False  # a footer or "test concluded" was read
        self.touched = False  # any line of it was read

    def started(self) -> bool:
        """Rows or a footer were read: a line that begins a run begins another one."""
        return bool(self.rows or self.quarantined) or self.closed


class _Reader:
    """The line-by-line state of :func:`parse_nccl_tests`."""

    def __init__(self):
        self.groups: list[_Group] = []
        self.cur = _Group(0, 1)
        self.header_seen = False
        self.pending: tuple[int, str] | None = None  # (line, text) of a row cut by chatter
        self.last_error: tuple[int, str] | None = None  # the last NCCL WARN / srun error / test failure line

    def boundary(self, lineno: int, force: bool = False) -> _Group:
        """A line that begins a run: a new group when the current one has rows (or ``force``)."""
        if self.cur.started() or (force and self.cur.touched):
            self.groups.append(self.cur)
            self.cur = _Group(self.cur.index + 1, lineno)
        elif not self.cur.touched:
            self.cur.first_line = lineno
        self.cur.touched = True
        return self.cur

    def library(self, lib: str, version: str) -> None:
        if self.cur.library_version is None:
            self.cur.library, self.cur.library_version = lib.lower(), version

    def footer(self, stripped: str) -> bool:
        m = _OOB.match(stripped)
        if m:
            n = _finite(m.group("n"))
            if n is not None and 0 <= n <= MAX_SIZE_BYTES and n == int(n):
                self.cur.oob = (int(n), (m.group("verdict") or "").upper() == "FAILED" or n > 0)
            self.cur.closed = True
            return True
        m = _AVG_BUSBW.match(stripped)
        if m:
            v = _finite(m.group("v"))
            if self.cur.avg_busbw is None and v is not None:
                self.cur.avg_busbw = v
            self.cur.closed = True
            return True
        return False

    def command(self, stripped: str, lineno: int) -> None:
        """A line invoking a test binary (``.../all_reduce_perf -b 8 ...``): begins a run."""
        m = _COMMAND.search(stripped)
        if m is None:
            return
        binary = m.group("bin")
        try:
            op = canonical_op(binary)
        except BadInputError:
            op = _op_from_filename(Path(binary))
        if op is None:
            return
        g = self.boundary(lineno, force=self.cur.command is not None)
        g.command, g.command_bin, g.command_op = stripped.lstrip("#$+> ").strip()[:2000], binary, op
        g.command_ranks = command_ranks(stripped, m.start("bin"), m.end())[0]

    def line(self, lineno: int, physical: str) -> None:
        if _FENCE.match(physical):
            return
        line = strip_prefixes(untag(physical))
        if _JOB_ERROR.search(line):
            self.last_error = (lineno, " ".join(line.split())[:300])
        row_text, chatter = _split_chatter(line)
        if chatter is not None:
            m = _LIB_VERSION.search(chatter)
            if m:
                self.library(m.group("lib"), m.group("v"))
            if row_text is None:
                return
            if self.pending is not None:
                self.pending = (self.pending[0], self.pending[1] + " " + row_text)
                if len(self.pending[1]) > _PENDING_MAX_CHARS:  # no row is this long: pieces of no row
                    self.drop_pending()
                return
            if _row_start(row_text.split()):
                self.pending = (lineno, row_text)
                return
            line = row_text  # other output with chatter glued to it: read what came before the chatter
        stripped = line.strip()
        if not stripped:
            return
        if self.pending is not None and (stripped.startswith("#") or _row_start(stripped.split())):
            self.drop_pending()  # the cut row never went on: a new row or a comment line came first
        m = _TESTS_VERSION.match(stripped)
        if m:
            g = self.boundary(lineno, force=self.cur.tests_version is not None)
            kind = m.group("kind").lower()
            g.tests_version = f"{kind}-tests {m.group('v')}"
            mm = _LIB_CODE.search(m.group("rest"))
            if mm and g.library_version is None:
                g.library, g.library_version = kind, _library_from_code(mm.group("code"))
            g.library = g.library or kind
            return
        m = _LIB_VERSION.search(stripped)
        if m and not stripped.startswith("#"):  # "RCCL version 2.18.3+hip6.1 ..." on its own line
            self.library(m.group("lib"), m.group("v"))
            return
        if stripped.startswith("#"):
            self.comment(stripped, lineno)
            return
        if self.footer(stripped):  # very old nccl-tests print the footer without '#'
            return
        tokens = stripped.split()
        row_line = lineno
        if self.pending is not None:
            row_line, tokens = self.pending[0], self.pending[1].split() + tokens
            self.pending = None
        if not _row_start(tokens):
            self.command(stripped, lineno)
            return  # other output
        tokens = _drop_tag_tokens(tokens)
        g = self.cur
        if g.header is None:
            if g.command_op is None or g.command_ranks is None:
                g.headerless.append(row_line)  # numbers before any column header: warned about at the end
                return
            g.header = _HEADERLESS  # an excerpt pasted under its command line: read in today's layout
            g.columns = _HEADERLESS_COLUMNS
            g.headerless_read = row_line
            self.header_seen = True
        g.last_line = lineno
        try:
            g.rows.append(_row(tokens, g.header))
            g.rows[-1]["line"] = row_line
        except _Bad as exc:
            g.quarantined.append((row_line, str(exc)))

    def comment(self, stripped: str, lineno: int) -> None:
        m = _TEST_START.match(stripped)
        if m:
            g = self.boundary(lineno, force=self.cur.header_test is not None)
            g.header_test = m.group("name")
            return
        if _TEST_END.match(stripped):
            self.cur.closed = True
            return
        m = _PARAMS_LINE.match(stripped)
        if m:
            g = self.boundary(lineno, force=bool(self.cur.params or self.cur.header))
            g.params = {"n_threads": int(m.group("nthread")), "n_gpus": int(m.group("ngpus"))}
            for pattern, name in _PARAM_FIELDS:
                mm = pattern.search(m.group("rest"))
                if mm:
                    g.params[name] = int(mm.group(1))
            return
        m = _RANK_LINE.match(stripped)
        if m:
            g = self.boundary(lineno)
            rank = int(m.group("rank"))
            g.ranks[rank] = (rank, m.group("host"), int(m.group("dev")), m.group("name").strip())
            return
        if self.footer(stripped):
            return
        parsed = _parse_header(stripped.lstrip("#").split())
        if parsed is not None:
            g = self.cur
            if g.closed:  # a header after a footer, with no line of a new run: the same set-up again
                g = self.boundary(lineno)
                for name in ("header_test", "command", "command_bin", "command_op", "ranks", "params",
                             "tests_version", "library", "library_version"):
                    value = getattr(self.groups[-1], name)
                    setattr(g, name, dict(value) if isinstance(value, dict) else value)
            g.touched = True
            g.header = parsed
            g.columns = tuple(stripped.lstrip("#").split())
            self.header_seen = True
            return
        self.command(stripped, lineno)

    def drop_pending(self) -> None:
        if self.pending is not None and self.cur.header is not None:
            self.cur.quarantined.append((self.pending[0], "result row cut off by NCCL output and never continued"))
        self.pending = None

    def end(self) -> list[_Group]:
        self.drop_pending()
        self.groups.append(self.cur)
        return self.groups


def parse_nccl_tests(path: str | os.PathLike, op: str | None = None, raw: bytes | None = None) -> NcclTestsLog:
    """Parse an nccl-tests / rccl-tests text log (``all_reduce_perf ... > log``) into runs and rows
    (``raw``: the file's bytes, when the caller has read them; a ``-J`` JSON file is read by
    :func:`tracekit.ingest.nccl_tests_run.read_log`, which takes either).

    ``op`` (any spelling ``canonical_op`` accepts) names the collective of a run whose log
    and file name do not (see the module docstring for the order). Rows keep the printed
    units (µs, GB/s).

    Raises FileError(path, ...) when the file cannot be read, is not an nccl-tests log
    ("not an nccl-tests log: ..."), has a header but no usable result rows, names no
    collective we can find ("... pass --op"), or a group size out of range; BadInputError
    for an unknown ``op`` argument. Bad result rows are quarantined, not raised.
    """
    p = Path(path)
    forced_op = canonical_op(op) if op is not None else None
    if raw is None:
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise FileError(p, f"cannot read: {exc.strerror or exc}") from None
    if b"\x00" in raw[:4096]:
        raise FileError(p, "not an nccl-tests log: binary data")
    text = raw.decode("utf-8", errors="replace")
    filename_op = _op_from_filename(p)
    reader = _Reader()
    for lineno, physical in enumerate(text.splitlines(), start=1):
        if len(physical) > MAX_LINE_CHARS:
            raise FileError(p, f"line {lineno}: {len(physical):,} characters, over the {MAX_LINE_CHARS:,}-character "
                               "limit of an nccl-tests log line (not a log, or damaged)")
        reader.line(lineno, physical)
    groups = reader.end()
    warnings: list[str] = _headerless_warnings(p, groups)
    if not reader.header_seen:
        _refuse_failed_job(p, reader, headerless=sum(len(g.headerless) for g in groups))
        raise FileError(p, "not an nccl-tests log: no '# size count type ... time algbw busbw' column header")
    done = [_with_per_iter(_finish(p, g, forced_op, filename_op, warnings), g) for g in groups if g.rows or g.quarantined]
    quarantined = tuple(q for g in done for q in g.quarantined)
    if not any(g.rows for g in done):
        if quarantined:
            line, why = quarantined[0]
            raise FileError(p, f"no usable result rows: all {len(quarantined)} quarantined (line {line}: {why})")
        if reader.last_error is not None:
            _refuse_failed_job(p, reader, headerless=0)
        raise FileError(p, "nccl-tests log has a column header but no result rows (did the run fail?)")
    last = groups[-1]
    if reader.last_error is not None and last.rows and not last.closed and reader.last_error[0] > last.last_line:
        line, text = reader.last_error
        warnings.append(f"{p.name} benchmark run {last.index}: no footer after its last result row (line "
                        f"{last.last_line}): the job failed mid-run? its last error, line {line}: {text}")
    for g in done:
        if g.quarantined:
            shown = "; ".join(f"line {ln}: {why}" for ln, why in g.quarantined[:3])
            more = f"; and {len(g.quarantined) - 3} more" if len(g.quarantined) > 3 else ""
            warnings.append(f"{p.name} benchmark run {g.index} ({g.op}): {len(g.quarantined)} result row(s) quarantined "
                            f"({shown}{more})")
    done = [g for g in done if g.rows]
    first = done[0]
    return NcclTestsLog(
        path=str(p), op=first.op, test_name=first.test_name, op_source=first.op_source, dtype=first.dtype,
        group_size=first.group_size, group_size_source=first.group_size_source, layout=first.layout,
        columns=first.columns, rows=tuple(r for g in done for r in g.rows), ranks=first.ranks,
        params=first.params, avg_busbw=first.avg_busbw, nccl_version=first.library_version,
        tests_version=first.tests_version, groups=tuple(done), quarantined=quarantined, warnings=tuple(warnings),
    )


def _with_per_iter(done: NcclTestsGroup, g: _Group) -> NcclTestsGroup:
    """``done`` with the ``-I`` summaries its rows carried (:func:`_per_iter_text`)."""
    per_iter = tuple(s for r in g.rows for s in r.get("per_iter", ()))
    return dataclasses.replace(done, per_iter=per_iter) if per_iter else done


def _headerless_warnings(p: Path, groups: list[_Group]) -> list[str]:
    """One warning per benchmark run with rows read without a header, or left unread for want of one."""
    out = []
    for g in groups:
        if g.headerless_read is not None:
            out.append(f"{p.name} benchmark run {g.index}: result rows from line {g.headerless_read} have no column "
                       f"header: read in nccl-tests' current layout (size count type redop root, then time algbw "
                       f"busbw #wrong out-of-place and in-place), op and {g.command_ranks} ranks from the command line")
        if g.headerless:
            lines = g.headerless
            why = ("no command line above them" if g.command_op is None else
                   "the command line above them does not give the rank count (a launcher without -np/-n)")
            out.append(f"{p.name}: {len(lines)} line(s) that look like result rows (lines {lines[0]}-{lines[-1]}) "
                       f"have no column header and were not read: {why}")
    return out


def _refuse_failed_job(p: Path, reader: _Reader, headerless: int) -> None:
    """Raise FileError naming a job that failed (or stopped) before its first result row, when the file
    is such a job's log: it holds an error line (NCCL WARN, srun: error, a test failure) or lines only
    nccl-tests prints (parameters, rank lines, version). Returns when it is neither."""
    if headerless:
        raise FileError(p, f"{headerless} result row(s) without a column header and no command line naming the "
                           "op and ranks above them: not read (paste the '# size count type' header or the "
                           "command line above the rows)")
    if reader.last_error is not None:
        line, text = reader.last_error
        raise FileError(p, f"nccl-tests job failed before its first result row: line {line}: {text}")
    if any(g.ranks or g.params or g.tests_version or g.command is not None for g in reader.groups):
        raise FileError(p, "nccl-tests job stopped before its first result row (no result table, no error "
                           "line: killed or cut off?)")


def _row(tokens: list[str], header: tuple[list[str], int, bool, str]) -> dict:
    """One result row's values (raises _Bad with the reason when it must be quarantined)."""
    long = next((t for t in tokens if len(t) > MAX_TOKEN_CHARS), None)
    if long is not None:
        raise _Bad(f"a field of {len(long):,} characters (longest accepted: {MAX_TOKEN_CHARS})")
    middle_names, half, timestamp, _layout = header
    body = tokens[3:]
    if timestamp and len(body) >= 2 and _TIMESTAMP.match(body[-2]):
        body = body[:-2]
    # between type and time: the header's fields, or one fewer (an unused redop printed as nothing)
    lo = max(0, len(middle_names) - 1)
    if lo <= len(body) - 2 * half <= len(middle_names):
        n_middle = len(body) - 2 * half
        halves = (body[n_middle : n_middle + half], body[n_middle + half :])
    elif lo <= len(body) - half <= len(middle_names):
        n_middle = len(body) - half
        halves = (None, body[n_middle:])
    elif len(body) < lo + 2 * half:
        raise _Bad(f"{len(tokens)} fields, too few for its header (truncated?)")
    else:
        raise _Bad(f"{len(tokens)} fields, more than its header names")
    redop: str | None = None
    root: int | None = None
    for tok in body[:n_middle]:
        # The header names the fields, but an unused redop may be printed as
        # nothing at all (older alltoall), so tell them apart by shape.
        if _INT.match(tok) and "root" in middle_names:
            root = int(tok)
            if not -1 <= root < MAX_RANKS:
                raise _Bad(f"root {tok} is out of range")
        else:
            redop = tok
    size = _whole(tokens[0], "size")
    count = _whole(tokens[1], "count")
    oop = _half(halves[0])
    ip = _half(halves[1])
    per_iter = [_per_iter_text(size, name, h[len(_HALF_BASE):]) for name, h in (("out-of-place", halves[0]),
                ("in-place", halves[1])) if h is not None and len(h) == len(_HALF_BASE) + len(_PER_ITER)]
    return dict(line=0, size_bytes=size, count=count, dtype=tokens[2], redop=redop, root=root,
                oop_time_us=oop[0], oop_algbw=oop[1], oop_busbw=oop[2], oop_wrong=oop[3],
                ip_time_us=ip[0], ip_algbw=ip[1], ip_busbw=ip[2], ip_wrong=ip[3], per_iter=per_iter)


def _per_iter_text(size: int, half: str, tokens: list[str]) -> dict:
    """The ``-I`` columns of one half (``i_min i_max i_p99 i_cv%``: µs, µs, µs, %) as a per-iteration
    summary with the JSON reader's keys; a value that is not a finite number ≥ 0 is None."""
    vals = [_finite(t) for t in tokens]
    vals = [v if v is not None and v >= 0 else None for v in vals]
    return dict(size_bytes=size, half=half, n=None, skipped=None, min_us=vals[0], p50_us=None, p99_us=vals[2],
                max_us=vals[1], cv_pct=vals[3])


# nccl-tests' bus factor busbw/algbw per collective, as a multiple of (n-1)/n (src/<op>.cu, GetBw of each
# test): all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall, gather, scatter (n-1)/n. The others
# (broadcast, reduce, sendrecv: factor 1) do not depend on n.
_BUS_FACTOR_MULT = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0,
                    "gather": 1.0, "scatter": 1.0}
_RATIO_MIN_ALGBW = 1.0  # GB/s: rows below this carry too few printed digits to tell n


def _printed_eps(v: float) -> float:
    """Half a unit of the last digit nccl-tests prints for a bandwidth (``%6.2f`` while it fits 6 characters,
    then one decimal, then none: getFloatStr in its src/util.cu)."""
    return 0.005 if v < 999.995 else 0.05 if v < 9999.95 else 0.5


def ranks_from_ratio(op: str, pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The range [lo, hi] of group sizes n that every (algbw, busbw) pair (GB/s, as printed) fits:
    busbw = algbw · m·(n-1)/n (m = 2 for all_reduce, 1 for all_gather / reduce_scatter / alltoall / gather
    / scatter), each value within half a unit of its last printed digit. None for an op whose factor does
    not depend on n or without a pair of algbw ≥ 1 GB/s; (lo, hi) with lo > hi when no n fits them all;
    hi may be inf (the ratio is at the factor's limit)."""
    m = _BUS_FACTOR_MULT.get(op)
    use = [(a, b) for a, b in pairs if a >= _RATIO_MIN_ALGBW]
    if m is None or not use:
        return None
    lo, hi = 1.0, math.inf
    for a, b in use:
        ea, eb = _printed_eps(a), _printed_eps(b)
        f_lo, f_hi = max(0.0, (b - eb) / (a + ea)) / m, (b + eb) / (a - ea) / m
        lo = max(lo, 1.0 / (1.0 - f_lo) if f_lo < 1 else math.inf)
        hi = min(hi, 1.0 / (1.0 - f_hi) if f_hi < 1 else math.inf)
    return lo, hi


def _ranks_from_ratio(p: Path, g: _Group, op: str, k: int, k_src: str, warnings: list) -> tuple[int, str]:
    """The group size of a run without rank lines, checked against its rows' busbw/algbw ratio
    (:func:`ranks_from_ratio`): kept when the ratio allows it; replaced, with a warning, when the ratio
    allows one size only; kept with a warning naming the range otherwise."""
    return _ranks_from_ratio_rows(p, g.index, g.rows, op, k, k_src, warnings)


def _ranks_from_ratio_rows(p: Path, index: int, rows: list[dict], op: str, k: int, k_src: str,
                           warnings: list) -> tuple[int, str]:
    """:func:`_ranks_from_ratio` on a benchmark run's row dicts (``index``: the run's index in its file)."""
    pairs = [(r[a], r[b]) for r in rows for a, b in (("oop_algbw", "oop_busbw"), ("ip_algbw", "ip_busbw"))
             if r[a] is not None and r[b] is not None]
    rng = ranks_from_ratio(op, pairs)
    if rng is None:
        return k, k_src
    lo, hi = rng
    first, last = math.ceil(lo - 1e-9), math.floor(hi + 1e-9) if math.isfinite(hi) else None
    said = {"nthreads_ngpus": "its nThread × nGpus line", "command": "its command line"}[k_src]
    what = f"{p.name} benchmark run {index} ({op}, no '# Rank' lines)"
    if last is not None and first > last:
        warnings.append(f"{what}: its rows' busbw/algbw ratios fit no single group size; {k} ranks from {said} kept")
        return k, k_src
    if first <= k and (last is None or k <= last):
        return k, k_src
    if last == first and 1 <= first <= MAX_RANKS:
        warnings.append(f"{what}: {said} gives {k} ranks, but its rows' busbw/algbw ratio "
                        f"({_BUS_FACTOR_MULT[op]:g}·(n-1)/n) gives n = {first} (rank lines lost? a multi-process "
                        f"run): {first} ranks used")
        return first, "busbw_ratio"
    span = f"{first}-{last}" if last is not None else f"at least {first}"
    warnings.append(f"{what}: {said} gives {k} ranks, but its rows' busbw/algbw ratio gives n = {span}: "
                    f"{k} kept, its sizes on the wire may be wrong")
    return k, k_src


def _finish(p: Path, g: _Group, forced_op: str | None, filename_op: str | None, warnings: list) -> NcclTestsGroup:
    """The group's op, size and rows as a NcclTestsGroup (FileError when the op or size cannot be told)."""
    found: tuple[str, str] | None = None
    if g.header_test is not None:
        try:
            found = (canonical_op(g.header_test), "header")
        except BadInputError:
            guess = _op_from_filename(Path(g.header_test))
            found = (guess, "header") if guess else None
    if found is None and g.command_op is not None:
        found = (g.command_op, "command")
    if found is None and filename_op is not None:
        found = (filename_op, "filename")
    if found is None and forced_op is not None:
        found = (forced_op, "argument")
    if found is None:
        raise FileError(p, "cannot tell which collective this nccl-tests log ran (no 'Collective test starting' "
                           "line, no command line naming a *_perf binary, no op in the file name): "
                           "pass --op (e.g. --op all_reduce)")
    op, source = found
    if forced_op is not None and forced_op != op:
        where = {"header": "its 'Collective test starting' line", "command": "its command line",
                 "filename": "the file name"}[source]
        warnings.append(f"{p.name} benchmark run {g.index}: --op {forced_op} ignored: {where} says {op}")
    if g.ranks:
        k, k_src = len(g.ranks), "rank_lines"
    elif g.params:
        k, k_src = g.params["n_threads"] * g.params["n_gpus"], "nthreads_ngpus"
    elif g.command_ranks is not None:
        k, k_src = g.command_ranks, "command"
    else:
        raise FileError(p, f"line {g.first_line}: nccl-tests run names no ranks: no '# Rank N ... device' lines, "
                           "no 'nThread/nGpus' line and no command line giving them")
    if not 1 <= k <= MAX_RANKS:
        raise FileError(p, f"line {g.first_line}: nccl-tests run of {k} ranks: out of range (1..{MAX_RANKS})")
    if k_src != "rank_lines":
        k, k_src = _ranks_from_ratio(p, g, op, k, k_src, warnings)
    rows = tuple(NcclTestsRow(op=op, group_size=k, group=g.index, **{c: v for c, v in r.items() if c != "per_iter"})
                 for r in g.rows)
    ranks = tuple(sorted(g.ranks.values()))
    hosts = tuple(dict.fromkeys(r[1] for r in ranks))
    devices = tuple(dict.fromkeys(r[3] for r in ranks if r[3]))
    library = g.library
    if library is None and any("AMD" in d or "Instinct" in d for d in devices):
        library = "rccl"
    dtypes = {r.dtype for r in rows}
    return NcclTestsGroup(
        index=g.index, first_line=g.first_line, last_line=g.last_line, op=op, op_source=source,
        test_name=g.header_test or g.command_bin, command=g.command, group_size=k, group_size_source=k_src, ranks=ranks,
        hosts=hosts, device_names=devices, library=library, library_version=g.library_version,
        tests_version=g.tests_version, layout=g.header[3] if g.header else "current", columns=g.columns,
        params=dict(g.params), dtype=dtypes.pop() if len(dtypes) == 1 else None, rows=rows,
        avg_busbw=g.avg_busbw, oob_values=g.oob[0] if g.oob else None, oob_failed=bool(g.oob and g.oob[1]),
        quarantined=tuple(g.quarantined),
    )


# ── machine facts: hosts, ranks per host, GPU, NICs (tracekit.analyses.machine reads them) ──────────

# NCCL's network choice, one line per process: "host:pid:tid [dev] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB
# [1]mlx5_3:1/RoCE ; OOB ib0:10.0.0.1<0>" (also NET/Socket; the list ends at ';'): one " [i]dev:port/link"
# item per network device in use, printed at init by NCCL's IB and socket transports (src/transport/net_ib*,
# net_socket.cc).
_NET_USING = re.compile(r"(?P<who>\S+):\d+:\d+\s+\[\d+\]\s+NCCL\s+INFO\s+NET/(?P<plugin>IB|Socket)\s*:\s*Using\s+"
                        r"(?P<list>[^;]*)")
_NIC_ITEM = re.compile(r"\[\d+\](?P<name>[A-Za-z0-9_.\-]+)(?::[^\s/<;]*)?(?:/(?P<kind>[A-Za-z]+))?")
# the aws-ofi-nccl plugin: "NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"
_NET_OFI = re.compile(r"(?P<who>\S+):\d+:\d+\s+\[\d+\]\s+NCCL\s+INFO\s+NET/OFI\b(?P<rest>.*)")
_OFI_PROVIDER = re.compile(r"[Ss]elected [Pp]rovider is (?P<p>[\w-]+)")
_OFI_FOUND = re.compile(r"\(found (?P<n>\d+) nics?\)")


def nic_facts(path: str | os.PathLike) -> dict[str, dict]:
    """host → {transport, nics, names} from the NCCL INFO network lines of a log (NCCL_DEBUG=INFO).

    transport: ``IB`` / ``RoCE`` (from the device list's ``/IB`` / ``/RoCE``), ``Socket``, or ``OFI:<provider>``
    (aws-ofi-nccl, e.g. ``OFI:efa``); nics: the number of network devices NCCL uses on that host (the
    largest list printed by any of its processes; for OFI the plugin's "found N nics"); names: their
    device names (``mlx5_0``...; empty for OFI). Empty when the log has no such lines (NCCL_DEBUG unset).
    Raises FileError when the file cannot be read.
    """
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise FileError(p, f"cannot read: {exc.strerror or exc}") from None
    out: dict[str, dict] = {}
    if "NCCL INFO NET/" not in text:
        return out
    for line in text.splitlines():
        if "NET/" not in line:
            continue
        m = _NET_USING.search(line)
        if m is not None:
            items = [(i.group("name"), i.group("kind")) for i in _NIC_ITEM.finditer(m.group("list"))]
            if not items:
                continue
            kinds = {k for _, k in items if k}
            transport = "Socket" if m.group("plugin") == "Socket" else ("RoCE" if kinds == {"RoCE"} else "IB")
            cur = out.get(m.group("who"))
            if cur is None or len(items) > cur["nics"]:
                out[m.group("who")] = dict(transport=transport, nics=len(items), names=[n for n, _ in items])
            continue
        m = _NET_OFI.search(line)
        if m is not None:
            cur = out.setdefault(m.group("who"), dict(transport="OFI", nics=0, names=[]))
            pm = _OFI_PROVIDER.search(m.group("rest"))
            if pm is not None:
                cur["transport"] = f"OFI:{pm.group('p')}"
            fm = _OFI_FOUND.search(m.group("rest"))
            if fm is not None:
                cur["nics"] = max(cur["nics"], int(fm.group("n")))
    return {h: f for h, f in out.items() if f["nics"] > 0}


def machine_facts(g: NcclTestsGroup, nics: dict[str, dict] | None = None) -> dict:
    """The machine one benchmark run ran on, from its "Using devices" rank lines and ``nics``
    (:func:`nic_facts` of its log).

    Keys: ``hosts`` (distinct, sorted), ``nodes`` (their number), ``ranks_per_host`` (ranks on each host
    when every host has the same number, else None), ``max_ranks_per_host``, ``gpu`` (the device name
    when one, else None), ``nics_per_node`` (NCCL's network devices per host when every host of the run
    reported the same number, else None), ``nic`` (transport and device names, ``IB mlx5_0,mlx5_3``, or
    None), ``locality`` (``intra_node``: one host; ``inter_node``: several hosts, one rank on each;
    ``mixed``: several hosts, some with several ranks — NVLink inside a node and the network between
    nodes; ``unknown``), ``locality_reason`` (why unknown, else None), ``source`` (where the facts come
    from, in words).
    """
    from collections import Counter

    per_host = Counter(r[1] for r in g.ranks)
    hosts = sorted(per_host)
    counts = set(per_host.values())
    devices = sorted(set(g.device_names))
    facts = dict(hosts=hosts, nodes=len(hosts), ranks_per_host=counts.pop() if len(counts) == 1 else None,
                 max_ranks_per_host=max(per_host.values(), default=None),
                 gpu=devices[0] if len(devices) == 1 else None, nics_per_node=None, nic=None,
                 locality="unknown", locality_reason=None, source=None)
    if not hosts:
        facts["locality_reason"] = "the log has no 'Using devices' rank lines naming hosts"
        return facts
    facts["source"] = "nccl-tests 'Using devices'"
    if len(hosts) == 1:
        facts["locality"] = "intra_node"
    else:
        facts["locality"] = "inter_node" if facts["max_ranks_per_host"] == 1 else "mixed"
    seen = [nics[h] for h in hosts if nics and h in nics]
    if seen:
        n = {f["nics"] for f in seen}
        facts["nics_per_node"] = n.pop() if len(n) == 1 and len(seen) == len(hosts) else None
        names = sorted({x for f in seen for x in f["names"]})
        kinds = sorted({f["transport"] for f in seen})
        facts["nic"] = " ".join(["/".join(kinds)] + ([",".join(names)] if names else []))
        facts["source"] += ", NCCL INFO NET lines"
    return facts
