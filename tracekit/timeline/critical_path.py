"""The critical path's graph and walk, on one window's nodes as numpy arrays: no DuckDB, no store.

The ingest computes each rank's paths with it (tracekit.ingest.critical_path: a run of one rank is
final there; the nodes of a run of several ranks are stored, and the analysis walks them with the
collective edges across ranks, tracekit.analyses.critical_path). The rules, the walk and the
crediting are documented in tracekit/analyses/critical_path.py's header; this module is their code.

A window's nodes come as columns (numpy arrays, one row per node; :func:`window`):

rank      int64  the node's rank
event_id  int64  events.event_id on that rank
gpu       bool   on a GPU stream (track_kind = 'gpu_stream')
tid       int64  the node's track (stream or thread) as a number that sorts, within the rank, as
                 (kind, device, track) sort with NULLs last: equal tracks, equal numbers
ts_ns     int64  start, ns
end_ns    int64  end, ns
class     int8   1 + the position of events.class in CLASSES (0: another class or NULL)
launch    int64  events.launch_event_id, -1 for none
launched  bool   whether it has one
arrived   bool   the node is a collective span that arrived before its instance's last arrival
last_rank int64  that last arrival's rank (-1 when not arrived)
last_eid  int64  its event_id (-1 when not arrived)
last_ns   int64  its start, ns (0 when not arrived)
"""

from __future__ import annotations

import numpy as np

CLASSES = ("compute", "comm", "memory", "cpu", "sync", "other")
_SYNC = CLASSES.index("sync") + 1
_COMPOSITION = {"compute": "compute_ns", "comm": "exposed_comm_ns", "memory": "memory_ns",
                "cpu": "launch_cpu_ns", "sync": "sync_other_ns", "other": "sync_other_ns"}
PARTS = ("compute_ns", "exposed_comm_ns", "memory_ns", "launch_cpu_ns", "sync_other_ns",
         "straggler_ns", "idle_ns")
"""The composition columns of critical_path_summary, in order; they sum to length_ns."""

# edge kinds (critical_path.edge) by code, and their tie order between predecessors ready at the
# same time: the higher wins ('end' is no edge)
_KINDS = ("end", "stream", "thread", "launch", "sync", "collective", "cross_stream", "host")
_PRIORITY = np.array([-1, 2, 2, 1, 3, 4, 0, 0], np.int8)
_END, _STREAM, _THREAD, _LAUNCH, _EDGE_SYNC, _COLLECTIVE, _CROSS, _HOST = range(len(_KINDS))
# part of PARTS an own event's time goes to, by events.class code (1-based into CLASSES; 0: none)
_CLASS_PART = np.array([PARTS.index(_COMPOSITION[c]) for c in ("other", *CLASSES)], np.int64)
_LAUNCH_CPU, _STRAGGLER, _IDLE = (PARTS.index(p) for p in ("launch_cpu_ns", "straggler_ns", "idle_ns"))

def _distinct(a: np.ndarray) -> np.ndarray:
    """The distinct values of `a`, sorted (np.unique's result, by one sort: cheaper than its
    hashing on these int arrays)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


class _Rows:
    """The rows of a window by (rank, event_id), to find many pairs at once (the pairs are
    distinct: an event_id is unique within its rank)."""

    def __init__(self, rank: np.ndarray, eid: np.ndarray):
        self._ranks, self._eids = _distinct(rank), _distinct(eid)
        self._keys, self._rows = np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(rank):
            keys = self._code(rank, eid)[0]
            self._rows = np.argsort(keys, kind="stable")
            self._keys = keys[self._rows]

    def _code(self, r: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(one int per pair: its rank's and event_id's positions among the rows' distinct ones;
        whether both occur there). Needs a row."""
        i = np.minimum(np.searchsorted(self._ranks, r), len(self._ranks) - 1)
        j = np.minimum(np.searchsorted(self._eids, e), len(self._eids) - 1)
        return i * len(self._eids) + j, (self._ranks[i] == r) & (self._eids[j] == e)

    def find(self, rank: np.ndarray, eid: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Per query k with ok[k]: the row of (rank[k], eid[k]), else -1."""
        if not len(self._keys):
            return np.full(len(rank), -1, np.int64)
        q, found = self._code(rank, eid)
        at = np.minimum(np.searchsorted(self._keys, q), len(self._keys) - 1)
        return np.where(found & ok & (self._keys[at] == q), self._rows[at], -1)


class _Ends:
    """Nodes grouped (by rank and kind, or by track) and, within a group, in (end, start,
    event_id) order, to find for many nodes at once the one that ended last by a given time."""

    def __init__(self, group: np.ndarray, w: "_Window", in_order: bool = False):
        # sorted position → node (``in_order``: the window's rows are in that order already)
        self.order = np.arange(len(group)) if in_order else np.lexsort((w.eid, w.s, w.e, group))
        self.at = np.empty_like(self.order)  # node → sorted position
        self.at[self.order] = np.arange(len(self.order))
        self.group = group[self.order]
        # (group, end) as one sortable int: the end's rank among the window's distinct ends
        self._values = w.ends
        self._m = len(w.ends) + 1
        self._keys = self.group * self._m + np.searchsorted(w.ends, w.e[self.order]) + 1

    def last_by(self, group: np.ndarray, t: np.ndarray, before: np.ndarray | None = None) -> np.ndarray:
        """Per query k: the node of group[k] ending last at or before t[k] (-1 if none); with
        `before`, only among the nodes sorted before position before[k] (a member's own position:
        so a zero-length node never precedes itself or a tie after it)."""
        k = np.searchsorted(self._keys, group * self._m + np.searchsorted(self._values, t, "right"), "right")
        if before is not None:
            k = np.minimum(k, before)
        found = k > np.searchsorted(self.group, group)  # some member of the group before k
        return np.where(found, self.order[k - 1], -1)


class _Window:
    """Every rank's nodes of one window (the module docstring's columns as numpy arrays, a row per
    node, the rows in (rank, track, end, start, event_id) order, tid standing for the track; and
    launch_row, arrival_row: the row of each node's launch call and last arrival, -1 for none)
    and each node's predecessors: the candidates of every edge rule, and the one the walk takes
    when nothing on the path rules it out (the latest ready, then _PRIORITY, then rule order)."""

    RULES = 7  # columns of pred / ready / kind

    def __init__(self, t: dict):
        self.rank, self.eid, self.gpu = t["rank"], t["event_id"], t["gpu"]
        self.s, self.e, self.cls = t["ts_ns"], t["end_ns"], t["class"]
        n = len(self.s)
        rows = np.arange(n)
        new_rank = np.r_[True, self.rank[1:] != self.rank[:-1]] if n else np.zeros(0, bool)
        rank_no = np.cumsum(new_rank) - 1
        track = np.cumsum(new_rank | np.r_[True, t["tid"][1:] != t["tid"][:-1]][:n]) - 1
        self.ends = _distinct(self.e)
        pred = np.full((self.RULES, n), -1, np.int64)
        kind = np.zeros((self.RULES, n), np.int8)
        ready = np.zeros((self.RULES, n), np.int64)
        s, e, gpu = self.s, self.e, self.gpu

        def put(col, ok, j, r, k):
            pred[col] = np.where(ok, j, -1)
            ready[col] = np.where(ok, r, 0)
            kind[col] = k

        # inferred (cross_stream on the GPU, host on the CPU): the node of the rank's same kind
        # (any stream / thread) that ended last at or before the start
        kinds = _Ends(rank_no * 2 + gpu, self)
        j = kinds.last_by(rank_no * 2 + gpu, s, kinds.at)
        put(0, j >= 0, j, e[j], np.where(gpu, _CROSS, _HOST))
        # thread order: the node of the CPU thread ending last at or before the start
        tracks = _Ends(track, self, in_order=True)  # the rows: by (rank, track, end, start, event_id)
        j = tracks.last_by(track, s, tracks.at)
        put(1, ~gpu & (j >= 0), j, e[j], _THREAD)
        # stream order: the op before by start (ready at its end, or this op's start: PDL)
        g = np.flatnonzero(gpu)
        g = g[np.lexsort((self.eid[g], s[g], track[g]))]
        same = track[g][1:] == track[g][:-1]
        j = np.full(n, -1, np.int64)
        j[g[1:][same]] = g[:-1][same]
        put(2, j >= 0, j, np.minimum(e[j], s), _STREAM)
        # launch: the runtime call, unless it returned only after the op ended (it waited for it)
        k = t["launch_row"]
        ok = gpu & (k >= 0) & (k != rows)
        ok &= ~self._blocking(k, rows)
        put(3, ok, k, np.minimum(e[k], s), _LAUNCH)
        # synchronization: a sync call waits for the rank's GPU op that ended last by its end
        j = kinds.last_by(rank_no * 2 + 1, e)
        put(4, ~gpu & (self.cls == _SYNC) & (j >= 0) & (e[j] > s), j, e[j], _EDGE_SYNC)
        # ... and a blocking call for its own GPU op (the one ending last, latest row on ties)
        ops = np.flatnonzero(gpu & (k >= 0))
        ops = ops[np.lexsort((ops, e[ops], k[ops]))]
        last = np.r_[k[ops][1:] != k[ops][:-1], True] if len(ops) else np.zeros(0, bool)
        j = np.full(n, -1, np.int64)
        j[k[ops][last]] = ops[last]
        put(5, ~gpu & (j >= 0) & self._blocking(rows, j), j, e[j], _EDGE_SYNC)
        # collective: the last arrival's span, at its start
        j = t["arrival_row"]
        put(6, j >= 0, j, t["last_ns"], _COLLECTIVE)
        self.pred, self.ready, self.kind = pred, ready, kind
        # the walk's usual choice: latest ready, then priority; the first rule on full ties
        b_pred, b_ready, b_kind = pred[0].copy(), ready[0].copy(), kind[0].copy()
        b_prio = _PRIORITY[b_kind]
        for col in range(1, self.RULES):
            c_ready, c_prio = ready[col], _PRIORITY[kind[col]]
            better = (pred[col] >= 0) & ((b_pred < 0) | (c_ready > b_ready) | ((c_ready == b_ready) & (c_prio > b_prio)))
            b_pred[better], b_ready[better], b_kind[better], b_prio[better] = (
                pred[col][better], c_ready[better], kind[col][better], c_prio[better])
        self.usual = (b_pred, b_ready, b_kind)
        self._best = None
        # each rank's start: its node ending last (latest start, then latest row, on ties)
        by_end = np.lexsort((rows, s, e, rank_no))
        self.starts = by_end[np.r_[rank_no[by_end][1:] != rank_no[by_end][:-1], True]] if n else by_end

    @property
    def best(self) -> tuple[list, list, list]:
        """The walk's usual choice per node (``usual``: predecessor, ready time, edge kind) as
        Python lists, for :func:`walk`."""
        if self._best is None:
            self._best = tuple(a.tolist() for a in self.usual)
        return self._best

    def _blocking(self, call: np.ndarray, op: np.ndarray) -> np.ndarray:
        """Whether launch call `call` returned only after its GPU op `op` ended (a blocking
        cudaMemcpy, pageable cudaMemcpyAsync): then op → call is an edge and call → op is not.
        Rows of -1 answer False."""
        ok = (call >= 0) & (op >= 0)
        c, o = np.where(ok, call, 0), np.where(ok, op, 0)
        return ok & (self.s[c] < self.e[o]) & (self.e[o] <= self.e[c])

    def choose(self, i: int, cursor: int, seen: set) -> tuple[int, int, int]:
        """(node, ready, kind) of node i's predecessor ready latest by `cursor` and not on the
        path yet (ties: _PRIORITY, then rule order); node -1 when none is left."""
        best = (-1, 0, _END)
        for col in range(self.RULES):
            j, r, k = int(self.pred[col, i]), int(self.ready[col, i]), int(self.kind[col, i])
            if j >= 0 and r <= cursor and j not in seen and (
                    best[0] < 0 or (r, _PRIORITY[k]) > (best[1], _PRIORITY[best[2]])):
                best = (j, r, k)
        return best


def walk(w: _Window, start: int, end: int) -> tuple[list[int], list[int], list[int]]:
    """The critical path ending at node `start` (its end `end`), walked backward: the nodes, the
    ready time through which each was entered from its predecessor (the cursor: the walk moves it
    there) and the kind of that edge (_END for the first node, whose ready time is its credited
    start, filled in by :func:`_credit`), latest node first."""
    pred, ready, kind = w.best
    nodes, readies, kinds = [], [], []
    seen: set[int] = set()
    i, cursor = start, end
    while True:
        seen.add(i)
        j, r, k = pred[i], ready[i], kind[i]
        if j >= 0 and (r > cursor or j in seen):
            j, r, k = w.choose(i, cursor, seen)
        nodes.append(i)
        if j < 0:
            readies.append(cursor)
            kinds.append(_END)
            return nodes, readies, kinds
        readies.append(r)
        kinds.append(k)
        cursor, i = r, j


def walks(w: _Window) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's critical path of the window (one per node of ``w.starts``, in that order):
    (nodes, ready times, edge kinds: :func:`walk`'s three lists of each path, concatenated;
    the paths' lengths), int64 arrays.

    The same paths as :func:`walk` from each start, computed as arrays where the walk only follows
    each node's usual choice (``w.usual``): that is a chain in the graph where every node points
    to its usual predecessor, so the chain of every start is listed at once by pointer doubling
    (round k adds the nodes 2^k to 2^(k+1) − 1 steps back, from the 2^k-th predecessor of every
    node, itself squared each round). The walk leaves the usual choice only where its ready time
    is after the cursor (the ready time of the edge the walk came through; checked on the listed
    chain, in order) or its node is on the path already (then the chain loops: a node whose
    2^k-th predecessor still exists once 2^k ≥ the nodes is on or leads into a loop); a path
    with either is walked by :func:`walk`. Memory: the window's nodes and the paths' nodes, a few
    int64 each."""
    bp, br, bk = w.usual
    starts = np.asarray(w.starts, np.int64)
    n, k = len(bp), len(starts)
    if not k:
        e = np.zeros(0, np.int64)
        return e, e, e, e
    jump = np.append(np.where(bp >= 0, bp, n), n)  # node → its usual predecessor; n: none (absorbing)
    # loops: a node whose chain is still going after n steps
    far, hops = jump, 1
    while hops < n and np.any(far[starts] != n):
        far, hops = far[far], hops * 2
    loops = far[starts] != n
    # every start's chain, by pointer doubling: (path, position, node) entries
    path = np.flatnonzero(~loops)
    pos, node = np.zeros(len(path), np.int64), starts[path]
    step = jump
    hops = 1
    while True:
        nxt = step[node]
        more = nxt != n
        if not more.any():
            break
        path, pos, node = (np.concatenate((path, path[more])), np.concatenate((pos, pos[more] + hops)),
                           np.concatenate((node, nxt[more])))
        step, hops = step[step], hops * 2
    order = np.lexsort((pos, path))
    path, pos, node = path[order], pos[order], node[order]
    lengths = np.bincount(path, minlength=k).astype(np.int64)
    first = pos == 0
    ready = br[node]
    # the cursor at each node: the path's end at the first, else the ready time walked through
    cursor = np.where(first, w.e[starts[path]], np.r_[0, ready[:-1]])
    last = np.r_[first[1:], True] if len(node) else first
    bad = np.zeros(k, bool)
    bad[path[(bp[node] >= 0) & (ready > cursor)]] = True
    bad |= loops
    readies = np.where(last, cursor, ready)
    kinds = np.where(last, _END, bk[node]).astype(np.int64)
    if not bad.any():
        return node, readies, kinds, lengths
    # the paths the walk leaves the usual choice on, walked one by one
    cuts = np.cumsum(lengths)[:-1]
    pieces = [list(x) for x in zip(np.split(node, cuts), np.split(readies, cuts), np.split(kinds, cuts))]
    for i in np.flatnonzero(bad):
        pieces[i] = [np.array(x, np.int64) for x in walk(w, int(starts[i]), int(w.e[starts[i]]))]
        lengths[i] = len(pieces[i][0])
    return (*(np.concatenate([p[c] for p in pieces]) for c in range(3)), lengths)


def _credit(w: _Window, ranks: np.ndarray, nodes: np.ndarray, readies: np.ndarray, kinds: np.ndarray,
            lengths: np.ndarray) -> dict:
    """The paths of one window (concatenated walks, latest node first; ranks: each path's rank,
    lengths: its nodes) credited: per node on_path_ns and gap_ns; per path the PARTS and start."""
    first = np.cumsum(lengths) - lengths
    path = np.repeat(np.arange(len(lengths)), lengths)
    starts = w.e[nodes[first]]
    # the cursor when a node is reached: the path's end, then its successor's ready time
    cursor = np.r_[0, readies[:-1]] if len(readies) else readies.copy()
    cursor[first] = starts
    s = w.s[nodes]
    seg = np.minimum(np.where(kinds == _END, s, np.maximum(s, readies)), cursor)
    ready = np.where(kinds == _END, seg, readies)
    on_path, gap = cursor - seg, seg - ready
    own = w.rank[nodes] == ranks[path]
    gap_part = np.where((kinds == _THREAD) | (kinds == _HOST), _LAUNCH_CPU, _IDLE)
    parts = np.zeros((len(lengths), len(PARTS)), np.int64)
    np.add.at(parts, (path, np.where(own, _CLASS_PART[w.cls[nodes]], _STRAGGLER)), on_path)
    np.add.at(parts, (path, np.where(own, gap_part, _STRAGGLER)), gap)
    return {"path": path, "first": first, "on_path": on_path, "gap": gap, "parts": parts,
            "start_ns": ready[first + lengths - 1], "end_ns": starts}




def window(c: dict) -> tuple[_Window, np.ndarray]:
    """(_Window of one window's nodes, the position in ``c`` of each of its rows): ``c`` holds the
    nodes' columns (module docstring) in any order; the _Window's rows are in (rank, track, end,
    start, event_id) order."""
    order = np.lexsort((c["event_id"], c["ts_ns"], c["end_ns"], c["tid"], c["rank"]))
    c = {k: np.asarray(v)[order] for k, v in c.items()}
    rows = _Rows(c["rank"], c["event_id"])
    cols = {"rank": c["rank"].astype(np.int64), "event_id": c["event_id"], "gpu": c["gpu"], "tid": c["tid"],
            "ts_ns": c["ts_ns"], "end_ns": c["end_ns"], "class": c["class"], "last_ns": c["last_ns"],
            "launch_row": rows.find(c["rank"], c["launch"], c["launched"]),
            "arrival_row": rows.find(c["last_rank"], c["last_eid"], c["arrived"])}
    return _Window(cols), order


def paths(w: _Window) -> dict:
    """Every rank's critical path of the window ``w`` (:func:`walks`, credited by :func:`_credit`),
    as arrays. Per path row, earliest event first within each path, paths in ``w.starts`` order:
    ``rank`` (the path's rank), ``pos`` (0 = earliest), ``node`` (the _Window row of its event),
    ``on_path``, ``gap`` (ns) and ``edge`` (code into KINDS: how the next event depends on this one;
    'end' for the last). Per path: ``path_rank``, ``start_ns``, ``end_ns``, ``parts`` (paths × PARTS,
    ns), ``lengths`` (its events) and ``other_ranks`` (distinct ranks other than its own on it)."""
    nodes, readies, kinds, lengths = walks(w)
    ranks = w.rank[w.starts]
    c = _credit(w, ranks, nodes, readies, kinds, lengths)
    # rows earliest first: each walk reversed; a node's edge is the kind of its successor's edge
    # (the node walked before it), 'end' for the last
    path = c["path"]
    back = np.arange(len(nodes)) - c["first"][path]  # position in the walk
    rev = (c["first"] + lengths - 1)[path] - back
    edge = np.where(back == 0, _END, np.r_[_END, kinds[:-1]])
    k = len(lengths)
    ev_rank = w.rank[nodes]
    ranks_seen = _distinct(ev_rank)  # distinct (path, event rank) pairs, as one int
    pairs = _distinct(path * len(ranks_seen) + np.searchsorted(ranks_seen, ev_rank))
    p_of = pairs // max(len(ranks_seen), 1)
    others = np.bincount(p_of[ranks_seen[pairs % max(len(ranks_seen), 1)] != ranks[p_of]], minlength=k)
    return {"rank": ranks[path], "pos": back, "node": nodes[rev], "on_path": c["on_path"][rev],
            "gap": c["gap"][rev], "edge": edge[rev], "path_rank": ranks, "start_ns": c["start_ns"],
            "end_ns": c["end_ns"], "parts": c["parts"], "lengths": lengths, "other_ranks": others}


KINDS = _KINDS
"""The edge kinds by code (critical_path.edge), 'end' first (no edge)."""
