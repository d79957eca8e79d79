"""What-if replay: a step's execution graph across ranks, replayed by list scheduling, and the edits
that ask "what would the step take if ...".

The graph (:class:`Graph`) is built by ``tracekit.analyses.replay`` from the critical path's
edges (``tracekit.analyses.critical_path``: stream order, thread order, launches, syncs, blocking
calls, the inferred cross-stream and host edges, a collective's last arrival); this module holds
only arrays and knows nothing of the store.

A node i (a GPU op, a runtime call, a CPU op: one event) has two points, its start and its end.
Each edge j → i ties one of i's points to one point of j (its *anchor*: j's start or end) plus a
fixed offset, ns:

- a *start* edge (stream, thread, launch, cross-stream, host) holds i's start: i cannot start
  before anchor'(j) + offset;
- an *end* edge (a sync call waiting for a GPU op, a blocking call for its own op, a collective
  span waiting for the last arriving rank's span of the same instance) holds i's end: the part of
  i after the wait (its *tail*) runs only once the wait is over.

The replay (list scheduling in topological order of the points, the standard longest-path
evaluation of a DAG with node weights):

    start'(i) = max(origin, max over start edges (anchor'(j) + offset)) + delay(i)
    end'(i)   = max(start'(i), max over end edges (anchor'(j) + offset)) + tail(i)

with delay(i) = start(i) − (the latest ready time of its start edges, or the window's first start
``origin`` for a node with none): the time nothing recorded explains (host code between two CPU
calls, launch latency, an unrecorded wait), kept as the node's own; and tail(i) = end(i) −
max(start(i), its latest end-edge ready time): the node's own work after its last wait (for a
collective span: its transfer time after the last arrival, DESIGN.md "Matching collectives across
ranks"). With the measured delays and tails the replay gives every point its measured time
exactly, unless an edge's ready time lies after its point (a collective span that ended before
its last arrival started: clocks across hosts not aligned), where the replay is later than the
trace (the validation error of ``tracekit.analyses.replay``).

Edits (each returns a new Graph; they compose by chaining): :func:`scale` (compute or any class,
or names, by a factor), :func:`no_stragglers` (every rank's delays and work capped at the other
ranks' median at the same point of the program), :func:`model_transfers` (collective transfer
times from the α–β model for a link preset and algorithm; :func:`machine_transfers`, NCCL's own
model on a machine description), :func:`chunk` (a collective pipelined
with the compute before it in N pieces, the model's chunking rule) and :func:`move_off_stream`
(a collective on its own stream: the ops after it stop waiting for it), and the other way,
:func:`add_delay` (a rank made a straggler).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from dataclasses import dataclass, field

import numpy as np

from tracekit.errors import BadInputError

CLASSES = ("compute", "comm", "memory", "cpu", "sync", "other")
"""events.class values; Graph.cls holds their position + 1 (0: none)."""

PARTS = ("compute_ns", "exposed_comm_ns", "memory_ns", "launch_cpu_ns", "sync_other_ns", "straggler_ns",
         "idle_ns")
"""The composition of a replayed critical path (the columns of critical_path_summary)."""

_CLASS_PART = {"compute": "compute_ns", "comm": "exposed_comm_ns", "memory": "memory_ns", "cpu": "launch_cpu_ns",
               "sync": "sync_other_ns", "other": "sync_other_ns"}
START, END = 0, 1
"""Edge sides and anchors: a node's start point or end point."""


@dataclass
class Graph:
    """One window's (profiler step's) execution graph across ranks. Node arrays (length n):

    rank (int64), gpu (bool: a GPU op), cls (int8: CLASSES position + 1), name (object: str),
    start, end (int64, measured ns), delay, tail (int64 ns, see the module docstring), track (int64:
    a stream or thread id, unique in the window), instance (int64: the collective instance of a
    collective span, an index into ``instances``, else -1).

    Edge arrays (length m): src, dst (node rows), anchor (START / END of src), side (START / END of
    dst), offset (ns), kind (str: the critical path's edge kind).

    origin: the window's first start, ns. instances: per collective instance a dict with op,
    size_bytes, group_size, pg, seq (None where unknown). step: the profiler step (None: whole
    trace). notes: what edits did (strings, in order)."""

    rank: np.ndarray
    gpu: np.ndarray
    cls: np.ndarray
    name: np.ndarray
    start: np.ndarray
    end: np.ndarray
    track: np.ndarray
    instance: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    anchor: np.ndarray
    side: np.ndarray
    offset: np.ndarray
    kind: np.ndarray
    origin: int
    instances: list = field(default_factory=list)
    step: int | None = None
    delay: np.ndarray | None = None
    tail: np.ndarray | None = None
    notes: list = field(default_factory=list)

    def __post_init__(self):
        if self.delay is None or self.tail is None:
            self.delay, self.tail = measured_weights(self)

    @property
    def n(self) -> int:
        return len(self.start)

    def copy(self, **changes) -> "Graph":
        """A copy with its arrays copied (and ``changes`` applied)."""
        out = dataclasses.replace(self, **{f.name: (getattr(self, f.name).copy()
                                                    if isinstance(getattr(self, f.name), (np.ndarray, list))
                                                    else getattr(self, f.name))
                                           for f in dataclasses.fields(self)})
        for k, v in changes.items():
            setattr(out, k, v)
        return out

    def class_name(self, i: int) -> str:
        c = int(self.cls[i])
        return CLASSES[c - 1] if c else "other"


def _ready(g: Graph, times_start: np.ndarray, times_end: np.ndarray) -> np.ndarray:
    """Each edge's ready time from the given point times: anchor time + offset."""
    return np.where(g.anchor == START, times_start[g.src], times_end[g.src]) + g.offset


def measured_weights(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(delay, tail) of every node from the measured times (module docstring), ns, int64; a
    negative delay (a start edge ready after the start: not produced by the critical path's
    rules) is taken as 0."""
    r = _ready(g, g.start, g.end)
    start_ready = np.full(g.n, g.origin, np.int64)
    end_ready = np.full(g.n, np.iinfo(np.int64).min, np.int64)
    s_edges, e_edges = g.side == START, g.side == END
    np.maximum.at(start_ready, g.dst[s_edges], r[s_edges])
    np.maximum.at(end_ready, g.dst[e_edges], r[e_edges])
    delay = np.maximum(g.start - start_ready, 0)
    tail = np.maximum(g.end - np.maximum(g.start, end_ready), 0)
    return delay, tail


@dataclass
class Replay:
    """A replayed graph: start and end per node (ns), and per node and side the edge that bound
    the point (``bind_start``: an edge row, or -1 for the origin; ``bind_end``: an edge row, or -1
    for the node's own start)."""

    graph: Graph
    start: np.ndarray
    end: np.ndarray
    bind_start: np.ndarray
    bind_end: np.ndarray

    def rank_span(self, rank: int) -> tuple[int, int]:
        """(first start, last end) of the rank's nodes, ns."""
        m = self.graph.rank == rank
        return int(self.start[m].min()), int(self.end[m].max())

    def step_ns(self) -> dict[int, int]:
        """rank → its replayed step time: last end − first start of its nodes, ns."""
        return {int(r): b - a for r in np.unique(self.graph.rank) for a, b in [self.rank_span(int(r))]}


def _order(g: Graph) -> np.ndarray:
    """The points (2·i + side) in a topological order (Kahn's algorithm); raises ValueError when
    the edges loop."""
    n = g.n
    # point graph: start_i → end_i, and each edge anchor point → side point
    psrc = np.r_[2 * np.arange(n), 2 * g.src + g.anchor].astype(np.int64)
    pdst = np.r_[2 * np.arange(n) + 1, 2 * g.dst + g.side].astype(np.int64)
    indeg = np.bincount(pdst, minlength=2 * n)
    order = np.argsort(psrc, kind="stable")
    heads = np.searchsorted(psrc[order], np.arange(2 * n + 1))
    succ = pdst[order].tolist()
    heads = heads.tolist()
    indeg = indeg.tolist()
    # start with the ready points in time order, so the result is deterministic
    t = np.empty(2 * n, np.int64)
    t[0::2], t[1::2] = g.start, g.end
    stack = sorted((p for p in range(2 * n) if indeg[p] == 0), key=lambda p: (t[p], p), reverse=True)
    out = []
    while stack:
        p = stack.pop()
        out.append(p)
        for q in succ[heads[p]:heads[p + 1]]:
            indeg[q] -= 1
            if indeg[q] == 0:
                stack.append(q)
    if len(out) != 2 * n:
        raise ValueError(f"the graph's edges loop ({2 * n - len(out)} points in a cycle)")
    return np.array(out, np.int64)


def replay(g: Graph) -> Replay:
    """List-schedule the graph (module docstring): every node's replayed start and end, ns, and
    the edge that bound each point. Raises ValueError when the edges loop."""
    n = g.n
    order = _order(g).tolist()
    by_dst = np.argsort(2 * g.dst + g.side, kind="stable")
    keys = (2 * g.dst + g.side)[by_dst]
    heads = np.searchsorted(keys, np.arange(2 * n + 1)).tolist()
    by_dst = by_dst.tolist()
    src, anchor, off = g.src.tolist(), g.anchor.tolist(), g.offset.tolist()
    delay, tail = g.delay.tolist(), g.tail.tolist()
    t = [0] * (2 * n)
    bind = [-1] * (2 * n)
    origin = int(g.origin)
    for p in order:
        i, side = divmod(p, 2)
        if side == START:
            best, b = origin, -1
        else:
            best, b = t[2 * i], -1
        for k in by_dst[heads[p]:heads[p + 1]]:
            r = t[2 * src[k] + anchor[k]] + off[k]
            if r > best:
                best, b = r, k
        t[p] = best + (delay[i] if side == START else tail[i])
        bind[p] = b
    ta = np.array(t, np.int64)
    bd = np.array(bind, np.int64)
    return Replay(g, ta[0::2], ta[1::2], bd[0::2], bd[1::2])


def critical_path(rp: Replay, rank: int) -> dict:
    """The replayed critical path of `rank`'s step, walked back from its node ending last through
    the edges that bound each point: {"parts": PARTS → ns (summing to the path's length),
    "length_ns", "nodes": [(node, credited ns)] latest first}. A node's tail goes to its class's
    part, a delay to launch_cpu_ns (CPU node) or idle_ns (GPU node), time on another rank to
    straggler_ns, an edge's offset to idle_ns."""
    g = rp.graph
    parts = dict.fromkeys(PARTS, 0)
    mine = np.flatnonzero(g.rank == rank)
    i = int(mine[np.lexsort((mine, rp.start[mine], rp.end[mine]))[-1]])
    side, t_end = END, int(rp.end[i])
    nodes = []
    t0 = t_end
    guard = 4 * g.n + 4
    while guard:
        guard -= 1
        own = int(g.rank[i]) == rank
        if side == END:
            b = int(rp.bind_end[i])
            ready = int(rp.start[i]) if b < 0 else int(_ready_one(rp, b))
            credit = int(rp.end[i]) - ready
            parts[_CLASS_PART[g.class_name(i)] if own else "straggler_ns"] += credit
            nodes.append((i, credit))
            if b < 0:
                side = START
                continue
        else:
            b = int(rp.bind_start[i])
            ready = int(g.origin) if b < 0 else int(_ready_one(rp, b))
            gap = int(rp.start[i]) - ready
            parts[("idle_ns" if g.gpu[i] else "launch_cpu_ns") if own else "straggler_ns"] += gap
            if b < 0:
                t0 = ready
                break
        # move to the anchor point of edge b (an offset between is credited as idle)
        a_time = int(rp.start[g.src[b]] if g.anchor[b] == START else rp.end[g.src[b]])
        if ready > a_time:
            parts["idle_ns" if own else "straggler_ns"] += ready - a_time
        i, side = int(g.src[b]), int(g.anchor[b])
    length = t_end - t0
    # offsets below the anchor (negative) make the pieces overlap: the length is the path's span
    drift = length - sum(parts.values())
    parts["idle_ns"] += drift
    return {"parts": parts, "length_ns": length, "nodes": nodes}


def _ready_one(rp: Replay, k: int) -> int:
    g = rp.graph
    return int((rp.start[g.src[k]] if g.anchor[k] == START else rp.end[g.src[k]]) + g.offset[k])


# --- edits ------------------------------------------------------------------------------------------

def _matcher(pattern: str):
    """A name test: a glob when the pattern has * ? or [, else a case-insensitive substring."""
    p = pattern.strip()
    if any(c in p for c in "*?["):
        rx = re.compile(fnmatch.translate(p), re.IGNORECASE)
        return lambda s: bool(rx.match(s or ""))
    low = p.lower()
    return lambda s: low in (s or "").lower()


MAX_SCALE = 1e6
"""The largest --scale factor: a million times slower is past any question a step answers, and a
step's ns times it stays far inside int64."""

MAX_DELAY_MS = 1e9
"""The largest --delay, ms (11.6 days): its ns stay far inside int64."""


def parse_scale(spec: str) -> list[tuple[str, float]]:
    """``'gemm=0.5,comm=2'`` → [('gemm', 0.5), ('comm', 2.0)]. Raises BadInputError for a part
    without '=' or a factor that is not a number from 0 to :data:`MAX_SCALE`."""
    out = []
    for part in filter(None, (x.strip() for x in spec.split(","))):
        key, eq, val = part.partition("=")
        try:
            f = float(val)
        except ValueError:
            f = -1.0
        if not eq or not key.strip() or not 0 <= f <= MAX_SCALE:  # NaN and inf fail here too
            raise BadInputError(f"--scale {spec!r}: each part is NAME=FACTOR with FACTOR a number from 0 to "
                                f"{MAX_SCALE:g} (e.g. 'gemm=0.5' or 'compute=0.8'), got {part!r}")
        out.append((key.strip(), f))
    return out


def scale(g: Graph, key: str, factor: float) -> Graph:
    """Every node of class `key` (one of CLASSES), else every node whose name matches `key`
    (:func:`_matcher`), has its tail (its own work after its last wait; for a kernel, its whole
    duration) multiplied by `factor`; the note counts the ops (tracekit.analyses.replay.whatif
    refuses an edit that matched nothing in any step)."""
    if key in CLASSES:
        hit = g.cls == CLASSES.index(key) + 1
    else:
        m = _matcher(key)
        hit = np.array([m(s) for s in g.name], bool)
    out = g.copy()
    out.tail = np.where(hit, np.rint(g.tail * factor).astype(np.int64), g.tail)
    out.notes.append(f"scale {key}×{factor:g}: {int(hit.sum())} ops, "
                     f"{int(g.tail[hit].sum())} → {int(out.tail[hit].sum())} ns of work")
    return out


def program_points(g: Graph) -> np.ndarray:
    """Per node a key that names the same point of the program on every rank: the node's name
    and its occurrence among its rank's nodes of that name in start order (int64 codes)."""
    names = np.array([str(s) for s in g.name], object)
    _, code = np.unique(names, return_inverse=True)
    order = np.lexsort((np.arange(g.n), g.start, code, g.rank))
    occ = np.zeros(g.n, np.int64)
    c, r = code[order], g.rank[order]
    new = np.r_[True, (c[1:] != c[:-1]) | (r[1:] != r[:-1])]
    idx = np.arange(g.n)
    first = np.maximum.accumulate(np.where(new, idx, 0))
    occ[order] = idx - first
    return code.astype(np.int64) * (g.n + 1) + occ


def no_stragglers(g: Graph, work: bool = False) -> Graph:
    """Arrivals aligned: at each point of the program (:func:`program_points`) that several ranks
    reach, a rank's delay (the time before a node that no recorded dependency explains: host code,
    a sleep, launch latency, an unrecorded wait) above the median of the other ranks' is cut to it
    (2 ranks: to the other rank's). With `work`, the tails too (a rank's slower kernels or CPU
    ops; every rank's work then becomes the fastest of the ranks' at each point, which lowers the
    step by the ranks' ordinary spread as well). What every rank does stays. The nodes' waits
    (collective last arrivals, syncs) are edges and follow by themselves."""
    key = program_points(g)
    out = g.copy()
    order = np.argsort(key, kind="stable")
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    cut_ns = 0
    for grp in np.split(order, cuts):
        if len(grp) < 2:
            continue
        for arr in (out.delay, out.tail) if work else (out.delay,):
            vals = arr[grp].copy()
            for a, i in enumerate(grp):
                others = np.delete(vals, a)
                cap = int(np.median(others))
                if vals[a] > cap:
                    cut_ns += int(vals[a] - cap)
                    arr[i] = cap
    out.notes.append(f"no stragglers: {cut_ns} ns of per-rank delay" + (" and work" if work else "")
                     + " above the other ranks' median removed")
    return out


def _reprice(g: Graph, ops: str | None, price) -> tuple[Graph, int, int]:
    """A copy of `g` whose collective instances (those whose op or a span's name matches `ops`, all
    when None) take the tail ``price(instance)`` gives: (new tail ns, more keys for the instance
    dict). An instance it cannot price (BadInputError, TypeError, ValueError, KeyError) keeps its
    measured tail. Each priced instance records ``before_ns`` (median of its spans' tails) and
    ``after_ns``. Returns (the copy, instances kept measured, spans matched)."""
    out = g.copy()
    out.instances = [dict(x) for x in g.instances]
    test = _matcher(ops) if ops else None
    kept = matched = 0
    for k, inst in enumerate(out.instances):
        members = np.flatnonzero(g.instance == k)
        if not len(members):
            continue
        if test and not (test(str(inst.get("op"))) or any(test(str(g.name[i])) for i in members)):
            continue
        matched += len(members)
        try:
            new, extra = price(inst)
        except (BadInputError, TypeError, ValueError, KeyError):
            kept += 1
            continue
        inst["before_ns"] = int(np.median(g.tail[members]))
        inst["after_ns"] = new
        inst.update(extra)
        out.tail[members] = new
    return out, kept, matched


def model_transfers(g: Graph, link, algo: str | None = None, ops: str | None = None) -> Graph:
    """Every collective span's tail (its transfer after the last arrival) replaced by the α–β
    model's time for its instance's op, size and group size on `link` (a tracekit.model.Link)
    with `algo` (None: the op's default; tracekit.model.collectives.predict_collective), where
    `ops` (a name test) is None or matches the span's name or op. Instances the model cannot
    price (op unknown to it, size unknown, a group of 1) keep their measured tail, counted in the
    notes. Per instance, the old (median over its spans) and new tails are in
    ``out.instances[k]['before_ns'/'after_ns']``."""
    from tracekit.model.collectives import predict_collective

    def price(inst):
        p = predict_collective(inst["op"], float(inst["size_bytes"]), int(inst["group_size"]), link, algo)
        return int(round(p.time_s * 1e9)), {}

    out, kept, matched = _reprice(g, ops, price)
    # with --ops the note counts the spans it matched (a filter that matches nothing is refused)
    out.notes.append(f"transfers from the model on {link.name}" + (f" ({algo})" if algo else "")
                     + (f" for {ops}: {matched} spans" if ops else "")
                     + (f", {kept} instances kept measured (the model cannot price them)" if kept else ""))
    return out


def parse_delay(spec: str) -> tuple[int, int, str]:
    """``'1:200@all_reduce'`` → (rank 1, 200 ms in ns, pattern 'all_reduce'). Raises BadInputError
    for another form or a delay above :data:`MAX_DELAY_MS`."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*([0-9.]+)\s*@\s*(\S.*?)\s*", spec or "")
    if not m:
        raise BadInputError(f"--delay {spec!r}: expected RANK:MS@PATTERN (e.g. '1:200@all_reduce': rank 1 "
                            "starts the step's first op matching all_reduce 200 ms later)")
    ms = float(m[2])
    if ms > MAX_DELAY_MS:
        raise BadInputError(f"--delay {spec!r}: {m[2]} ms is more than the largest delay, {MAX_DELAY_MS:g} ms")
    return int(m[1]), int(round(ms * 1e6)), m[3]


def add_delay(g: Graph, rank: int, delay_ns: int, pattern: str) -> Graph:
    """A straggler: `rank`'s first node of the window (by start) whose name matches `pattern`
    (:func:`_matcher`) starts `delay_ns` later (its delay grows; what depends on it follows, its
    collective's other members wait). Raises BadInputError when the rank has no such node."""
    m = _matcher(pattern)
    ranks = sorted({int(r) for r in g.rank})
    if rank not in ranks:
        raise BadInputError(f"--delay: rank {rank} is not in the run (its ranks: {', '.join(map(str, ranks))})")
    hit = [i for i in np.flatnonzero(g.rank == rank) if m(str(g.name[i]))]
    if not hit:
        raise BadInputError(f"--delay: rank {rank} has no op matching {pattern!r} in step {g.step}")
    i = min(hit, key=lambda k: (g.start[k], k))
    out = g.copy()
    out.delay[i] += delay_ns
    out.notes.append(f"delay rank {rank} by {delay_ns / 1e6:g} ms before {g.name[i]}")
    return out


def machine_transfers(g: Graph, machine, ops: str | None = None) -> Graph:
    """As :func:`model_transfers`, with the time of what NCCL would pick on `machine` (a
    tracekit.model.machine.Machine; tracekit.model.nccl_tuning.nccl_choice, NCCL's own cost model)
    for each instance: its group of k ranks over ceil(k / the machine's GPUs per node) nodes, the
    ranks packed node by node."""
    from tracekit.model.nccl_tuning import nccl_choice

    def price(inst):
        ranks = int(inst["group_size"])
        nodes = -(-ranks // int(machine.gpus_per_node))
        p = nccl_choice(inst["op"], float(inst["size_bytes"]), ranks, nodes, machine)
        return int(round(p.time_s * 1e9)), {"model_pick": p.label}

    out, kept, _ = _reprice(g, ops, price)
    out.notes.append(f"transfers from NCCL's model on {machine.name}"
                     + (f", {kept} instances kept measured (the model cannot price them)" if kept else ""))
    return out


def _stream_edges(g: Graph, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(edge rows into i of kind stream, edge rows out of i of kind stream)."""
    st = g.kind == "stream"
    return np.flatnonzero(st & (g.dst == i)), np.flatnonzero(st & (g.src == i))


def chunk(g: Graph, pattern: str, chunks: int, alpha_chunk_s: float) -> Graph:
    """Each collective span whose name (or op) matches `pattern`, pipelined in `chunks` pieces with
    the compute op before it on its stream (tracekit.model.overlap.chunked_overlap: T(n) = c/n +
    (a/n + α_c) + (n−1)·max(c/n, a/n + α_c), c = that op's tail, a = the span's tail, α_c =
    `alpha_chunk_s`): the span now starts with the compute op (its stream edge anchored at the
    op's start, its delay 0) and its tail is T(n), from that start; every member of an instance
    takes the largest T(n) of its members (the pieces of a collective finish together, with the
    slowest rank's pipeline). The other ranks' arrival (the collective edge) is the last member's
    new start. Spans without a compute op before them on their stream keep theirs. Raises
    BadInputError for chunks < 1."""
    from tracekit.model.overlap import chunked_overlap

    if chunks < 1:
        raise BadInputError(f"--chunk: the number of pieces must be >= 1, got {chunks}")
    test = _matcher(pattern)
    out = g.copy()
    done = named = on_gpu = 0
    longest: dict[int, int] = {}
    for i in np.flatnonzero(g.instance >= 0):
        inst = g.instances[int(g.instance[i])]
        if not (test(str(g.name[i])) or test(str(inst.get("op")))):
            continue
        named += 1
        on_gpu += bool(g.gpu[i])
        into, _ = _stream_edges(g, i)
        into = [k for k in into if g.cls[g.src[k]] == CLASSES.index("compute") + 1]
        if not into:
            continue
        k = into[0]
        c, a = g.tail[g.src[k]] / 1e9, g.tail[i] / 1e9
        r = chunked_overlap(c, a, chunks, alpha_chunk_s)
        out.anchor[k], out.offset[k] = START, 0
        out.delay[i] = 0
        out.tail[i] = int(round(r.time_s * 1e9))
        longest[int(g.instance[i])] = max(longest.get(int(g.instance[i]), 0), int(out.tail[i]))
        done += 1
    for inst, t in longest.items():
        out.tail[(g.instance == inst) & (out.tail < t)] = t
    why = ""
    if named and not done:
        why = (" (its matching collective spans are CPU spans, on no GPU stream: nothing to pipeline)"
               if not on_gpu else " (none of its matching collective spans follows a compute op on its stream)")
    out.notes.append(f"chunk {pattern!r} in {chunks} pieces (α per piece {alpha_chunk_s * 1e6:g} µs): {done} spans{why}")
    return out


def move_off_stream(g: Graph, pattern: str) -> Graph:
    """Each GPU collective span whose name (or op) matches `pattern` moved to a stream of its own:
    it still waits for the op before it on its stream (taken as its input's producer), the op after
    it waits for that op instead of for it (taken not to read its output: a CPU sync or a later
    wait still waits for it), and the moved spans keep their order among themselves (one NCCL
    stream)."""
    test = _matcher(pattern)
    out = g.copy()
    named = [int(i) for i in np.flatnonzero(g.instance >= 0)
             if test(str(g.name[i])) or test(str(g.instances[int(g.instance[i])].get("op")))]
    moved = [i for i in named if g.gpu[i]]
    by_rank: dict[int, int] = {}
    add = []
    for i in sorted(moved, key=lambda x: (g.start[x], x)):
        into, outof = _stream_edges(out, i)
        for k in outof:
            if len(into):
                p = into[0]
                out.src[k], out.anchor[k], out.offset[k] = out.src[p], out.anchor[p], out.offset[p]
            else:
                out.offset[k] = -(1 << 62)  # no producer: no constraint (ready long before the origin)
        prev = by_rank.get(int(g.rank[i]))
        if prev is not None:
            add.append((prev, i))
        by_rank[int(g.rank[i])] = i
    if add:
        s, d = np.array(add, np.int64).T
        out.src, out.dst = np.r_[out.src, s], np.r_[out.dst, d]
        out.anchor, out.side = np.r_[out.anchor, np.full(len(s), END)], np.r_[out.side, np.full(len(s), START)]
        out.offset = np.r_[out.offset, np.zeros(len(s), np.int64)]
        out.kind = np.r_[out.kind, np.array(["stream"] * len(s), object)]
    why = (" (its matching collective spans are CPU spans, on no GPU stream: nothing to move)"
           if named and not moved else "")
    out.notes.append(f"move {pattern!r} off the compute stream: {len(moved)} spans{why}")
    return out


def plan(link=None, algo: str | None = None, scale_spec: str | None = None, stragglers: bool = False,
         chunk_spec: str | None = None, move_off: str | None = None, alpha_chunk_s: float | None = None,
         ops: str | None = None, delay_spec: str | None = None, machine=None) -> list[tuple[str, object]]:
    """The edits asked for, in the order they apply: (label, function Graph → Graph). `link`: a
    tracekit.model.Link for :func:`model_transfers` (with `algo`, and `ops` limiting it to matching
    collectives); `scale_spec`: :func:`parse_scale`'s text; `stragglers`: :func:`no_stragglers`;
    `chunk_spec`: ``'PATTERN=N'`` for :func:`chunk` (α per piece: `alpha_chunk_s`, else `link`'s
    α); `move_off`: a pattern for :func:`move_off_stream`. Raises BadInputError for a malformed
    spec, an algorithm without a link, a chunk without an α."""
    out: list[tuple[str, object]] = []
    if algo is not None and link is None:
        raise BadInputError("--algo needs --link: the model prices the algorithm on a link preset")
    if algo is not None:
        from tracekit.model import ALGORITHMS

        known = sorted({a for algos in ALGORITHMS.values() for a in algos})  # op → its algorithms
        if algo not in known:
            raise BadInputError(f"--algo {algo!r}: not an algorithm of the model (one of {', '.join(known)})")
    if stragglers:
        out.append(("no stragglers", no_stragglers))
    if delay_spec:
        rank, ns, pat = parse_delay(delay_spec)
        out.append((f"delay rank {rank} by {ns / 1e6:g} ms at {pat}", lambda g: add_delay(g, rank, ns, pat)))
    for key, f in parse_scale(scale_spec) if scale_spec else []:
        out.append((f"scale {key}={f:g}", lambda g, k=key, f=f: scale(g, k, f)))
    if machine is not None:
        if link is not None or algo is not None:
            raise BadInputError("--machine prices collectives with NCCL's own model (its pick): not with --link/--algo")
        out.append((f"transfers on {machine.name} (NCCL's pick)", lambda g: machine_transfers(g, machine, ops)))
    if link is not None:
        out.append((f"transfers on {link.name}" + (f" ({algo})" if algo else "") + (f" for {ops}" if ops else ""),
                    lambda g: model_transfers(g, link, algo, ops)))
    if move_off:
        out.append((f"move {move_off} off the compute stream", lambda g: move_off_stream(g, move_off)))
    if chunk_spec:
        pat, eq, n = chunk_spec.rpartition("=")
        if not eq or not pat.strip() or not n.strip().isdigit() or int(n) < 1:
            raise BadInputError(f"--chunk {chunk_spec!r}: expected PATTERN=N with N >= 1 pieces (e.g. 'all_reduce=4')")
        a = alpha_chunk_s if alpha_chunk_s is not None else (link.alpha_s if link is not None else None)
        if a is None:
            raise BadInputError("--chunk needs --link (its α is each piece's extra message cost)")
        out.append((f"chunk {pat.strip()} in {int(n)}", lambda g: chunk(g, pat.strip(), int(n), a)))
    return out


def apply(g: Graph, edits: list[tuple[str, object]]) -> Graph:
    """The graph after every edit of :func:`plan`, in order (each on the previous one's result)."""
    for _, f in edits:
        g = f(g)
    return g
