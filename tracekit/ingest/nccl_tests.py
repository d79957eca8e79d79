"""Parser for nccl-tests (and rccl-tests) text logs: ``all_reduce_perf`` and friends.

Pure: reads one file, returns a :class:`NcclTestsLog`; turning it into store
tables is someone else's job. Handles both layouts seen in the wild:

- current nccl-tests: ``size count type redop root time algbw busbw #wrong``
  for out-of-place then in-place, every op printing ``redop`` and ``root``
  (``none``/``-1`` when unused), ``#wrong`` a number or ``N/A``, a
  ``# Collective test starting: all_reduce_perf`` line, rank lines
  ``#  Rank  0 Group  0 Pid 1234 on host device  0 [0000:1b:00] NVIDIA H100``;
  optional extras: a trailing timestamp column, per-iteration columns
  (``i_min i_max i_p99 i_cv%``) after each half, ``cputime`` for ``time``;
- older nccl-tests (e.g. the superbench A100 logs): an ``error`` column
  holding ``N/A``, ``root`` only for broadcast/reduce, no ``redop`` for
  all_gather, an empty ``redop`` field for alltoall, rank lines without
  ``Group``, ``NCCL INFO`` lines interleaved with the rows, zero-size rows.

The collective is taken from, in order: the ``op`` argument, the ``Collective
test starting`` line, the file name (``nccl_allreduce.log``,
``all_gather_perf.txt``, ...). The group size is the number of distinct
``# Rank N`` lines, else nThread × nGpus from the parameter line (which
undercounts multi-process MPI runs; ``group_size_source`` says which).
Times are kept as printed: microseconds and GB/s (GB = 1e9).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import BadInputError, FileError
from tracekit.model.ops import canonical_op

__all__ = ["NcclTestsRow", "NcclTestsLog", "parse_nccl_tests"]


@dataclass(frozen=True)
class NcclTestsRow:
    """One result row.

    size_bytes: nccl-tests S; count: elements; dtype: the ``type`` column;
    redop / root: None when the layout has no such column or the field is
    empty; oop_* (out-of-place) and ip_* (in-place): time_us (µs), algbw and
    busbw (GB/s, GB = 1e9, as printed), wrong (int, or None for ``N/A``);
    oop_* are None for a row that printed only the in-place half; line: 1-based
    line number in the file; op, group_size: collective and communicator size
    of the test the row belongs to.
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


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed nccl-tests log.

    op: canonical collective (all_reduce, all_gather, reduce_scatter,
    all_to_all, broadcast, reduce, gather, scatter, send); test_name: the
    binary's name when the log says it (``all_reduce_perf``), else None;
    op_source: ``argument`` / ``header`` / ``filename``; dtype: the single
    ``type`` of the rows (None when they mix types); group_size: ranks in the
    communicator; group_size_source: ``rank_lines`` / ``nthreads_ngpus``;
    ranks: (rank, host, device index, device name) per rank line; params:
    the ``# nThread ...`` line as a dict (n_threads, n_gpus, min_bytes,
    max_bytes, warmup_iters, iters, validation when present); layout:
    ``current`` (``#wrong`` column) or ``legacy`` (``error`` column);
    columns: the header's column names; rows: the result rows in file
    order; avg_busbw: the ``# Avg bus bandwidth`` figure (GB/s) when present;
    nccl_version: from the version line when present.
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
    r"device\s+(?P<dev>\d+)\s+\[[^\]]*\]\s*(?P<name>.*?)\s*$"
)
_PARAMS_LINE = re.compile(r"^#\s*nThread\s+(?P<nthread>\d+)\s+nGpus\s+(?P<ngpus>\d+)\b(?P<rest>.*)$")
_TEST_START = re.compile(r"^#\s*Collective test starting:\s*(?P<name>\S+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(?P<v>\S+)")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<v>[0-9.eE+-]+)")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}$")
_INT = re.compile(r"[+-]?\d+$")

_PARAM_FIELDS = (
    (re.compile(r"\bminBytes\s+(\d+)"), "min_bytes"),
    (re.compile(r"\bmaxBytes\s+(\d+)"), "max_bytes"),
    (re.compile(r"\bwarmup iters:\s*(\d+)"), "warmup_iters"),
    (re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)"), "iters"),
    (re.compile(r"\bvalidation:\s*(\d+)"), "validation"),
)

_HALF_BASE = ("time", "algbw", "busbw", "wrong")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")


def _op_from_filename(path: Path) -> str | None:
    key = re.sub(r"[^a-z]", "", path.name.lower())
    for needle, op in _FILENAME_OPS:
        if needle in key:
            return op
    return None


def _number(text: str, path: Path, lineno: int, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise FileError(path, f"line {lineno}: bad {what} {text!r} in a result row") from None


def _wrong(text: str, path: Path, lineno: int) -> int | None:
    if text.upper() == "N/A":
        return None
    return int(_number(text, path, lineno, "#wrong"))


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


def parse_nccl_tests(path: str | os.PathLike, op: str | None = None) -> NcclTestsLog:
    """Parse an nccl-tests text log (``all_reduce_perf ... > log``) into rows.

    ``op`` overrides the collective (any spelling ``canonical_op`` accepts);
    otherwise it comes from the log's ``Collective test starting`` line or
    the file name. Rows keep the printed units (µs, GB/s). A log holding
    several tests one after the other gets each row's ``op`` from its own
    test; the log's ``op``/``group_size`` are those of the first.

    Raises FileError(path, ...) when the file cannot be read, is not an
    nccl-tests log ("not an nccl-tests log: ..."), has a header but no
    result rows, has a malformed result row, or names no collective we can
    find; BadInputError for an unknown ``op`` argument.
    """
    p = Path(path)
    forced_op = canonical_op(op) if op is not None else None
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise FileError(p, f"cannot read: {exc.strerror or exc}") from None
    if b"\x00" in raw[:4096]:
        raise FileError(p, "not an nccl-tests log: binary data")
    text = raw.decode("utf-8", errors="replace")

    header: tuple[list[str], int, bool, str] | None = None
    columns: tuple[str, ...] = ()
    rows: list[NcclTestsRow] = []
    rank_entries: dict[int, tuple[int, str, int, str]] = {}
    first_ranks: dict[int, tuple[int, str, int, str]] | None = None
    params: dict = {}
    first_params: dict | None = None
    test_name: str | None = None
    first_test_name: str | None = None
    current_op: str | None = None
    first_op: str | None = None
    first_group: tuple[int, str] | None = None
    first_layout, first_columns = "current", ()
    avg_busbw: float | None = None
    nccl_version: str | None = None
    filename_op = _op_from_filename(p)

    def section_op() -> tuple[str | None, str]:
        if forced_op is not None:
            return forced_op, "argument"
        if test_name is not None:
            try:
                return canonical_op(test_name), "header"
            except BadInputError:
                guess = _op_from_filename(Path(test_name))
                if guess is not None:
                    return guess, "header"
        return filename_op, "filename"

    def section_group() -> tuple[int, str] | None:
        if rank_entries:
            return len(rank_entries), "rank_lines"
        if params:
            return params["n_threads"] * params["n_gpus"], "nthreads_ngpus"
        return None

    op_source = "filename"
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            m = _TEST_START.match(stripped)
            if m:
                test_name = m.group("name")
                rank_entries = {}
                params = {}
                header = None
                continue
            m = _VERSION.match(stripped)
            if m:
                nccl_version = nccl_version or m.group("v")
                continue
            m = _PARAMS_LINE.match(stripped)
            if m:
                if rows and header is not None:  # a new run concatenated after the previous one
                    rank_entries = {}
                    header = None
                params = {"n_threads": int(m.group("nthread")), "n_gpus": int(m.group("ngpus"))}
                for pattern, name in _PARAM_FIELDS:
                    mm = pattern.search(m.group("rest"))
                    if mm:
                        params[name] = int(mm.group(1))
                continue
            m = _RANK_LINE.match(stripped)
            if m:
                rank = int(m.group("rank"))
                rank_entries[rank] = (rank, m.group("host"), int(m.group("dev")), m.group("name"))
                continue
            m = _AVG_BUSBW.match(stripped)
            if m:
                if avg_busbw is None:
                    avg_busbw = float(m.group("v"))
                continue
            parsed = _parse_header(stripped.lstrip("#").split())
            if parsed is not None:
                header = parsed
                columns = tuple(stripped.lstrip("#").split())
            continue
        if header is None:
            continue  # NCCL INFO lines and other chatter before the table
        tokens = stripped.split()
        if len(tokens) < 3 or not _INT.match(tokens[0]) or not _INT.match(tokens[1]):
            continue  # NCCL INFO / WARN lines interleaved with the rows
        middle_names, half, timestamp, _layout = header
        body = tokens[3:]
        if timestamp and len(body) >= 2 and _TIMESTAMP.match(body[-2]):
            body = body[:-2]
        if len(body) >= 2 * half:
            n_middle = len(body) - 2 * half
            halves = (body[n_middle : n_middle + half], body[n_middle + half :])
        elif len(body) >= half:
            n_middle = len(body) - half
            halves = (None, body[n_middle:])
        else:
            raise FileError(p, f"line {lineno}: result row has {len(tokens)} fields, too few for its header")
        if n_middle > len(middle_names):
            raise FileError(
                p,
                f"line {lineno}: result row has {n_middle} fields between type and time, "
                f"the header names {len(middle_names)}",
            )
        redop: str | None = None
        root: int | None = None
        for tok in body[:n_middle]:
            # The header names the fields, but an unused redop may be printed as
            # nothing at all (older alltoall), so tell them apart by shape.
            if _INT.match(tok) and "root" in middle_names:
                root = int(tok)
            else:
                redop = tok
        if current_op is None or section_op()[0] != current_op:
            current_op, src = section_op()
            if current_op is None:
                raise FileError(
                    p,
                    "cannot tell which collective this nccl-tests log ran (no 'Collective test starting' "
                    "line and no op in the file name): pass op=",
                )
            if first_op is None:
                first_op, op_source = current_op, src
                first_test_name = test_name
                first_params = dict(params)
                first_ranks = dict(rank_entries)
                first_layout, first_columns = header[3], columns
        group = section_group()
        if group is None:
            raise FileError(
                p, "nccl-tests log names no ranks: no '# Rank N ... device' lines and no 'nThread/nGpus' line"
            )
        if first_group is None:
            first_group = group
        oop, ip = halves
        oop_vals = (
            (None, None, None, None)
            if oop is None
            else (
                _number(oop[0], p, lineno, "time"),
                _number(oop[1], p, lineno, "algbw"),
                _number(oop[2], p, lineno, "busbw"),
                _wrong(oop[3], p, lineno),
            )
        )
        rows.append(
            NcclTestsRow(
                line=lineno,
                op=current_op,
                group_size=group[0],
                size_bytes=int(tokens[0]),
                count=int(tokens[1]),
                dtype=tokens[2],
                redop=redop,
                root=root,
                oop_time_us=oop_vals[0],
                oop_algbw=oop_vals[1],
                oop_busbw=oop_vals[2],
                oop_wrong=oop_vals[3],
                ip_time_us=_number(ip[0], p, lineno, "time"),
                ip_algbw=_number(ip[1], p, lineno, "algbw"),
                ip_busbw=_number(ip[2], p, lineno, "busbw"),
                ip_wrong=_wrong(ip[3], p, lineno),
            )
        )

    if header is None and not rows:
        raise FileError(p, "not an nccl-tests log: no '# size count type ... time algbw busbw' column header")
    if not rows:
        raise FileError(p, "nccl-tests log has a column header but no result rows (did the run fail?)")
    assert first_op is not None and first_group is not None
    dtypes = {r.dtype for r in rows}
    return NcclTestsLog(
        path=str(p),
        op=first_op,
        test_name=first_test_name,
        op_source=op_source,
        dtype=dtypes.pop() if len(dtypes) == 1 else None,
        group_size=first_group[0],
        group_size_source=first_group[1],
        layout=first_layout,
        columns=first_columns,
        rows=tuple(rows),
        ranks=tuple(sorted((first_ranks or {}).values())),
        params=first_params or {},
        avg_busbw=avg_busbw,
        nccl_version=nccl_version,
    )
