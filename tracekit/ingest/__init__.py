"""Ingest: trace files → one run in the Parquet store.

:func:`ingest_paths` is the single entry point (the CLI, the collectors and the
tests call it). It expands directories into rank files, reads each with the
reader for its format, links and classifies events, derives the collectives,
and commits the run to the store atomically (``tracekit.store.Staging``).
Nothing downstream knows which format a run came from.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from tracekit.errors import BadInputError, FileError
from tracekit.ingest.engine import default_jobs, make_engine
from tracekit.ingest.staging import rank_from_filename

KINETO_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite", ".nsys-rep")
PARALLEL_MIN_BYTES = 32 << 20  # below this, worker start-up costs more than it saves




def expand_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Files to ingest: files as given, directories expanded to their trace files (sorted).

    Raises FileError for a missing path or a directory without trace files,
    BadInputError when nothing is given.
    """
    if not paths:
        raise BadInputError("no input paths given")
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileError(p, "no such file or directory")
        if p.is_dir():
            try:
                entries = sorted(q for q in p.iterdir() if q.is_file())
            except OSError as exc:
                raise FileError(p, f"cannot list the directory ({exc.strerror or exc})") from None
            found = [q for q in entries if q.name.endswith(KINETO_SUFFIXES + (".sqlite",))
                     and q.name != "run_config.json"
                     or (_NCCL_JSON_PROBED.search(q.name) and _is_nccl_tests_json_file(q))]  # FILE.0 of -J
            # a report beside its own export (nsys profile --export=sqlite writes both): the export
            found += [q for q in entries if q.name.endswith(".nsys-rep")
                      and not q.with_name(q.name[: -len(".nsys-rep")] + ".sqlite").exists()]
            found += [q for q in entries if q.name.endswith(NCCL_TESTS_SUFFIXES) and _looks_like_nccl_tests(q)]
            from tracekit.ingest.flight_recorder import is_fr_dump  # Flight Recorder dumps (pickle; JSON is above)

            found += [q for q in entries if q not in found and is_fr_dump(q)]
            if not found:
                try:  # one level down only: a folder of runs is named run by run, never read as one run
                    subs = sorted(q.name for q in p.iterdir() if q.is_dir() and not q.name.startswith("."))
                except OSError:
                    subs = []
                hint = ""
                if subs:
                    shown = ", ".join(f"{n}/" for n in subs[:5]) + (f" and {len(subs) - 5} more" if len(subs) > 5 else "")
                    hint = f"; it has subfolders ({shown}): ingest each as its own run"
                raise FileError(
                    p, "directory holds no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep, nccl-tests logs, "
                       "Flight Recorder dumps)" + hint
                )
            out.extend(sorted(found))
        elif not p.is_file():
            raise FileError(p, "not a regular file")
        else:
            out.append(p)
    return out


NCCL_TESTS_SUFFIXES = (".log", ".txt", ".out", ".md")
"""Files of a directory that are read as nccl-tests logs when they look like one (``slurm-123.out``,
``all_reduce.log``, a Markdown report with the log in a code fence)."""
_NCCL_TESTS_HEAD = 1 << 20
_PARAMS_MARK = re.compile(rb"#\s*nThread\s+\d+\s+nGpus\s+\d+")
_HEADER_MARK = re.compile(rb"#\s*size\s+count\s+type\b")
_TAGGED = re.compile(rb"^\s*\[\d+,\d+\]<std(?:out|err|diag)>:")
_BINARY_MARK = re.compile(rb"(?<![\w.-])(?:all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce|sendrecv"
                          rb"|gather|scatter|hypercube)_perf(?:_mpi)?\b")


# nccl-tests' JSON writer names its file FILE.0, FILE.1... when FILE exists (jsonOutputInit, src/util.cu)
_NCCL_JSON_PROBED = re.compile(r"\.json\.\d+$")


def _is_nccl_tests_json_file(path: Path) -> bool:
    """The file opens as nccl-tests' JSON output does (False when it cannot be read)."""
    from tracekit.ingest.nccl_tests_json import is_nccl_tests_json

    try:
        with open(path, "rb") as fh:
            return is_nccl_tests_json(fh.read(256))
    except OSError:
        return False


def _looks_like_nccl_tests(path: Path) -> bool:
    """A .log/.txt/.out/.md in a directory is taken only when its first MiB holds nccl-tests'
    parameter line (``# nThread 1 nGpus 8 ...``) or its column header (``# size count type``);
    a .log/.txt/.out also when it says ``out-of-place`` (NCCL's INFO lines can come first) or names a
    test binary (``all_reduce_perf``: a job that failed before its first line of output).
    Unreadable files are left out (a trace directory's unreadable side file is not a log)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_NCCL_TESTS_HEAD)
    except OSError:
        return False
    if _PARAMS_MARK.search(head) or _HEADER_MARK.search(head):
        return True
    if not path.name.endswith(".md") and _BINARY_MARK.search(head):
        return True  # a job that ran a test binary and failed before printing its parameters
    return not path.name.endswith(".md") and b"out-of-place" in head


def _source_kind(path: Path) -> str:
    """``kineto`` (JSON or gzip), ``nsys`` (SQLite) or ``nccl_tests`` (nccl-tests' own JSON, opening
    ``{"version": N, "start_time": ...}``, or any other text; a line starting ``[1,0]<stdout>:`` is
    mpirun's tag, not JSON). FileError when it cannot be read."""
    name = path.name.lower()
    if name.endswith((".json.gz", ".gz")):
        return "kineto"
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError as exc:
        if name.endswith(".json"):
            return "kineto"  # the Kineto reader names the error
        raise FileError(path, f"cannot read it ({exc.strerror or exc})") from None
    from tracekit.ingest.nccl_tests_json import is_nccl_tests_json

    if is_nccl_tests_json(head):
        return "nccl_tests"  # nccl-tests' own JSON output (-J FILE)
    if name.endswith(".json"):
        return "kineto"
    if head.startswith(b"\x1f\x8b") or (head.lstrip()[:1] in (b"{", b"[") and not _TAGGED.match(head)):
        return "kineto"
    if head.startswith(b"SQLite format 3"):
        return "nsys"
    return "nccl_tests"


def _read_one(args):
    """Worker: read one trace file (Kineto JSON, Nsight Systems SQLite or report) into staging
    files (in a subprocess when several files are read in parallel).

    Returns [(RankFile, staging file), ...]: one pair per rank the file holds (an Nsight
    Systems report of a whole job holds several). OS-level read errors (permissions, I/O)
    become FileError naming the file."""
    try:
        return _read_one_unchecked(args)
    except RecursionError:
        raise FileError(args[0], "JSON nested too deeply to read") from None
    except OSError as exc:
        raise _read_or_write_error(exc, Path(args[0]), Path(args[1])) from None


_WRITE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS") if hasattr(errno, n))


def _read_or_write_error(exc: OSError, src: Path, out: Path) -> Exception:
    """The one-line error for an OSError while a trace file was read into staging: a write error
    (disk full, quota, read-only file system, or any error on a file of the staging folder)
    names the store's staging folder and says write; anything else names the trace and says read."""
    name = Path(exc.filename) if isinstance(exc.filename, (str, bytes, os.PathLike)) and exc.filename else None
    on_out = name is not None and (Path(os.fsdecode(name)).parent == out.parent)
    if exc.errno in _WRITE_ERRNOS or on_out:
        from tracekit.errors import StoreError

        return StoreError(f"{out.parent}: cannot write the staging files while reading {src} "
                          f"({exc.strerror or exc}); nothing was stored")
    return FileError(src, f"cannot read it ({exc.strerror or exc})")


def _read_one_unchecked(args):
    path, out, patterns, digest = args
    from tracekit.ingest.comm_families import compile_comm_patterns
    from tracekit.ingest.kineto import read_rank_file

    regex = compile_comm_patterns(patterns)
    if str(path).lower().endswith(".nsys-rep"):
        from tracekit.ingest.nsys import export_report, read_nsys_report

        exported = export_report(Path(path), Path(out).with_suffix(".export.sqlite"))
        try:
            pairs = read_nsys_report(exported, Path(out), regex, sha256=digest)
        finally:
            exported.unlink(missing_ok=True)
        for rf, _stage in pairs:
            rf.path = Path(path)
        return pairs
    if str(path).lower().endswith(".sqlite") or _source_kind(Path(path)) == "nsys":
        from tracekit.ingest.nsys import read_nsys_report

        return read_nsys_report(path, Path(out), regex, sha256=digest)
    return [(read_rank_file(path, Path(out), regex, sha256=digest), Path(out))]


def ingest_paths(
    paths: Sequence[str | os.PathLike],
    store=None,
    *,
    workload: str | None = None,
    config: dict | None = None,
    run_id: str | None = None,
    replace: bool = False,
    comm_patterns: Sequence[str] = (),
    source: str | None = None,
    jobs: int | None = None,
    align: str | None = None,
    progress: Callable[..., None] | None = None,
    op: str | None = None,
    engine: str = "local",
    address: str | None = None,
    strict: bool = True,
    on_skip: Callable[[str], None] | None = None,
) -> str:
    """Ingest trace files (one run; one file per rank) into ``store``; returns the run id.

    ``paths``: files and/or directories of rank files (Kineto ``.json``/``.json.gz``,
    Nsight Systems ``.sqlite``), or nccl-tests logs (all inputs of one kind).
    ``store``: a path or :class:`tracekit.store.Store` (default: ``$TRACEKIT_STORE`` or
    ``./tracekit-store``). ``comm_patterns``: extra regexes naming communication
    kernels, added to the built-in collective families (tracekit.ingest.comm_families);
    ``'REGEX=OP'`` also names the kernels' canonical op (sized from an enclosing family op where
    one applies), a bare ``'REGEX'`` leaves the op unknown.
    Re-ingesting the same files (same sha256 set) returns the existing run unless
    ``replace``. ``align``: clock alignment across hosts, ``none`` | ``host`` |
    ``collectives`` (default: collectives when the ranks' hosts differ, else none).
    ``progress``: see :mod:`tracekit.progress`. ``op``: the collective of nccl-tests runs whose
    log and file name do not name one (BadInputError with other inputs).
    ``engine``: where the per-file work runs (tracekit.ingest.engine): ``local`` (a process pool of
    ``jobs`` workers, used when ``jobs`` is given or the files exceed PARALLEL_MIN_BYTES) or
    ``ray`` (one Ray task per file and per rank; ``address`` None: a local Ray instance of
    ``jobs`` CPUs, ``auto`` or ``HOST:PORT``: a running cluster, whose workers must see the files
    and the store at the same paths).
    ``strict`` (nccl-tests logs): False ingests the logs that can be read and leaves the others out,
    calling ``on_skip`` with each one's one-line error and storing them in the run's warnings and
    ``config.skipped`` (tracekit.ingest.nccl_tests_run); True (default) refuses the whole input.
    Raises FileError / BadInputError (store unchanged) on bad input.
    """
    from tracekit.store import Store, check_run_id

    st = store if isinstance(store, Store) else Store(store)
    files = expand_paths(paths)
    from tracekit.ingest.flight_recorder import is_fr_dump

    fr_files = [f for f in files if is_fr_dump(f)]  # Flight Recorder dumps: the fr_* tables of the run
    if fr_files:
        files = [f for f in files if f not in fr_files]
        if not files:
            return _ingest_fr_only(st, paths, fr_files, run_id=run_id, replace=replace, config=config,
                                   workload=workload)
    kinds = {f: "nsys" if f.name.lower().endswith(NSYS_SUFFIXES) else _source_kind(f) for f in files}
    reports = [f for f in files if f.name.lower().endswith(".nsys-rep")]
    if reports:
        from tracekit.ingest.nsys import find_nsys_for_export

        find_nsys_for_export(reports[0])  # refuse before any work when nsys is not there to export it
    logs = [f for f, k in kinds.items() if k == "nccl_tests"]
    if logs and fr_files:
        raise FileError(fr_files[0], f"a Flight Recorder dump cannot share a run with an nccl-tests log such as {logs[0].name}")
    if logs and len(logs) != len(files):
        other = next(f for f, k in kinds.items() if k != "nccl_tests")
        raise FileError(logs[0], f"an nccl-tests log cannot share a run with traces such as {other.name}; ingest them apart")
    if op is not None and not logs:
        raise BadInputError("--op applies to nccl-tests logs only (traces name their collectives)")
    parsed = skipped = None
    if logs and not strict and len(logs) > 1:
        from tracekit.ingest.nccl_tests_run import read_logs

        files, parsed, skipped = read_logs(files, op=op, strict=False)  # FileError when none can be read
        for exc in skipped:
            if on_skip:
                on_skip(str(exc))
    if source is None and all(k == "nsys" for k in kinds.values()):
        source = "nsys"
    from tracekit.ingest.comm_families import parse_comm_pattern, user_families

    user_kernels = [parse_comm_pattern(p) for p in comm_patterns]  # REGEX or REGEX=OP
    from tracekit.ingest.comm_families import check_user_patterns

    check_user_patterns([k.pattern for k in user_kernels])  # BadInputError: invalid, RE2 cannot run it, matches all
    if run_id is not None:
        check_run_id(run_id)

    from tracekit.ingest.comm_families import BUILTIN_COMM_PATTERNS

    if config is None:
        config = _collector_config(paths)
    if workload is None and config:
        workload = config.get("workload")

    patterns = list(BUILTIN_COMM_PATTERNS) + [k.pattern for k in user_kernels]
    big = sum(f.stat().st_size for f in files) > PARALLEL_MIN_BYTES
    runner = make_engine(engine, jobs=jobs if engine == "ray" else (jobs or default_jobs(len(files))),
                         parallel=len(files) > 1 and (big or jobs is not None), address=address)
    with st.staging() as stg:
        raw_dir = stg.dir / "raw"
        raw_dir.mkdir()
        from tracekit.ingest.staging import sha256_file

        digests = []
        for f in files:
            try:
                digests.append(sha256_file(f))
            except OSError as exc:
                raise FileError(f, f"cannot read it ({exc.strerror or exc})") from None
        existing = st.find_by_sha256(digests)
        if existing is not None and not replace and (run_id is None or run_id == existing):
            return existing
        if logs:
            from tracekit.ingest.nccl_tests_run import build_nccl_tests_run

            raw_dir.rmdir()
            rid = run_id or _default_run_id(paths, None, digests)
            if st.has_run(rid) and not replace:
                raise BadInputError(f"run {rid!r} already exists in {st.path} (use --replace or another --run-id)")
            build_nccl_tests_run(stg.dir, rid, files, digests, config=config or {}, op=op, logs=parsed,
                                 skipped=skipped or ())
            stg.commit(rid, replace=replace)
            return rid
        where = os.path.abspath if engine == "ray" else str  # a Ray worker's cwd is not ours
        tasks = [(where(f), where(raw_dir / f"file{i}.arrows"), patterns, d) for i, (f, d) in enumerate(zip(files, digests))]
        if progress:
            progress(f"reading {len(files)} file(s)", total=len(files))
        with runner as ex:
            per_file = ex.map(_read_one, tasks, [str(f) for f in files], progress)
            rid, fresh = _finish_ranks(st, stg.dir, ex, paths, per_file, files, digests, run_id, replace, user_kernels,
                                       workload=workload, config=config or {}, source=source or "kineto",
                                       align=align, progress=progress)
        if fresh:
            if fr_files:
                _stage_fr(stg.dir, rid, fr_files)
            stg.commit(rid, replace=replace)
    return rid


def _stage_fr(stage: Path, rid: str, fr_files: list[Path]) -> None:
    """Write the fr_* tables of ``fr_files`` into a staged run (tracekit.ingest.flight_recorder)."""
    from tracekit.ingest.flight_recorder import read_dumps, write_tables
    from tracekit.ingest.staging import sha256_file

    write_tables(stage, *read_dumps(fr_files, [sha256_file(f) for f in fr_files], rid)[:3])


def _ingest_fr_only(st, paths, fr_files, *, run_id, replace, config, workload) -> str:
    """A run of Flight Recorder dumps alone (no trace beside them); returns its id. Re-ingesting
    the same dumps returns the existing run unless ``replace``."""
    from tracekit.ingest.flight_recorder import build_fr_run
    from tracekit.ingest.staging import sha256_file

    digests = []
    for f in fr_files:
        try:
            digests.append(sha256_file(f))
        except OSError as exc:
            raise FileError(f, f"cannot read it ({exc.strerror or exc})") from None
    existing = st.find_by_sha256(digests)
    if existing is not None and not replace and (run_id is None or run_id == existing):
        return existing
    if config is None:
        config = _collector_config(paths)
    rid = run_id or _default_run_id(paths, None, digests)
    from tracekit.store import check_run_id

    check_run_id(rid)
    if st.has_run(rid) and not replace:
        raise BadInputError(f"run {rid!r} already exists in {st.path} (use --replace or another --run-id)")
    with st.staging() as stg:
        build_fr_run(stg.dir, rid, fr_files, digests, config=config or {}, workload=workload)
        stg.commit(rid, replace=replace)
    return rid


def _finish_ranks(st, stage, ex, paths, per_file, files, digests, run_id, replace, user_kernels, *, progress, **kw):
    """After the read phase: number the ranks, then the per-rank assemble phase on engine ``ex``
    and the run's tables in ``stage`` (tracekit.ingest.assemble.finish_run). Returns (run id,
    whether ``stage`` holds a new run to commit); (the existing run, False) when the files of a
    multi-rank file are already in the store."""
    # one file may hold several ranks (a whole-job Nsight Systems report)
    results = [rf for pairs in per_file for rf, _stage in pairs]
    raw_files = [str(stage) for pairs in per_file for _rf, stage in pairs]
    if len(results) != len(files):
        # a file of several ranks is stored once per rank: look again for these files' run
        existing = st.find_by_sha256([rf.sha256 for rf in results])
        if existing is not None and not replace and (run_id is None or run_id == existing):
            return existing, False
    ranks = _assign_ranks(results)
    rid = run_id or _default_run_id(paths, results, digests)
    if st.has_run(rid) and not replace:
        raise BadInputError(f"run {rid!r} already exists in {st.path} (use --replace or another --run-id)")
    from tracekit.ingest.assemble import finish_run
    from tracekit.ingest.comm_families import user_families

    if progress:
        progress("linking events and deriving collectives", total=len(results))
    with user_families(user_kernels):  # their ops, for the collectives
        finish_run(stage, rid, results, ranks, raw_files, engine=ex, user_kernels=user_kernels, progress=progress, **kw)
    return rid, True


def _collector_config(paths) -> dict | None:
    """The ``run_config.json`` a tracekit collector left beside the rank files, if any, checked
    against its schema (:func:`tracekit.ingest.run_config.read_run_config`: FileError naming the key)."""
    from tracekit.ingest.run_config import read_run_config

    for p in paths:
        p = Path(p)
        f = (p if p.is_dir() else p.parent) / "run_config.json"
        if f.is_file():
            return read_run_config(f)
    return None


MAX_RANKS = 1 << 20


def _assign_ranks(results) -> list[int]:
    """Rank of each file: distributedInfo.rank, else the file name, else 0 for a lone file.

    A rank whose reader could only number it by order (``distributedInfo.rank_source`` =
    ``order``: Nsight Systems processes with no recorded rank) is renumbered here so that
    several such files make one run: those ranks take the lowest numbers no other file claims,
    in file order then process order, with a warning when the number changes or the file
    gave none.

    Raises FileError for a rank that is negative or not below its file's world size, files
    that disagree on the world size, two files claiming one rank, or a file whose rank
    cannot be told.
    """
    ranks: list[int | None] = []
    worlds: dict[int, Path] = {}
    for r in results:
        di = r.meta.get("distributedInfo") if isinstance(r.meta, dict) else None
        rk = di.get("rank") if isinstance(di, dict) else None
        ws = di.get("world_size") if isinstance(di, dict) else None
        if type(rk) is not int and not (isinstance(di, dict) and di.get("rank_source") == "order"):
            rk = rank_from_filename(r.path)
        if rk is not None and not 0 <= rk < MAX_RANKS:
            raise FileError(r.path, f"claims rank {rk}: a rank must be in 0..{MAX_RANKS - 1}")
        if type(ws) is int:
            if not 1 <= ws <= MAX_RANKS:
                raise FileError(r.path, f"claims world_size {ws}: must be in 1..{MAX_RANKS}")
            if rk is not None and rk >= ws:
                raise FileError(r.path, f"claims rank {rk} of a world of {ws} ranks")
            worlds.setdefault(ws, r.path)
        ranks.append(rk)
    if len(worlds) > 1:
        (w1, f1), (w2, f2) = sorted(worlds.items())[:2]
        raise FileError(f2, f"claims world_size {w2}, while {f1} claims {w1}: not one run?")
    by_order = [i for i, r in enumerate(results) if isinstance(r.meta, dict) and isinstance(r.meta.get("distributedInfo"), dict)
                and r.meta["distributedInfo"].get("rank_source") == "order"]
    if by_order and len(results) > 1:
        taken = {rk for i, rk in enumerate(ranks) if i not in by_order and rk is not None}
        free = (x for x in range(MAX_RANKS) if x not in taken)
        file_pos: dict = {}
        for r in results:
            file_pos.setdefault(str(r.path), len(file_pos))
        # file order, then the order the reader gave the processes of one file (device, then pid)
        by_order.sort(key=lambda i: (file_pos[str(results[i].path)], -1 if ranks[i] is None else ranks[i], i))
        for i in by_order:
            new = next(free)
            if ranks[i] != new:
                results[i].warnings.append(
                    f"numbered rank {new} in file order (the file gives no rank for this process)"
                )
            ranks[i] = new
    if len(results) == 1 and ranks[0] is None:
        results[0].warnings.append("no rank in the trace or its file name; taken as rank 0")
        ranks[0] = 0
    for r, rk in zip(results, ranks):
        if rk is None:
            raise FileError(r.path, "cannot tell which rank this file is (no distributedInfo.rank, no rank/worker number in its name)")
    seen: dict[int, Path] = {}
    for r, rk in zip(results, ranks):
        if rk in seen:
            raise FileError(r.path, f"claims rank {rk}, as does {seen[rk]}")
        seen[rk] = r.path
    return [int(x) for x in ranks]


def _default_run_id(paths, results, digests) -> str:
    """``<directory or file stem>-<sha256 prefix of the first file>``."""
    first = Path(paths[0])
    stem = first.name if (len(paths) == 1 and first.is_dir()) else (Path(results[0].path).name if results else first.name)
    for suf in (".json.gz", ".json", ".gz"):
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.")[:40] or "run"
    return f"{stem}-{digests[0][:8]}"


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def hostname() -> str:
    return socket.gethostname()


__all__ = ["ingest_paths", "expand_paths", "rank_from_filename"]
