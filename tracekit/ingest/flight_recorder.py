"""PyTorch Flight Recorder dumps → the store's ``fr_entries``, ``fr_groups`` and ``fr_dumps`` tables.

Flight Recorder (``torch/csrc/distributed/c10d/FlightRecorder.hpp`` and ``FlightRecorderDetail.hpp``
in torch 2.13) keeps, in every rank, a ring buffer of the last ``TORCH_FR_BUFFER_SIZE``
collectives and point-to-point calls that rank issued, and dumps it on demand
(``torch._C._distributed_c10d._dump_fr_trace`` → pickle bytes, ``_dump_fr_trace_json`` → JSON
bytes) or, on NCCL, when the watchdog times out (``TORCH_NCCL_DUMP_ON_TIMEOUT``; file
``$TORCH_FR_DUMP_TEMP_FILE<rank>``, by default ``/tmp/nccl_trace_rank_<rank>``). One dump is one
rank's buffer; a hang's dumps are one file per rank.

The dump (both forms hold the same dict; the reader in torch is
``torch/distributed/flight_recorder/components/loader.py``)::

    version           "2.10" in torch 2.13 ("MAJOR.MINOR" text)
    comm_lib_version  NCCL version text ("" on gloo)
    pg_config         {pg_name: {name, desc, ranks: "[0, 1]" (text)}}   (on gloo 2.13: one empty entry)
    pg_status         {pg_name: {last_enqueued_collective, last_started_collective, last_completed_collective}}
    entries           [entry, ...] in record order (oldest first)

and each entry: ``record_id``, ``pg_id``, ``process_group`` ((pg_name, pg_desc)),
``collective_seq_id``, ``p2p_seq_id``, ``op_id``, ``profiling_name`` ("gloo:all_reduce",
"nccl:_allgather_base", ...), ``time_created_ns`` (wall clock, ns since the epoch),
``input_sizes`` / ``output_sizes`` (one shape per tensor), ``input_dtypes`` / ``output_dtypes``
("Float", "BFloat16", ...), ``state`` (scheduled / started / completed; gloo never moves past
scheduled), ``time_discovered_started_ns`` / ``time_discovered_completed_ns`` (None or 0 when not
seen), ``duration_ms`` (only where timing was enabled and the work completed), ``retired``,
``timeout_ms``, ``is_p2p``, ``thread_id``, ``thread_name`` and, in the pickle (and JSON when asked
for stacks), ``frames`` ([{name, filename, line}], innermost first).

Accepted versions: major 1 and 2 (every form torch has written since Flight Recorder appeared
in 2.2; fields that a version lacks are stored as null). A dump of another major version is
refused (BadInputError naming the file).

A dump holds no rank: the rank is taken from the file name (``rank3``, ``rank-3``, or the trailing
digits torch's own names end with: ``nccl_trace_rank_3``), or from a ``tracekit`` key that
tracekit's profile agent adds to the JSON dumps it writes (rank, world size, the process groups'
global ranks, the dump time).

Pickles are read by :class:`SafeUnpickler`: it admits only the opcodes of builtin containers and
scalars (dict, list, tuple, set, str, bytes, int, float, bool, None); any global (a class or a
function, the only way a pickle executes code) refuses the file before anything is built.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any

from tracekit.errors import BadInputError, FileError

FR_SUFFIXES = (".pkl", ".pickle")
"""File names that are always read as Flight Recorder pickles."""

ACCEPTED_MAJOR_VERSIONS = (1, 2)
"""Major schema versions of the dump this reader accepts (torch 2.13 writes "2.10")."""

_FR_JSON_HEAD = re.compile(rb'^\s*\{\s*"(comm_lib_version|entries|pg_config|pg_status|version|tracekit)"')
_FR_PICKLE_KEY = re.compile(rb"(version|entries|pg_config|comm_lib_version|pg_status)")
_TRAILING_RANK = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$", re.I)

DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8, "ComplexDouble": 16,
}
"""Bytes per element of the dtype names (c10::ScalarType names) Flight Recorder writes."""


def _checked_list(kind):
    def build(data):
        if not isinstance(data, list) or not all(type(x) in kind for x in data):
            raise pickle.UnpicklingError("a typed list holding something else")
        return list(data)
    return build


_JIT_LIST_BUILDERS = {"build_intlist": _checked_list((int,)), "build_doublelist": _checked_list((float,)),
                      "build_boollist": _checked_list((bool,))}
"""The typed-list markers torch's C++ pickler (torch::jit::pickle_save) may write around a list of
ints, floats or bools (``torch/jit/_pickle.py``): each is answered by a check and ``list``."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds builtin containers and scalars only.

    ``find_class`` (reached by the GLOBAL / STACK_GLOBAL opcodes: every class, function or
    reduce target) and ``persistent_load`` raise :class:`pickle.UnpicklingError`, so a pickle
    naming any callable is refused before it is called; the one exception is the typed-list markers
    of torch's C++ pickler (:data:`_JIT_LIST_BUILDERS`), answered by our own checked ``list``.
    """

    def find_class(self, module, name):
        if module == "torch.jit._pickle" and name in _JIT_LIST_BUILDERS:
            return _JIT_LIST_BUILDERS[name]  # a builtin stand-in: torch's code is never imported or called
        raise pickle.UnpicklingError(f"holds an object of type {module}.{name}, not a builtin container or scalar")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("holds a persistent reference, not a builtin container or scalar")


def is_fr_dump(path: Path) -> bool:
    """Whether ``path`` looks like a Flight Recorder dump: a ``.pkl``/``.pickle`` file, a pickle
    (first byte 0x80, the protocol opcode) whose name ends in a rank number and which opens a dict
    naming one of the dump's keys in its first 80 bytes, or a JSON object whose first key is one of
    the dump's (``_dump_fr_trace_json`` writes its keys sorted: ``comm_lib_version`` first).
    Unreadable files are not."""
    name = path.name.lower()
    if name.endswith(FR_SUFFIXES):
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return False
    if head[:1] == b"\x80" and _TRAILING_RANK.search(path.name):
        # a pickle that opens a dict whose first key is one of the dump's (torch writes "version"
        # first); other pickles (a legacy torch.save checkpoint named ckpt_100) are not taken
        i = 11 if head[2:3] == b"\x95" else 2  # protocol 4+: a FRAME opcode (8-byte length) first
        return head[i:i + 1] == b"}" and bool(_FR_PICKLE_KEY.search(head[:80]))
    from tracekit.ingest.nccl_tests_json import is_nccl_tests_json

    # nccl-tests' -J output opens {"version": N, "start_time": ...} too: not a dump
    return bool(_FR_JSON_HEAD.match(head)) and not is_nccl_tests_json(head)


def load_dump(path: Path) -> dict:
    """The dump's dict, from a pickle (by :class:`SafeUnpickler`) or JSON.

    Raises FileError (one line naming the file) for an object outside the builtin types, a file
    that is neither form, a dict without ``entries`` / ``version``, or a major version outside
    :data:`ACCEPTED_MAJOR_VERSIONS`.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise FileError(path, f"cannot read it ({exc.strerror or exc})") from None
    if data[:1] == b"\x80":
        try:
            dump = SafeUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as exc:
            raise FileError(path, f"Flight Recorder pickle refused: {exc}") from None
        except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError) as exc:
            raise FileError(path, f"not a readable Flight Recorder pickle ({type(exc).__name__}: {exc})") from None
    else:
        try:
            dump = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise FileError(path, f"neither a pickle nor valid JSON ({str(exc)[:100]})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list) or "version" not in dump:
        raise FileError(path, "not a Flight Recorder dump (no 'version' and 'entries' list)")
    ver = str(dump["version"])
    try:
        major = int(ver.split(".")[0])
    except ValueError:
        major = None
    if major not in ACCEPTED_MAJOR_VERSIONS:
        raise FileError(path, f"Flight Recorder dump version {ver!r}: this tracekit reads major versions "
                              f"{', '.join(map(str, ACCEPTED_MAJOR_VERSIONS))}")
    return dump


def dump_rank(path: Path, dump: dict) -> int | None:
    """The rank a dump belongs to: the ``tracekit.rank`` key, else the file name (see module doc)."""
    from tracekit.ingest.staging import rank_from_filename

    tk = dump.get("tracekit")
    if isinstance(tk, dict) and type(tk.get("rank")) is int:
        return tk["rank"]
    r = rank_from_filename(path)
    if r is not None:
        return r
    m = _TRAILING_RANK.search(Path(path).name)
    return int(m.group(1)) if m else None


def _int(v) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _sizes(v) -> list[list[int]] | None:
    if not isinstance(v, (list, tuple)):
        return None
    out = []
    for s in v:
        if not isinstance(s, (list, tuple)):
            return None
        out.append([x if isinstance(x, int) and not isinstance(x, bool) else -1 for x in s])
    return out


def _strs(v) -> list[str] | None:
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else None


def fr_op(profiling_name: str | None) -> str | None:
    """The canonical op of a Flight Recorder ``profiling_name`` ("gloo:all_reduce" → all_reduce,
    "nccl:_allgather_base" → all_gather, "nccl:send 0->1" → send), else the name without its
    backend prefix; None for no name."""
    from tracekit.model.ops import canonical_op

    if not profiling_name:
        return None
    name = str(profiling_name)
    op = canonical_op(name, trace=True)
    if op is None:
        bare = name.split(":", 1)[-1].strip()
        op = canonical_op(bare.split(" ")[0], trace=True) or bare
    return op


def tensor_bytes(sizes: list[list[int]] | None, dtypes: list[str] | None) -> int | None:
    """Σ over tensors of numel × bytes per element; None when a shape or dtype is unknown."""
    if sizes is None or dtypes is None or len(sizes) != len(dtypes):
        return None
    total = 0
    for shape, dt in zip(sizes, dtypes):
        b = DTYPE_BYTES.get(dt)
        if b is None or any(x < 0 for x in shape):
            return None
        n = 1
        for x in shape:
            n *= x
        total += n * b
    return total


def _frames(v) -> list[str] | None:
    if not isinstance(v, list):
        return None
    out = []
    for f in v:
        if isinstance(f, dict):
            out.append(f"{f.get('name', '?')} {f.get('filename', '?')}:{f.get('line', '?')}")
    return out


def entry_rows(run_id: str, rank: int, dump: dict) -> list[dict]:
    """The ``fr_entries`` rows of one rank's dump (FR_ENTRIES_SCHEMA, tracekit.store)."""
    rows = []
    for i, e in enumerate(dump.get("entries") or []):
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group")
        pg_name = str(pg[0]) if isinstance(pg, (list, tuple)) and len(pg) > 0 else None
        pg_desc = str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else None
        if pg_name is None and e.get("pg_id") is not None:
            pg_name = str(e.get("pg_id"))
        ins, outs = _sizes(e.get("input_sizes")), _sizes(e.get("output_sizes"))
        idt, odt = _strs(e.get("input_dtypes")), _strs(e.get("output_dtypes"))
        started, completed = _int(e.get("time_discovered_started_ns")), _int(e.get("time_discovered_completed_ns"))
        dur_ms = e.get("duration_ms")
        rows.append(dict(
            run_id=run_id, rank=rank, record_id=i if _int(e.get("record_id")) is None else _int(e.get("record_id")),
            pg_id=_int(e.get("pg_id")), pg_name=pg_name, pg_desc=pg_desc,
            collective_seq_id=_int(e.get("collective_seq_id")), p2p_seq_id=_int(e.get("p2p_seq_id")),
            op_id=_int(e.get("op_id")), profiling_name=e.get("profiling_name"), op=fr_op(e.get("profiling_name")),
            is_p2p=e.get("is_p2p") if isinstance(e.get("is_p2p"), bool) else None,
            input_sizes=ins, output_sizes=outs, input_dtypes=idt, output_dtypes=odt,
            in_bytes=tensor_bytes(ins, idt), out_bytes=tensor_bytes(outs, odt),
            state=e.get("state"), retired=e.get("retired") if isinstance(e.get("retired"), bool) else None,
            time_created_ns=_int(e.get("time_created_ns")),
            time_started_ns=started or None, time_completed_ns=completed or None,
            duration_ns=round(float(dur_ms) * 1e6) if isinstance(dur_ms, (int, float)) and not isinstance(dur_ms, bool) else None,
            timeout_ms=_int(e.get("timeout_ms")), thread_id=None if e.get("thread_id") is None else str(e.get("thread_id")),
            thread_name=e.get("thread_name"), frames=_frames(e.get("frames")),
        ))
    return rows


def _ranks_list(v) -> list[int] | None:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return [int(x) for x in v]
    return None


def group_rows(run_id: str, rank: int, dump: dict) -> list[dict]:
    """The ``fr_groups`` rows of one dump: each process group with its global ranks, from the
    dump's ``pg_config`` (skipped where its ranks are empty, as on gloo) and the ``tracekit.groups``
    key tracekit's agent writes ({pg_name: {desc, ranks}}; it wins where both name a group)."""
    found: dict[str, dict] = {}
    cfg = dump.get("pg_config")
    if isinstance(cfg, dict):
        for name, g in cfg.items():
            if not isinstance(g, dict) or not name:
                continue
            ranks = _ranks_list(g.get("ranks"))
            if ranks:
                found[str(name)] = dict(pg_desc=g.get("desc"), ranks=ranks, source="pg_config")
    tk = dump.get("tracekit")
    if isinstance(tk, dict) and isinstance(tk.get("groups"), dict):
        for name, g in tk["groups"].items():
            ranks = _ranks_list(g.get("ranks")) if isinstance(g, dict) else None
            if ranks:
                found[str(name)] = dict(pg_desc=g.get("desc"), ranks=ranks, source="tracekit")
    return [dict(run_id=run_id, rank=rank, pg_name=n, pg_desc=g["pg_desc"], ranks=g["ranks"], source=g["source"])
            for n, g in sorted(found.items())]


def dump_row(run_id: str, rank: int, path: Path, sha: str, dump: dict) -> dict:
    """The ``fr_dumps`` row of one dump."""
    tk = dump.get("tracekit") if isinstance(dump.get("tracekit"), dict) else {}
    return dict(run_id=run_id, rank=rank, source_path=str(Path(path).resolve()), source_sha256=sha,
                version=str(dump.get("version")), comm_lib_version=dump.get("comm_lib_version") or None,
                entries=len(dump.get("entries") or []),
                pg_status=json.dumps(dump.get("pg_status"), sort_keys=True, default=str) if dump.get("pg_status") is not None else None,
                dumped_at_ns=_int(tk.get("dumped_at_ns")), world_size=_int(tk.get("world_size")),
                reason=tk.get("reason"))


def read_dumps(files: list[Path], digests: list[str], run_id: str) -> tuple[list[dict], list[dict], list[dict], int | None]:
    """Read every dump: (fr_entries rows, fr_groups rows, fr_dumps rows, world size when a dump
    says it). Raises FileError for an unreadable dump, one whose rank cannot be told, or two dumps
    of one rank."""
    entries, groups, dumps = [], [], []
    seen: dict[int, Path] = {}
    world = None
    for f, sha in zip(files, digests):
        d = load_dump(f)
        rk = dump_rank(f, d)
        if rk is None or rk < 0:
            raise FileError(f, "cannot tell which rank this Flight Recorder dump is (no rank number in its name)")
        if rk in seen:
            raise FileError(f, f"a second Flight Recorder dump of rank {rk} (the first: {seen[rk]})")
        seen[rk] = f
        entries += entry_rows(run_id, rk, d)
        groups += group_rows(run_id, rk, d)
        row = dump_row(run_id, rk, f, sha, d)
        dumps.append(row)
        world = world or row["world_size"]
    return entries, groups, dumps, world


def write_tables(stage: Path, entries: list[dict], groups: list[dict], dumps: list[dict]) -> None:
    """Write fr_entries.parquet, fr_groups.parquet, fr_dumps.parquet into a staged run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracekit.store import FR_DUMPS_SCHEMA, FR_ENTRIES_SCHEMA, FR_GROUPS_SCHEMA, PARQUET_OPTS

    for name, rows, schema in (("fr_entries", entries, FR_ENTRIES_SCHEMA), ("fr_groups", groups, FR_GROUPS_SCHEMA),
                               ("fr_dumps", dumps, FR_DUMPS_SCHEMA)):
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), Path(stage) / f"{name}.parquet", **PARQUET_OPTS)


def build_fr_run(stage: Path, run_id: str, files: list[Path], digests: list[str], *, config: dict,
                 workload: str | None) -> None:
    """A run of Flight Recorder dumps only: run.parquet, ranks.parquet (one row per dump, no
    events), an empty events file and collectives, and the fr_* tables."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datetime import datetime, timezone

    from tracekit.store import SCHEMA_VERSION
    from tracekit.store import (COLLECTIVES_SCHEMA, EVENTS_SCHEMA, PARQUET_OPTS, RANKS_SCHEMA, RUNS_SCHEMA)

    entries, groups, dumps, world = read_dumps(files, digests, run_id)
    write_tables(stage, entries, groups, dumps)
    (Path(stage) / "events").mkdir()
    pq.write_table(EVENTS_SCHEMA.empty_table(), Path(stage) / "events" / "rank=0.parquet", **PARQUET_OPTS)
    pq.write_table(COLLECTIVES_SCHEMA.empty_table(), Path(stage) / "collectives.parquet", **PARQUET_OPTS)
    ranks = [dict(run_id=run_id, rank=d["rank"], host=None, source_path=d["source_path"],
                  source_sha256=d["source_sha256"], clock_offset_ns=0, clock_offset_err_ns=0, events=0,
                  events_quarantined=0, warnings=[], gpu_events=0, same_stream_overlaps=0)
             for d in sorted(dumps, key=lambda d: d["rank"])]
    pq.write_table(pa.Table.from_pylist(ranks, schema=RANKS_SCHEMA), Path(stage) / "ranks.parquet", **PARQUET_OPTS)
    libs = {d["comm_lib_version"] for d in dumps if d["comm_lib_version"]}
    backends = {str(e["profiling_name"]).split(":", 1)[0] for e in entries if e["profiling_name"] and ":" in str(e["profiling_name"])}
    world = world or (config or {}).get("world_size") or (max(d["rank"] for d in dumps) + 1 if dumps else 0)
    run = dict(run_id=run_id, created_at=datetime.now(timezone.utc), source="flight_recorder",
               workload=workload or (config or {}).get("workload") or "external",
               backend=next(iter(backends)) if len(backends) == 1 else "unknown", world_size=int(world),
               torch_version=None, nccl_version=next(iter(libs)) if len(libs) == 1 else None, device_name=None,
               config=json.dumps(config or {}, sort_keys=True, default=str), schema_version=SCHEMA_VERSION)
    pq.write_table(pa.Table.from_pylist([run], schema=RUNS_SCHEMA), Path(stage) / "run.parquet", **PARQUET_OPTS)
    from tracekit.store import write_empty_summaries

    write_empty_summaries(stage)  # no events: nothing to summarise, but the analyses read the files


__all__ = ["SafeUnpickler", "is_fr_dump", "load_dump", "read_dumps", "build_fr_run", "write_tables", "fr_op"]
