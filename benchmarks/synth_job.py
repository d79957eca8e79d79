"""A synthetic N-rank job with known truth, made from one real rank trace.

    python benchmarks/synth_job.py --ranks 64 --base fixtures/3d_2x2x2/rank0.pt.trace.json.gz \\
        --out /tmp/synth64 --layout tp2xpp2xdp --seed 1 --straggler 5 --compute-events 200

writes ``DIR/traces/rank{r}.pt.trace.json.gz`` for r = 0..N−1 (Kineto JSON, one file per rank) with
a ``run_config.json`` (workload ``synth``, the ``parallel_layout``), and ``DIR/truth.json`` (beside
``traces/``, so that ``tracekit ingest DIR/traces`` reads the rank files only). Python:
:func:`make_job` (same arguments, returns the truth dict).

How the job is made from the base trace (every rank gets the same base timeline):

- **collectives**: the base's communication spans are the templates — NCCL/RCCL kernels (op from
  ``Collective name`` or the kernel name, size from ``In/Out msg nelems`` × ``dtype``) or, on a
  CPU-only gloo trace, the ``gloo:<op>`` issuer spans (size from ``Input Dims`` × ``Input type``).
  Point-to-point templates (send/recv) are dropped. Template k goes to the process groups of layout
  dimension k mod (number of dimensions), in the order the layout names them; every group of that
  dimension runs it, so every rank of a group has the same ops, sizes and ``Seq`` (0, 1, ... per
  group, in template order). Each collective is written as one NCCL kernel on a stream of its own,
  carrying its metadata as PyTorch ≥ 2.1 writes it (``Collective name``, ``In/Out msg nelems``,
  ``dtype``, ``Group size``, ``Process Group Name``/``Description``/``Ranks``, ``Seq``). The base's
  own communication events (kernels, ``record_param_comms``, ``nccl:*``, ``c10d::*``, ``gloo:*``) and
  its flow events are dropped; the rest is kept (``compute_events`` keeps at most that many complete
  events, evenly spaced in time, plus every ``ProfilerStep#`` span). The collectives are GPU kernels
  even on a CPU-only base, whose CPU ops then are no compute: such a job has no overlap (0 by
  construction); a GPU base (e.g. ../shared/traces/hta_nccl_parser_a100_r0of2) keeps its kernels.
- **process groups**: ``"0"`` is the world (``default_pg``); then the groups of each layout
  dimension, numbered ``"1"``, ``"2"``, ... in layout order (description = the dimension: tp, pp, dp,
  ep, cp). Rank coordinates follow the layout left to right, the first dimension varying fastest
  (``tp2xpp2xdp``: rank = tp + 2·(pp + 2·dp), Megatron's TP-innermost order). Each rank's
  ``distributedInfo.pg_config`` lists the world and the groups it belongs to.
- **skews** (true clock, integer ns): in each instance every rank of the group arrives at the
  template's start + s_r, the s_r distinct integers in [0, ``max_skew_ns``], drawn from ``seed``;
  the straggler (``straggler``), in every instance of a group it belongs to, gets s = ``max_skew_ns``
  and the others at most ``max_skew_ns`` − ``min_gap_ns``. Every rank of an instance ends at the same
  true time, template start + ``max_skew_ns`` + the template's duration, so the last arrival is
  unique and a rank's wait (last arrival − its start) is exact.
- **timeline**: to make room for the skews the base timeline is stretched by ``max_skew_ns`` at every
  template (and by whatever keeps collectives on the comm stream from overlapping), the same on
  every rank; the stretch never decreases with time, so no two events of one stream start to
  overlap. Times are rebased to start at ``ORIGIN_NS`` and written as µs with 3 decimals (at most 15
  significant digits: exact in float64 and read back to the ns).
- **clocks**: ranks of one node (``gpus_per_node`` consecutive ranks, ``host_name`` ``nodeNNNN``)
  share a clock; node n ≠ 0 gets an integer offset o_n in ±[``min_offset_ns``, ``max_offset_ns``],
  node 0 none. A rank writes local = true − o_n, so o_n is the ``clock_offset_ns`` tracekit should add
  (tracekit.ingest.clocks: the median over common instances of end_a − end_b, relative to rank 0).
  Since every instance ends at one true time, every such difference is exactly o_b − o_a: the median
  and the breadth-first sums are exact (the reported uncertainty is the 1 ns floor summed along the
  chain, a few ns), and after alignment every start equals its true arrival. The skews do not move
  the ends, so no skew can bias the estimate. (A rank's sync time is therefore the template's
  duration plus ``max_skew_ns`` − the instance's largest skew.)

truth.json (all ns on the true clock = rank 0's clock = the run clock after alignment)::

    traces_dir, ranks, layout, dims {name: size}, seed, straggler, max_skew_ns, gpus_per_node,
    hosts [per rank], clock_offset_ns [per rank],
    process_groups [{pg_name, pg_desc, ranks}],
    instances [{pg_name, seq, op, size_bytes, ranks, arrival_ns [per rank of `ranks`],
                end_ns, last_arrival_rank, last_arrival_ns, wait_ns [per rank of `ranks`]}]

Raises tracekit.errors.BadInputError (one line) for a bad layout, rank count, straggler or base trace.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import re
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np

from tracekit.errors import BadInputError, FileError

ORIGIN_NS = 10**12
"""True time of the base's first event, ns (offsets stay far from 0; µs values keep ≤ 15 digits)."""

DIMS = ("tp", "pp", "dp", "ep", "cp")
OP_NAME = {  # canonical op → (Collective name, kernel name part)
    "all_reduce": ("allreduce", "AllReduce"),
    "all_gather": ("allgather", "AllGather"),
    "reduce_scatter": ("reduce_scatter", "ReduceScatter"),
    "broadcast": ("broadcast", "Broadcast"),
    "all_to_all": ("all_to_all", "AllToAll"),
    "reduce": ("reduce", "Reduce"),
}
DTYPE = {"float": ("Float", 4), "float32": ("Float", 4), "half": ("Half", 2), "float16": ("Half", 2),
         "bfloat16": ("BFloat16", 2), "c10::bfloat16": ("BFloat16", 2), "double": ("Double", 8),
         "int8_t": ("Char", 1), "char": ("Char", 1), "byte": ("Byte", 1), "long": ("Long", 8),
         "int64": ("Long", 8), "int": ("Int", 4)}
_COMM_CPU = re.compile(r"^(record_param_comms$|nccl:|c10d::|gloo:)")
_KERNEL = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.I)
_KIND_OP = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "broadcast": "broadcast", "alltoall": "all_to_all", "reduce": "reduce"}


def parse_layout(layout: str, ranks: int) -> list[tuple[str, int]]:
    """``tp2xpp2xdp`` → [("tp", 2), ("pp", 2), ("dp", ranks / 4)]: the dimensions, first varying fastest.

    One dimension may omit its size (it takes what is left). Raises BadInputError when a name is
    unknown or repeated, or the sizes do not multiply to ``ranks``.
    """
    dims: list[tuple[str, int | None]] = []
    for part in layout.lower().split("x"):
        m = re.fullmatch(r"([a-z]+)(\d*)", part)
        if not m or m.group(1) not in DIMS or any(d == m.group(1) for d, _ in dims):
            raise BadInputError(f"--layout {layout!r}: {part!r} is not one of {', '.join(DIMS)} with an optional size")
        dims.append((m.group(1), int(m.group(2)) if m.group(2) else None))
    free = [d for d, s in dims if s is None]
    known = math.prod(s for _, s in dims if s is not None)
    if len(free) > 1 or any(s == 0 for _, s in dims):
        raise BadInputError(f"--layout {layout!r}: at most one dimension without a size, sizes >= 1")
    if free:
        if ranks % known:
            raise BadInputError(f"--layout {layout!r}: {ranks} ranks are not a multiple of {known}")
        dims = [(d, s if s is not None else ranks // known) for d, s in dims]
    if math.prod(s for _, s in dims) != ranks:
        raise BadInputError(f"--layout {layout!r}: sizes multiply to {math.prod(s for _, s in dims)}, not {ranks} ranks")
    return [(d, int(s)) for d, s in dims]


def process_groups(dims: list[tuple[str, int]], ranks: int) -> list[dict]:
    """The world group "0" and every group of every dimension: [{pg_name, pg_desc, dim, ranks}]."""
    sizes = [s for _, s in dims]
    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "dim": None, "ranks": list(range(ranks))}]
    for i, (name, size) in enumerate(dims):
        seen = set()
        for r in range(ranks):
            base = r - ((r // strides[i]) % size) * strides[i]
            if base in seen:
                continue
            seen.add(base)
            groups.append({"pg_name": str(len(groups)), "pg_desc": name, "dim": name,
                           "ranks": [base + j * strides[i] for j in range(size)]})
    return groups


def _load(base: Path) -> dict:
    try:
        opener = gzip.open if base.name.endswith(".gz") else open
        with opener(base, "rt") as f:
            doc = json.load(f, parse_float=Decimal)
    except OSError as exc:
        raise FileError(str(base), f"cannot read the base trace ({exc.strerror or exc})") from None
    except (ValueError, EOFError) as exc:
        raise FileError(str(base), f"not a Kineto JSON trace ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise FileError(str(base), "not a Kineto JSON trace (no traceEvents list)")
    return doc


def _ns(v) -> int | None:
    try:
        return int(Decimal(str(v)) * 1000)
    except Exception:  # noqa: BLE001 - a value that is not a number: the event is dropped
        return None


def _template(e: dict) -> dict | None:
    """A communication span of the base → {op, dtype, elem_bytes, in_nelems, out_nelems, ts, dur}, or
    None when the event is no collective template (p2p or unknown ops are None too)."""
    name, args = str(e.get("name", "")), e.get("args") or {}
    if str(e.get("cat", "")).lower() == "kernel" and _KERNEL.search(name):
        kind = str(args.get("Collective name") or _KERNEL.search(name).group(1)).lower().replace("_", "")
        dtype = str(args.get("dtype") or "float").lower()
        n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    elif name.startswith("gloo:") and args.get("Input Dims"):
        kind, dims = name[5:].replace("_", ""), args.get("Input Dims")
        dtype = str((args.get("Input type") or ["float"])[0]).lower()
        n_in = math.prod(int(x) for x in dims[0]) if dims and isinstance(dims[0], list) else None
        n_out = None
    else:
        return None
    op = _KIND_OP.get(kind)
    if op is None:
        return None
    ts, dur = _ns(e.get("ts")), _ns(e.get("dur"))
    if ts is None or dur is None or dur < 0:
        return None
    name_t, elem = DTYPE.get(dtype, ("Float", 4))
    n_in = int(n_in) if isinstance(n_in, (int, Decimal)) and int(n_in) > 0 else 262_144
    return {"op": op, "dtype": name_t, "elem_bytes": elem, "in_nelems": n_in,
            "out_nelems": int(n_out) if isinstance(n_out, (int, Decimal)) and int(n_out) > 0 else None,
            "ts": ts, "dur": dur}


def _is_comm(e: dict) -> bool:
    name = str(e.get("name", ""))
    return bool(_COMM_CPU.match(name)) or (str(e.get("cat", "")).lower() == "kernel" and bool(_KERNEL.search(name)))


def _sizes(t: dict, k: int) -> tuple[int, int, int]:
    """(In msg nelems, Out msg nelems, nccl-tests S in bytes) of template `t` on a k-rank group."""
    n = t["in_nelems"]
    if t["op"] == "all_gather":
        n_in, n_out, s = n, n * k, n * k
    elif t["op"] == "reduce_scatter":
        n_in, n_out, s = n * k, n, n * k
    else:
        n_in, n_out, s = n, n, n
    return n_in, n_out, s * t["elem_bytes"]


def _us(ns: int):
    """ns → µs as a JSON number with ≤ 3 decimals, exact (ns < 10^15 keeps it within 15 digits)."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _subsample(events: list[dict], limit: int | None) -> list[dict]:
    if limit is None or len(events) <= limit:
        return events
    keep = {round(i * (len(events) - 1) / max(1, limit - 1)) for i in range(limit)}
    return [e for i, e in enumerate(events) if i in keep or str(e.get("name", "")).startswith("ProfilerStep#")]


def make_job(
    out_dir,
    ranks: int,
    base,
    *,
    layout: str = "tp2xdp",
    seed: int = 0,
    straggler: int | None = None,
    gpus_per_node: int = 8,
    max_skew_ns: int = 50_000,
    min_gap_ns: int = 1_000,
    min_offset_ns: int = 1_000_000,
    max_offset_ns: int = 20_000_000,
    compute_events: int | None = None,
) -> dict:
    """Write the synthetic job into ``out_dir`` (see the module docstring) and return its truth.

    ``straggler`` defaults to a rank drawn from ``seed``; ``compute_events`` caps the base's kept
    complete events (None: keep all). Raises BadInputError for bad arguments, FileError for a base
    trace that cannot be read or has no collective to copy, and when ``out_dir`` already holds rank files.
    """
    if not isinstance(ranks, int) or ranks < 2:
        raise BadInputError(f"--ranks must be an integer >= 2, got {ranks!r}")
    if gpus_per_node < 1 or max_skew_ns < 2 * min_gap_ns or min_gap_ns < 1 or not 0 < min_offset_ns <= max_offset_ns:
        raise BadInputError("need gpus_per_node >= 1, max_skew_ns >= 2·min_gap_ns >= 2, 0 < min_offset_ns <= max_offset_ns")
    dims = parse_layout(layout, ranks)
    rng = np.random.default_rng(seed)
    if straggler is None:
        straggler = int(rng.integers(0, ranks))
    if not 0 <= straggler < ranks:
        raise BadInputError(f"--straggler must be a rank in 0..{ranks - 1}, got {straggler}")
    base = Path(base)
    doc = _load(base)
    out = Path(out_dir)
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    if any(traces.glob("rank*.pt.trace.json.gz")):
        raise BadInputError(f"{traces}: already holds rank files (choose an empty folder)")

    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    templates = sorted((t for t in map(_template, events) if t is not None), key=lambda t: t["ts"])
    if not templates:
        raise FileError(str(base), "no collective to copy (no NCCL/RCCL kernel or gloo:<op> span of a collective)")
    kept = [e for e in events if e.get("ph") not in ("s", "f", "t") and not _is_comm(e)]
    meta = [e for e in kept if e.get("ph") == "M"]
    timed = sorted((e for e in kept if e.get("ph") != "M" and _ns(e.get("ts")) is not None), key=lambda e: _ns(e["ts"]))
    complete = _subsample([e for e in timed if e.get("ph") == "X"], compute_events)
    timed = [e for e in timed if e.get("ph") != "X"] + complete
    t0 = min([_ns(e["ts"]) for e in timed] + [t["ts"] for t in templates])

    # the stretched timeline: slot (true start) of every template, shift of every other event
    shift, prev_end, starts, shifts = 0, None, [], []
    for t in templates:
        start = t["ts"] - t0 + ORIGIN_NS + shift
        if prev_end is not None and start < prev_end:
            shift += prev_end - start
            start = prev_end
        t["slot"] = start
        shift += max_skew_ns
        prev_end = start + max_skew_ns + t["dur"]
        starts.append(t["ts"])
        shifts.append(shift)

    def moved(ts_ns: int) -> int:
        j = bisect.bisect_right(starts, ts_ns) - 1
        return ts_ns - t0 + ORIGIN_NS + (shifts[j] if j >= 0 else 0)

    groups = process_groups(dims, ranks)
    by_dim: dict[str, list[dict]] = {}
    for g in groups[1:]:
        by_dim.setdefault(g["dim"], []).append(g)
    nodes = (ranks + gpus_per_node - 1) // gpus_per_node
    node_off = [0] + [int(rng.integers(min_offset_ns, max_offset_ns + 1)) * (1 if rng.random() < 0.5 else -1)
                      for _ in range(nodes - 1)]
    offset = [node_off[r // gpus_per_node] for r in range(ranks)]
    hosts = [f"node{r // gpus_per_node:04d}" for r in range(ranks)]

    # instances: per template, per group of its dimension
    seqs = {g["pg_name"]: 0 for g in groups}
    per_rank: list[list[dict]] = [[] for _ in range(ranks)]
    instances = []
    for k, t in enumerate(templates):
        dim = dims[k % len(dims)][0]
        for g in by_dim[dim]:
            members = g["ranks"]
            size = len(members)
            seq = seqs[g["pg_name"]]
            seqs[g["pg_name"]] = seq + 1
            top = max_skew_ns - min_gap_ns if straggler in members else max_skew_ns
            skews = rng.choice(top + 1, size=size, replace=False)
            if straggler in members:
                skews[members.index(straggler)] = max_skew_ns
            arrival = [t["slot"] + int(s) for s in skews]
            end = t["slot"] + max_skew_ns + t["dur"]
            last = int(np.argmax(arrival))
            n_in, n_out, s_bytes = _sizes(t, size)
            instances.append({
                "pg_name": g["pg_name"], "seq": seq, "op": t["op"], "size_bytes": s_bytes, "ranks": members,
                "arrival_ns": arrival, "end_ns": end, "last_arrival_rank": members[last],
                "last_arrival_ns": arrival[last], "wait_ns": [arrival[last] - a for a in arrival],
            })
            coll, kernel = OP_NAME[t["op"]]
            args = {
                "Collective name": coll, "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": size,
                "dtype": t["dtype"], "In split size": "[]", "Out split size": "[]",
                "Process Group Name": g["pg_name"], "Process Group Description": g["pg_desc"],
                "Process Group Ranks": json.dumps(members), "Seq": seq,
            }
            name = f"ncclDevKernel_{kernel}_RING_LL_Sum_{t['dtype'].lower()}(ncclDevKernelArgsStorage<4096ul>)"
            for r, a in zip(members, arrival):
                per_rank[r].append({"name": name, "ts": a, "dur": end - a, "args": args})

    gpu_pids = {e.get("pid") for e in timed if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")}
    gpu_pid = min(gpu_pids, key=str) if gpu_pids else 0
    tids = [e.get("tid") for e in timed if e.get("pid") == gpu_pid and isinstance(e.get("tid"), int)]
    comm_tid = max(tids, default=6) + 1
    base_events = [dict(e) for e in meta]
    for e in timed:
        e = dict(e)
        e["ts"] = moved(_ns(e["ts"]))
        if "dur" in e:
            e["dur"] = _ns(e["dur"]) or 0
        base_events.append(e)
    head = {k: v for k, v in doc.items() if k not in ("traceEvents", "distributedInfo", "host_name")}
    di0 = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    mine = [[] for _ in range(ranks)]
    for g in groups:
        for r in g["ranks"]:
            mine[r].append(g)
    for r in range(ranks):
        off = offset[r]
        evs = []
        for e in base_events:
            if "ts" in e and e.get("ph") != "M":
                e = {**e, "ts": _us(e["ts"] - off)}
                if "dur" in e:
                    e["dur"] = _us(e["dur"])
            evs.append(e)
        for i, c in enumerate(per_rank[r]):
            evs.append({"ph": "X", "cat": "kernel", "name": c["name"], "pid": gpu_pid, "tid": comm_tid,
                        "ts": _us(c["ts"] - off), "dur": _us(c["dur"]),
                        "args": {"device": gpu_pid if isinstance(gpu_pid, int) else 0, "stream": comm_tid,
                                 "correlation": 10**9 + i, **c["args"]}})
        pg_config = [{"pg_name": g["pg_name"], "pg_desc": g["pg_desc"], "backend_config": "cuda:nccl",
                      "pg_size": len(g["ranks"]), "ranks": g["ranks"]} for g in mine[r]]
        rank_doc = {
            **head, "host_name": hosts[r],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks, "pg_count": len(pg_config),
                                "pg_config": pg_config, "nccl_version": di0.get("nccl_version") or "2.21.5"},
            "traceEvents": evs,
        }
        path = traces / f"rank{r}.pt.trace.json.gz"
        tmp = path.with_name(path.name + ".tmp")
        with gzip.open(tmp, "wt", compresslevel=1) as f:
            json.dump(rank_doc, f, default=_json_default, separators=(",", ":"))
        tmp.replace(path)
    layout_cfg = {"order": "-".join(d for d, _ in dims), **dict(dims),
                  "rank": " + ".join(f"{d}·{math.prod(s for _, s in dims[:i])}" for i, (d, _) in enumerate(dims))}
    config = {"workload": "synth", "world_size": ranks, "parallel_layout": layout_cfg, "synthetic": True,
              "base_trace": str(base), "seed": seed, "overlap_model": {"kind": "no_overlap", "params": {}}}
    (traces / "run_config.json").write_text(json.dumps(config, indent=2) + "\n")
    truth = {
        "traces_dir": str(traces), "ranks": ranks, "layout": layout, "dims": dict(dims), "seed": seed, "straggler": straggler,
        "max_skew_ns": max_skew_ns, "gpus_per_node": gpus_per_node, "base": str(base),
        "hosts": hosts, "clock_offset_ns": offset,
        "process_groups": [{k: g[k] for k in ("pg_name", "pg_desc", "ranks")} for g in groups],
        "instances": instances,
    }
    (out / "truth.json").write_text(json.dumps(truth) + "\n")
    return truth


def _json_default(v):
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, required=True, help="ranks of the job (>= 2)")
    p.add_argument("--base", required=True, help="one real rank trace (Kineto .json / .json.gz)")
    p.add_argument("--out", required=True, help="folder receiving rank{r}.pt.trace.json.gz and truth.json")
    p.add_argument("--layout", default="tp2xdp", help="dimensions, first fastest: tp2xdp, tp2xpp2xdp, tp4xdp2xpp ...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--straggler", type=int, default=None, help="the rank that arrives last in its groups")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (one clock per node)")
    p.add_argument("--max-skew-ns", type=int, default=50_000, help="largest injected arrival skew, ns")
    p.add_argument("--compute-events", type=int, default=None, help="keep at most this many of the base's events")
    a = p.parse_args(argv)
    from tracekit.errors import TracekitError

    try:
        truth = make_job(a.out, a.ranks, a.base, layout=a.layout, seed=a.seed, straggler=a.straggler,
                         gpus_per_node=a.gpus_per_node, max_skew_ns=a.max_skew_ns, compute_events=a.compute_events)
    except TracekitError as exc:
        print(f"synth_job: {exc}", file=sys.stderr)
        return 2
    print(f"{a.out}: {truth['ranks']} ranks, {len(truth['instances'])} instances, straggler {truth['straggler']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
