"""Reader for nccl-tests' own JSON output (``all_reduce_perf -J results.json``), as its text log's twin.

The format is the one nccl-tests' writer defines (``src/util.cu`` of NVIDIA/nccl-tests: jsonOutputInit,
writeDeviceReport, writeBenchmarkLine*, writePerIterReport, writeResultFooter); files of format
``version`` 1 to 3 are accepted (1: the first writer; 3: adds ``unalign``, the bitwise check and the
per-iteration report of ``-I``). One file is one benchmark run (one process invocation):

- ``version`` (int), ``args`` (the command line, ``args[0]`` the test binary: the collective),
  ``nccl_version`` (NCCL_VERSION_CODE of the library: ``22703`` → 2.27.3);
- ``config``: ``nthreads``, ``ngpus``, ``minimum_bytes``, ``maximum_bytes``, ``warmup_iters``,
  ``iterations``, ``aggregated_iterations``, ``validation``, ``graph`` and ``devices``: one object per
  rank (``rank``, ``hostname``, ``device``, ``device_info``: the device name);
- ``results``: one object per size: ``size`` (B), ``count``, ``type``, ``redop``, ``root`` (a string
  padded to 6 characters), ``out_of_place`` (null when only in-place ran) and ``in_place``, each
  ``{time | cpu_time (µs), alg_bw, bus_bw (GB/s, GB = 1e9), nwrong (number or null for N/A)}``; with
  ``-I`` also ``out_of_place_per_iter`` / ``in_place_per_iter``: ``min_us``, ``max_us``, ``avg_us``,
  ``p50_us``, ``p95_us``, ``p99_us``, ``stdev_us``, ``cv_pct``, ``skipped_iterations`` and ``times_us``
  (each timed iteration, µs);
- ``out_of_bounds`` ``{count, okay}``, ``average_bus_bandwidth`` ``{bandwidth, okay}``.

The writer prints booleans as the strings ``"true"`` / ``"false"``, NaN as the string ``"nan"`` and an
infinite value as a bare ``inf`` (not JSON: such a file is refused). A result whose values are not finite
numbers in range (the text reader's bounds) is quarantined with its index in ``results``; the rows'
``line`` is that 1-based index. Per-iteration summaries are kept on the group (``per_iter``), one per
size and half: size_bytes, half, n (timed iterations), skipped, min/p50/p99/max µs and cv_pct.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tracekit.errors import BadInputError, FileError
from tracekit.model.ops import canonical_op

MAX_JSON_BYTES = 256 << 20
"""Largest nccl-tests JSON file read (256 MiB; a sweep with every iteration's time is a few MB)."""
MAX_NAME_CHARS = 1024
"""Longest host or device name accepted (nccl-tests' writer reads them with ``%1024s``)."""
FORMAT_VERSIONS = (1, 2, 3)
"""``version`` values of nccl-tests' writer that this reader knows."""
SIGNATURE = re.compile(rb'^\s*\{\s*"version"\s*:\s*\d+\s*,\s*"start_time"\s*:')
"""How a file opens when nccl-tests wrote it (its first two keys, in the writer's order)."""


def is_nccl_tests_json(head: bytes) -> bool:
    """The first bytes of a file are those of an nccl-tests JSON file."""
    return SIGNATURE.match(head) is not None


def _num(v, what: str, hi: float) -> float:
    from tracekit.ingest.nccl_tests import _Bad

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{what} {v!r} is not a number")
    if not math.isfinite(v) or v < 0 or v > hi:
        raise _Bad(f"{what} {v!r} is out of range (0..{hi:g})")
    return float(v)


def _half(obj, what: str):
    from tracekit.ingest.nccl_tests import MAX_BW_GBPS, MAX_SIZE_BYTES, MAX_TIME_US, _Bad

    if obj is None:
        return None, None, None, None
    if not isinstance(obj, dict):
        raise _Bad(f"{what} is not an object")
    t = obj.get("time", obj.get("cpu_time"))
    wrong = obj.get("nwrong")
    if wrong is not None:
        wrong = _num(wrong, f"{what}.nwrong", MAX_SIZE_BYTES)
        if wrong != int(wrong):
            raise _Bad(f"{what}.nwrong {wrong!r} is not a whole number")
        wrong = int(wrong)
    return (_num(t, f"{what}.time", MAX_TIME_US), _num(obj.get("alg_bw"), f"{what}.alg_bw", MAX_BW_GBPS),
            _num(obj.get("bus_bw"), f"{what}.bus_bw", MAX_BW_GBPS), wrong)


def _per_iter(obj, size: int, half: str) -> dict | None:
    """The summary of one ``*_per_iter`` object (None when absent or not numbers)."""
    if not isinstance(obj, dict):
        return None
    out = dict(size_bytes=size, half=half)
    times = obj.get("times_us")
    out["n"] = len(times) if isinstance(times, list) else None
    skipped = obj.get("skipped_iterations")
    out["skipped"] = skipped if isinstance(skipped, int) and not isinstance(skipped, bool) else None
    for key in ("min_us", "p50_us", "p99_us", "max_us", "cv_pct"):
        v = obj.get(key)
        out[key] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
    return out


def parse_nccl_tests_json(p: Path, raw: bytes, op: str | None = None):
    """Parse an nccl-tests JSON file (its bytes ``raw``) into a :class:`tracekit.ingest.nccl_tests.NcclTestsLog`
    of one benchmark run.

    Raises FileError(p, ...) for a file that is not valid JSON or not of a known format ``version``, lacks
    ``results`` or holds no usable result, names no collective (``args[0]`` and the file name say none and
    no ``op`` is given) or a group size out of range; BadInputError for an unknown ``op``.
    """
    from tracekit.ingest.nccl_tests import (MAX_RANKS, MAX_SIZE_BYTES, NcclTestsGroup, NcclTestsLog, NcclTestsRow,
                                            _Bad, _library_from_code, _op_from_filename, _ranks_from_ratio_rows)

    forced = canonical_op(op) if op is not None else None
    if len(raw) > MAX_JSON_BYTES:
        raise FileError(p, f"nccl-tests JSON of {len(raw):,} bytes: over the {MAX_JSON_BYTES:,}-byte limit")
    try:
        doc = json.loads(raw.decode("utf-8", errors="replace"))
    except RecursionError:
        raise FileError(p, "nccl-tests JSON nested too deeply to read") from None
    except ValueError as exc:
        raise FileError(p, f"not valid JSON ({exc}; nccl-tests writes an infinite value as a bare 'inf', and a "
                           "job killed mid-run leaves the file unterminated)") from None
    if not isinstance(doc, dict):
        raise FileError(p, "nccl-tests JSON: the document is not an object")
    version = doc.get("version")
    if version not in FORMAT_VERSIONS:
        raise FileError(p, f"nccl-tests JSON format version {version!r}: this reader knows {list(FORMAT_VERSIONS)}")
    results = doc.get("results")
    if not isinstance(results, list):
        raise FileError(p, "nccl-tests JSON has no 'results' list (the job failed before its first row?)")
    args = doc.get("args") if isinstance(doc.get("args"), list) else []
    args = [a for a in args if isinstance(a, str)]
    binary = Path(args[0]).name if args else None
    warnings: list[str] = []
    found = None
    if binary:
        stem = re.sub(r"_mpi$", "", binary)
        try:
            found = (canonical_op(stem), "command")
        except BadInputError:
            guess = _op_from_filename(Path(stem))
            found = (guess, "command") if guess else None
    if found is None and _op_from_filename(p) is not None:
        found = (_op_from_filename(p), "filename")
    if found is None and forced is not None:
        found = (forced, "argument")
    if found is None:
        raise FileError(p, "cannot tell which collective this nccl-tests JSON ran (args[0] names no *_perf binary, "
                           "no op in the file name): pass --op (e.g. --op all_reduce)")
    op_name, op_source = found
    if forced is not None and forced != op_name:
        warnings.append(f"{p.name}: --op {forced} ignored: its {'args' if op_source == 'command' else 'file name'} "
                        f"says {op_name}")
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = [d for d in cfg.get("devices") or [] if isinstance(d, dict)] if isinstance(cfg.get("devices"), list) else []
    ranks = {}
    for d in devices:
        r, host, dev = d.get("rank"), d.get("hostname"), d.get("device")
        for key in ("hostname", "device_info"):
            if len(str(d.get(key) or "")) > MAX_NAME_CHARS:
                raise FileError(p, f"nccl-tests JSON: config.devices[{devices.index(d)}].{key} of "
                                   f"{len(str(d.get(key))):,} characters (its writer prints at most {MAX_NAME_CHARS})")
        if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANKS:
            ranks[r] = (r, str(host) if host is not None else "", dev if isinstance(dev, int) else -1,
                        str(d.get("device_info") or ""))
    params = {}
    for key, name in (("nthreads", "n_threads"), ("ngpus", "n_gpus"), ("minimum_bytes", "min_bytes"),
                      ("maximum_bytes", "max_bytes"), ("warmup_iters", "warmup_iters"), ("iterations", "iters"),
                      ("validation", "validation")):
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE_BYTES:
            params[name] = v
    rows, quarantined, per_iter = [], [], []
    for i, res in enumerate(results, start=1):
        try:
            if not isinstance(res, dict):
                raise _Bad("not an object")
            size = _num(res.get("size"), "size", MAX_SIZE_BYTES)
            count = _num(res.get("count"), "count", MAX_SIZE_BYTES)
            if size != int(size) or count != int(count):
                raise _Bad("size or count is not a whole number")
            dtype = res.get("type")
            if not isinstance(dtype, str) or not dtype or len(dtype) > 64:
                raise _Bad(f"type {dtype!r} is not a type name")
            oop = _half(res.get("out_of_place"), "out_of_place")
            ip = _half(res.get("in_place"), "in_place")
            if ip[0] is None:
                raise _Bad("no in_place result")
            root_text = str(res.get("root", "")).strip()
            root = int(root_text) if re.fullmatch(r"-?\d{1,7}", root_text) else None
            redop = res.get("redop") if isinstance(res.get("redop"), str) and res.get("redop").strip() else None
        except _Bad as exc:
            quarantined.append((i, f"results[{i - 1}]: {exc}"))
            continue
        rows.append(dict(line=i, size_bytes=int(size), count=int(count), dtype=dtype, redop=redop and redop.strip(),
                         root=root, oop_time_us=oop[0], oop_algbw=oop[1], oop_busbw=oop[2], oop_wrong=oop[3],
                         ip_time_us=ip[0], ip_algbw=ip[1], ip_busbw=ip[2], ip_wrong=ip[3]))
        for key, half in (("out_of_place_per_iter", "out-of-place"), ("in_place_per_iter", "in-place")):
            s = _per_iter(res.get(key), int(size), half)
            if s is not None:
                per_iter.append(s)
    if not rows:
        if quarantined:
            line, why = quarantined[0]
            raise FileError(p, f"no usable results: all {len(quarantined)} quarantined ({why})")
        errors = [e for e in doc.get("errors") or [] if isinstance(e, str) and e] if isinstance(doc.get("errors"), list) else []
        last = f": {errors[-1][:300]}" if errors else ""
        raise FileError(p, f"nccl-tests JSON has no results (the job failed before its first row?){last}")
    if ranks:
        k, k_src = len(ranks), "rank_lines"
    elif "n_threads" in params and "n_gpus" in params:
        k, k_src = params["n_threads"] * params["n_gpus"], "nthreads_ngpus"
    else:
        raise FileError(p, "nccl-tests JSON names no ranks: no config.devices and no config.nthreads/ngpus")
    if not 1 <= k <= MAX_RANKS:
        raise FileError(p, f"nccl-tests JSON run of {k} ranks: out of range (1..{MAX_RANKS})")
    if k_src != "rank_lines":
        k, k_src = _ranks_from_ratio_rows(p, 0, rows, op_name, k, k_src, warnings)
    if quarantined:
        shown = "; ".join(why for _, why in quarantined[:3])
        warnings.append(f"{p.name}: {len(quarantined)} result(s) quarantined ({shown})")
    oob = doc.get("out_of_bounds") if isinstance(doc.get("out_of_bounds"), dict) else {}
    oob_n = oob.get("count") if isinstance(oob.get("count"), int) and not isinstance(oob.get("count"), bool) else None
    avg = doc.get("average_bus_bandwidth") if isinstance(doc.get("average_bus_bandwidth"), dict) else {}
    avg_bw = avg.get("bandwidth")
    avg_bw = float(avg_bw) if isinstance(avg_bw, (int, float)) and not isinstance(avg_bw, bool) and math.isfinite(avg_bw) else None
    code = doc.get("nccl_version")
    lib_version = _library_from_code(str(code)) if isinstance(code, int) and not isinstance(code, bool) and code > 0 else None
    sorted_ranks = tuple(sorted(ranks.values()))
    device_names = tuple(dict.fromkeys(r[3] for r in sorted_ranks if r[3]))
    library = "rccl" if any("AMD" in d or "Instinct" in d for d in device_names) else "nccl"
    out_rows = tuple(NcclTestsRow(op=op_name, group_size=k, group=0, **r) for r in rows)
    dtypes = {r.dtype for r in out_rows}
    group = NcclTestsGroup(
        index=0, first_line=1, last_line=len(results), op=op_name, op_source=op_source, test_name=binary,
        command=" ".join(args)[:2000] or None, group_size=k, group_size_source=k_src, ranks=sorted_ranks,
        hosts=tuple(dict.fromkeys(r[1] for r in sorted_ranks if r[1])), device_names=device_names, library=library,
        library_version=lib_version, tests_version=f"nccl-tests json v{version}", layout="json",
        columns=("size", "count", "type", "redop", "root", "time", "alg_bw", "bus_bw", "nwrong"), params=params,
        dtype=dtypes.pop() if len(dtypes) == 1 else None, rows=out_rows, avg_busbw=avg_bw, oob_values=oob_n,
        oob_failed=bool(oob_n) or oob.get("okay") == "false", quarantined=tuple(quarantined),
        per_iter=tuple(per_iter),
    )
    return NcclTestsLog(
        path=str(p), op=op_name, test_name=binary, op_source=op_source, dtype=group.dtype, group_size=k,
        group_size_source=k_src, layout="json", columns=group.columns, rows=out_rows, ranks=sorted_ranks,
        params=params, avg_busbw=avg_bw, nccl_version=lib_version, tests_version=group.tests_version,
        groups=(group,), quarantined=tuple(quarantined), warnings=tuple(warnings),
    )
