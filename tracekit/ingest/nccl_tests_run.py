"""nccl-tests / rccl-tests logs → one run of source ``nccl_tests`` in the store.

Each result row of a log (one message size; out-of-place and in-place) becomes
a ``collectives`` row of rank 0 — the rank that prints the log — with the
log's own time (``dur_ns``, the average over its iterations, warm-up already
excluded by nccl-tests) and its algbw/busbw (``log_algbw_gbps``,
``log_busbw_gbps``). Rows sit one after another on a synthetic timeline
(``ts_ns``), so nothing downstream mistakes them for overlapping work; the run
has no ``events``. These runs feed the α–β fit (``collective_samples``).

Benchmark runs are kept apart. Every benchmark run in the logs (one header and
its rows, :class:`tracekit.ingest.nccl_tests.NcclTestsGroup`; several files or
several runs in one file) is its own process group: ``pg_name`` is
``nccl_tests:<op>`` when no other run of the ingest has that op, else
``nccl_tests:<op>:run<i>`` (``i`` the run's index over all files in the order
given, then file order), with ``seq`` counting from 0 in each, so rows of two
runs are never matched as ranks of one job. ``group_size`` is the run's own
rank count. ``runs.config`` (JSON) keeps, besides the caller's config:

- ``logs``: per file: path, op, group_size, dtype, rows, params (its first run's);
- ``groups``: per benchmark run, in pg order: ``index``, ``pg_name``, ``path``,
  ``first_line``/``last_line``, ``op``, ``op_source`` (header / command /
  filename / argument), ``test_name``, ``command`` (the command line in the
  log, or null), ``group_size``, ``group_size_source``, ``hosts`` (distinct,
  from the rank lines), ``n_hosts``, ``devices`` (distinct device names),
  ``library`` (nccl / rccl / null), ``library_version``, ``tests_version``,
  ``dtype``, ``params``, ``rows``, ``quarantined`` (rows left out: bad
  numbers), ``wrong_rows`` (store rows with ``wrong`` > 0), ``oob_values``
  and ``oob_failed`` (the ``Out of bounds values`` footer), ``avg_busbw``, ``machine`` (the machine
  it ran on: hosts, nodes, ranks_per_host, max_ranks_per_host, gpu, nics_per_node, nic, locality,
  locality_reason, source — :func:`tracekit.ingest.nccl_tests.machine_facts`; the analysis
  ``group_machine`` reads it).

``collectives.wrong`` is the number of wrong values nccl-tests reported for
the row's half (``#wrong`` out-of-place or in-place; null for ``N/A``). In a
run whose footer says ``Out of bounds values : N FAILED``, a row showing no
wrong values of its own carries N (max 1): its timing comes from a run that
failed validation. ``collective_samples`` leaves rows with ``wrong`` > 0 out
of the fit; a warning on the run's rank row names the benchmark run and the
sizes. Quarantined rows are counted in ``ranks.events_quarantined`` and named
in its ``warnings``. ``runs.backend`` is ``rccl`` when every run that names
its library is an RCCL one, else ``nccl``.

Per-iteration times. A run printed with ``-I`` also keeps ``per_iter`` in its ``groups`` entry: per
size and half, n, skipped, min/p50/p99/max µs and cv_pct (a text log prints no n, skipped or p50:
null; tracekit.ingest.nccl_tests_json for the JSON's).

Twins. A job run with ``-J FILE`` leaves its text log and the JSON; when both are ingested, a text
benchmark run whose op, group size, sizes and times (as printed) match a JSON file's is read once, from
the JSON (:func:`_drop_text_twins`), with a warning.

Partial ingests. Of several logs, those that cannot be read (:func:`read_logs`: not a log, a job that
failed before its first row, a line over the length limit, an OS error) are left out unless ``strict``:
the run holds the others, ``runs.config`` lists them under ``skipped`` (``path``, ``reason``: the one-line
error) and the rank row's ``warnings`` name each (``skipped <path>: <reason>``).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.store import SCHEMA_VERSION
from tracekit.errors import FileError, StoreError
from tracekit.ingest.attribute import dtype_bytes, wire_bytes_for
from tracekit.ingest.nccl_tests import NcclTestsGroup, machine_facts, nic_facts, parse_nccl_tests
from tracekit.store import combined_digest
from tracekit.store import COLLECTIVES_SCHEMA, EVENTS_SCHEMA, PARQUET_OPTS, RANKS_SCHEMA, RUNS_SCHEMA

_GAP_NS = 1_000  # between two synthetic rows
_SIZES_SHOWN = 8  # sizes a warning lists before "and N more"


def _sizes(items: list[tuple[int, str]]) -> str:
    shown = ", ".join(f"{s} B ({half})" for s, half in items[:_SIZES_SHOWN])
    return shown + (f" and {len(items) - _SIZES_SHOWN} more" if len(items) > _SIZES_SHOWN else "")


def _failed_warning(name: str, g: NcclTestsGroup, pg: str, wrong: list[tuple[int, str]]) -> str | None:
    """The warning for a benchmark run with wrong values (None when it has none)."""
    what = f"{name} benchmark run {g.index} (lines {g.first_line}-{g.last_line}, {g.group_size} ranks, pg {pg})"
    if g.oob_failed:
        sizes = sorted({r.size_bytes for r in g.rows})
        return (f"{what}: footer says 'Out of bounds values : {g.oob_values} FAILED': all its {len(g.rows)} "
                f"result rows (sizes {sizes[0]}-{sizes[-1]} B) kept with a wrong count and left out of the "
                f"α–β fit")
    if wrong:
        return (f"{what}: #wrong > 0 at {_sizes(wrong)}: kept with their wrong count and left out of the "
                f"α–β fit")
    return None


def read_log(path, op: str | None = None):
    """One nccl-tests / rccl-tests result file, text log or ``-J`` JSON, as an NcclTestsLog
    (:func:`tracekit.ingest.nccl_tests.parse_nccl_tests`, :func:`tracekit.ingest.nccl_tests_json.parse_nccl_tests_json`).
    Raises FileError naming the file (unreadable, not a result file, ...), BadInputError for an unknown ``op``."""
    from tracekit.ingest.nccl_tests_json import is_nccl_tests_json, parse_nccl_tests_json

    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise FileError(p, f"cannot read: {exc.strerror or exc}") from None
    if is_nccl_tests_json(raw[:256]):
        return parse_nccl_tests_json(p, raw, op=op)  # the -J twin of the text log
    return parse_nccl_tests(p, op=op, raw=raw)


def read_logs(files: list[Path], *, op: str | None = None, strict: bool = True) -> tuple[list[Path], list, list[FileError]]:
    """Parse every log of ``files``: (the files read, their NcclTestsLog, the FileError of each file left out).

    ``strict``: the first file that cannot be read raises its FileError (all or nothing). Otherwise such
    files are left out and returned; when none can be read, the first one's FileError is raised (its
    message says how many others failed too). BadInputError (an unknown ``op``) is always raised.
    """
    from tracekit.errors import FileError

    good, logs, failed = [], [], []
    for f in files:
        try:
            logs.append(read_log(f, op=op))
        except FileError as exc:
            if strict:
                raise
            failed.append(exc)
            continue
        good.append(f)
    if not good:
        first = failed[0]
        more = f" (and {len(failed) - 1} other log(s) could not be read either)" if len(failed) > 1 else ""
        raise FileError(first.path, first.problem + more)
    return good, logs, failed


def build_nccl_tests_run(stage: Path, run_id: str, files: list[Path], digests: list[str], *, config: dict,
                         op: str | None = None, logs: list | None = None,
                         skipped: list[FileError] = ()) -> None:
    """Parse ``files`` (nccl-tests / rccl-tests logs) and write the run's tables into ``stage``.

    ``op``: the collective of runs whose log and file name do not name one (the CLI's ``--op``).
    ``logs``: the files already parsed (:func:`read_logs`), in order; ``skipped``: the errors of logs
    left out, stored in the run's warnings and ``config.skipped``.
    Raises FileError (from the parser) for a file that is not an nccl-tests log, BadInputError
    for an unknown ``op``, StoreError when the staging files cannot be written (no space, I/O).
    """
    if logs is None:
        logs = [read_log(f, op=op) for f in files]
    if skipped:
        config = dict(config, skipped=[dict(path=e.path, reason=e.problem) for e in skipped])
    logs, twins = _drop_text_twins(files, logs)
    try:
        _write(stage, run_id, files, digests, config, logs, [f"skipped {e.path}: {e.problem}" for e in skipped] + twins)
    except OSError as exc:  # ENOSPC, EIO... while writing the staging files
        raise StoreError(f"{stage.parent.parent}: cannot write to the store ({exc.strerror or exc})") from None


def _same_time(text_us: float | None, json_us: float | None) -> bool:
    """A time as the text log printed it (7 characters: 2, 1 or 0 decimals, then ``%.1e``) agrees with
    the JSON's ``%lf`` value: within half a unit of the text's last digit, or 5 % for the exponent form."""
    if text_us is None or json_us is None:
        return text_us is None and json_us is None
    tol = 0.005 if text_us < 9999.995 else 0.05 if text_us < 99999.95 else 0.5 if text_us < 999999.5 else 0.05 * text_us
    return abs(text_us - json_us) <= tol + 1e-9


def _drop_text_twins(files: list[Path], logs: list) -> tuple[list, list[str]]:
    """``logs`` (one per file) without the text benchmark runs that an nccl-tests JSON file of the same
    ingest holds too (a job run with ``-J`` leaves both its stdout log and the JSON): same op, group size,
    sizes and times (as printed). The JSON is kept (full precision, the ``-I`` report); one warning per
    twin."""
    import dataclasses

    jsons = [(f, g) for f, log in zip(files, logs) for g in log.groups if g.layout == "json"]
    if not jsons:
        return logs, []
    out, warnings = [], []
    for f, log in zip(files, logs):
        keep = []
        for g in log.groups:
            twin = _json_twin(g, jsons)
            if twin is None:
                keep.append(g)
            else:
                warnings.append(f"{Path(f).name} benchmark run {g.index} (lines {g.first_line}-{g.last_line}) is the "
                                f"text twin of {Path(twin).name} (nccl-tests -J): read once, from the JSON")
        out.append(log if len(keep) == len(log.groups) else dataclasses.replace(log, groups=tuple(keep)))
    return out, warnings


def _json_twin(g: NcclTestsGroup, jsons: list) -> Path | None:
    """The JSON file of ``jsons`` ((file, group) pairs) whose run ``g`` (a text log's) repeats, or None."""
    twin = None
    if g.layout != "json":
        key = [(r.size_bytes, r.dtype) for r in g.rows]
        for jf, jg in jsons:
            if (jg.op, jg.group_size) == (g.op, g.group_size) and [(r.size_bytes, r.dtype) for r in jg.rows] == key \
                    and all(_same_time(a.ip_time_us, b.ip_time_us) and _same_time(a.oop_time_us, b.oop_time_us)
                            for a, b in zip(g.rows, jg.rows)):
                twin = jf
                break
    return twin


def _write(stage: Path, run_id: str, files: list[Path], digests: list[str], config: dict, logs: list,
           extra_warnings: list[str] = ()) -> None:
    runs = [(f, log, g) for f, log in zip(files, logs) for g in log.groups]
    op_count = Counter(g.op for _, _, g in runs)
    nics = {str(f): nic_facts(f) for f in files}  # the NCCL INFO network lines of each log
    rows, groups_cfg, warnings = [], [], []
    for log in logs:
        warnings.extend(log.warnings)
    warnings.extend(extra_warnings)  # logs left out, text twins of JSON files
    t = 1_000_000_000  # 1 s: keeps every ts positive
    eid = 0
    for i, (f, log, g) in enumerate(runs):
        pg = f"nccl_tests:{g.op}" if op_count[g.op] == 1 else f"nccl_tests:{g.op}:run{i}"
        k = g.group_size
        seq = 0
        wrong_sizes: list[tuple[int, str]] = []
        fail_n = max(1, g.oob_values or 0) if g.oob_failed else None
        for r in g.rows:
            for in_place, time_us, algbw, busbw, own in (
                (False, r.oop_time_us, r.oop_algbw, r.oop_busbw, r.oop_wrong),
                (True, r.ip_time_us, r.ip_algbw, r.ip_busbw, r.ip_wrong),
            ):
                if time_us is None:
                    continue
                wrong = own if own or fail_n is None else fail_n
                if wrong:
                    wrong_sizes.append((r.size_bytes, "in-place" if in_place else "out-of-place"))
                dur = round(time_us * 1000)
                rows.append(dict(
                    run_id=run_id, rank=0, event_id=eid, pg_name=pg, pg_ranks=list(range(k)), group_size=k,
                    seq=seq, op=g.op, dtype=r.dtype, size_bytes=r.size_bytes,
                    wire_bytes=wire_bytes_for(g.op, r.size_bytes, k, None, 0, dtype_bytes(r.dtype)),
                    in_splits=None, out_splits=None, peer=None, algo=None, proto=None, ts_ns=t, dur_ns=dur,
                    meta_source="nccl_tests", approx=False, issue_ts_ns=t,
                    log_algbw_gbps=algbw, log_busbw_gbps=busbw, in_place=in_place, wrong=wrong,
                ))
                eid += 1
                seq += 1
                t += dur + _GAP_NS
        w = _failed_warning(Path(f).name, g, pg, wrong_sizes)
        if w:
            warnings.append(w)
        if k == 1:
            warnings.append(f"{Path(f).name} benchmark run {g.index} (pg {pg}): 1 rank: nothing crosses a link "
                            "(busbw is 0 by definition): its times are kept, with no peak busbw and no α–β model")
        groups_cfg.append(dict(
            index=i, pg_name=pg, path=str(f), first_line=g.first_line, last_line=g.last_line, op=g.op,
            op_source=g.op_source, test_name=g.test_name, command=g.command, group_size=k,
            group_size_source=g.group_size_source, hosts=list(g.hosts), n_hosts=len(g.hosts),
            devices=list(g.device_names), library=g.library, library_version=g.library_version,
            tests_version=g.tests_version, dtype=g.dtype, params=g.params, rows=len(g.rows),
            quarantined=len(g.quarantined), wrong_rows=len(wrong_sizes), oob_values=g.oob_values,
            oob_failed=g.oob_failed, avg_busbw=g.avg_busbw, machine=machine_facts(g, nics[str(f)]),
        ))
    (stage / "events").mkdir()
    pq.write_table(EVENTS_SCHEMA.empty_table(), stage / "events" / "rank=0.parquet", **PARQUET_OPTS)
    for cfg_g, (_, _, g) in zip(groups_cfg, runs):
        if g.per_iter:  # the -I report's per-size summaries
            cfg_g["per_iter"] = list(g.per_iter)
    pq.write_table(pa.Table.from_pylist(rows, schema=COLLECTIVES_SCHEMA), stage / "collectives.parquet", **PARQUET_OPTS)
    # One ranks row (rank 0 printed the logs); several logs share it through a combined digest.
    ranks = [dict(run_id=run_id, rank=0, host=None,
                  source_path=";".join(str(Path(f).resolve()) for f in files),
                  source_sha256=combined_digest(digests), clock_offset_ns=0, clock_offset_err_ns=0, events=0,
                  events_quarantined=sum(len(log.quarantined) for log in logs), warnings=warnings)]
    pq.write_table(pa.Table.from_pylist(ranks, schema=RANKS_SCHEMA), stage / "ranks.parquet", **PARQUET_OPTS)
    dev = next((d for _, _, g in runs for d in g.device_names), None)
    libs = {g.library for _, _, g in runs if g.library}
    cfg = dict(config, logs=[dict(path=str(f), op=log.op, group_size=log.group_size, dtype=log.dtype,
                                  rows=len(log.rows), params=log.params) for f, log in zip(files, logs)],
               groups=groups_cfg)
    run = dict(
        run_id=run_id, created_at=datetime.now(timezone.utc), source="nccl_tests", workload="sweep",
        backend="rccl" if libs == {"rccl"} else "nccl", world_size=max(g.group_size for _, _, g in runs),
        torch_version=None, nccl_version=next((g.library_version for _, _, g in runs if g.library_version), None),
        device_name=dev, config=json.dumps(cfg, sort_keys=True, default=str), schema_version=SCHEMA_VERSION,
    )
    pq.write_table(pa.Table.from_pylist([run], schema=RUNS_SCHEMA), stage / "run.parquet", **PARQUET_OPTS)
    from tracekit.store import write_empty_summaries

    write_empty_summaries(stage)  # no events: nothing to summarise, but the analyses read the files
