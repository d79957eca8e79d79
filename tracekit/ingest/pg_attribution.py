"""Process groups of gloo (CPU) calls whose trace names none.

torch's CPU traces (2.13, gloo) record no ``Process Group Name`` on the ``c10d::*`` ops, and a
send/recv's peer only as a *group* rank, yet ``distributedInfo.pg_config`` lists every group a
rank is in (name, desc, global ranks). Without a group the ingest would number every call of a
rank in one sequence, and (process group, seq) matching across ranks would pair a TP all-reduce
with a DP one. This module, run once over all ranks' collectives rows before the clock alignment
and the matching, puts each such call in the one group the evidence allows, or leaves it
unassigned (``pg_name``, ``pg_ranks`` and ``seq`` null: never matched) and counts it in the
rank's warnings. Nothing is guessed: a group is assigned only when every other candidate has been
ruled out by one of the rules below, each a property of the collectives or of gloo (rule 4 also
of how Linux numbers threads), or named by the job itself (rule 0).

0. *The trace names it*: a profiler range ``tracekit.process_group:<pg_name>`` (:data:`LABEL_PREFIX`)
   enclosing the issuing ``c10d::*`` call on its thread (the innermost one;
   ``attribute._group_labels``) makes that group the call's only candidate (for a send/recv,
   the peer is that group's rank k). The job records it: tracekit's collectors wrap every
   ``torch.distributed`` call on gloo in it (``tracekit.collectors.pg_labels``, which a user's job
   can install too). Why it is needed: the timing rules below cannot separate two groups whose
   members run calls of one signature at the same time (EP × DP: ranks 0 and 1's DP all-reduces
   overlap each other and those of 2 and 3, so EP {0,1} explains them as well as DP {0,2});
   gloo's worker threads would (each ``ProcessGroupGloo`` runs 2 per device), but the trace
   records neither a group's thread count nor its devices. A range naming a group that does not
   hold the rank is ignored (the call is attributed as if unlabelled) and the rank warned; the
   rules below still apply to labelled calls, so evidence that contradicts a range (rule 1, 3,
   5) leaves the call unassigned. A trace without ranges is attributed by rules 1-5 alone.

Collectives (every op but send/recv). Candidates: the groups of ``pg_config`` of two or more
ranks that hold the calling rank (rule 0: the group named); for an all-to-all whose splits the
trace records, only those of as many ranks as it has splits. A call's signature is (op, bytes),
an all-to-all's its op only (uneven splits: each rank sends its own bytes). Then, until nothing
changes:

1. *Same clock* (only when the ranks share one: ``align`` none): for an op whose every output
   depends on every member's input (all-reduce, all-gather, reduce-scatter, all-to-all, barrier),
   no member can finish it before every other member has started it, so a call on rank r can be
   in group G only if every other member of G has a call of the same signature, still possibly
   in G, whose interval [ts, ts + dur] intersects r's (for an all-to-all, also one whose splits
   agree: what r sends that member is what the member receives from r, and the reverse).
2. *Counts*: every member of G issues the same calls on G, so for each (G, signature) the count
   N lies between the largest number of calls certainly in G on one member and the smallest
   number possibly in G. Where those meet, N is known: on a member with exactly N possible
   calls they are all in G; on a member with N certain ones the others are not.
3. *Worker threads*: a ``ProcessGroupGloo`` runs its collectives on its own worker threads, so
   the calls whose ``gloo:*`` span is on one thread are in one group (candidates intersected).
4. *Creation order*: gloo starts a group's worker threads when the group is created, groups are
   created in the order of their (numeric) pg_name, and Linux gives threads increasing ids, so a
   thread of an earlier group has a smaller id than every thread of a later one (only applied
   when all names are numbers; a thread-id wraparound while the groups are created would break
   it, which rule 5 may then catch as disagreeing sequences).

5. *Check*: the calls assigned to G must form the same sequence of signatures on every member
   (in issue order); otherwise all of G's calls are unassigned and the rank is warned.

Send/recv: the trace's peer argument k is a group rank; the candidate peers are ``G.ranks[k]``
for the rank's groups G (k in range, not the rank itself). A send from r to p needs a recv on p
of the same bytes and tag whose candidates include r (and the reverse); rule 2 applies to each
directed pair and (bytes, tag). A unique peer names the pair group ``p2p:src->dst`` as before.

A rank whose only group is the default one (or a trace without ``pg_config``) keeps today's
assignment: every call in group "0"/"default". So does an unlabelled call none of whose candidate
groups (peers) has every rank ingested (one rank of a large job): nothing can be checked, and the
rank is warned that the default group is unverified; a labelled one goes to the group named.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import pyarrow as pa

# a range named LABEL_PREFIX + a group's name around a c10d call names the call's group (rule 0;
# the ranges tracekit.collectors.pg_labels records; kineto.py keeps their rows)
from tracekit.vocab import LABEL_PREFIX

FACTS = "_pg_facts"
"""Key of the facts dict a gloo row carries from ``attribute._cpu_rows`` to :func:`tap`."""

ALL_DEPENDENT_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
P2P = ("send", "recv")


def row_facts(row: dict, span: dict, issuer: dict | None, resolved: dict) -> None:
    """Record on a gloo collectives ``row`` what attribution needs: whether the trace named its
    group, the thread of its ``gloo:*`` span, and a send/recv's (group-rank peer, tag) args."""
    peer_arg = tag = None
    ci = issuer.get("concrete") if issuer else None
    if isinstance(ci, list) and len(ci) >= 4:
        try:
            peer_arg, tag = int(str(ci[2]).strip()), str(ci[3]).strip()
        except ValueError:
            peer_arg = tag = None
    row[FACTS] = dict(unnamed=resolved.get("pg_name") is None and resolved.get("pg_ranks") is None,
                      trace_seq=resolved.get("seq") is not None, track=span.get("track"),
                      peer_arg=peer_arg, tag=tag, label=issuer.get("pg_label") if issuer else None)


def tap(rows, sink: list):
    """Pass ``rows`` (collectives row dicts, or Arrow tables of rows that carry no facts) through,
    appending each row's facts (or None) to ``sink`` in order."""
    for r in rows:
        if isinstance(r, pa.Table):
            sink.extend([None] * r.num_rows)
        else:
            sink.append(r.pop(FACTS, None))
        yield r


class _Calls:
    """The unnamed calls of the run, flattened: parallel lists indexed by call number."""

    def __init__(self):
        self.rank, self.op, self.size, self.tag, self.t0, self.t1, self.order = [], [], [], [], [], [], []
        self.track, self.where, self.cand = [], [], []  # where: (rank, row index in its table)
        self.splits = []  # all-to-all: (in_splits, out_splits), elements per group rank, or None

    def add(self, rank, i, row, facts, cand):
        self.rank.append(rank)
        self.op.append(row["op"])
        self.size.append(row["size_bytes"])
        self.tag.append(facts.get("tag"))
        self.t0.append(row["ts_ns"])
        self.t1.append(row["ts_ns"] + row["dur_ns"])
        self.order.append((row["issue_ts_ns"], row["ts_ns"], row["event_id"]))
        self.track.append(facts.get("track"))
        self.where.append((rank, i))
        ins, outs = row.get("in_splits"), row.get("out_splits")
        self.splits.append((list(ins), list(outs)) if ins and outs and len(ins) == len(outs) else None)
        if self.splits[-1] is not None:  # rule 0: one split per rank of the group
            cand = [g for g in cand if len(cand[g]) == len(ins)] if isinstance(cand, dict) else cand
        self.cand.append(set(cand))

    def sig(self, i):
        """What every end of one call shares: (op, bytes); an all-to-all's bytes are each rank's own."""
        if self.op[i] in P2P:
            return (self.size[i], self.tag[i])
        return (self.op[i], None) if self.op[i] == "all_to_all" else (self.op[i], self.size[i])

    def splits_agree(self, i, j, members) -> bool:
        """All-to-all i (on rank r) and j (on m) as one call of the group ``members``: what r sends
        m is what m receives from r, and the reverse (true when either has no splits)."""
        a, b = self.splits[i], self.splits[j]
        if a is None or b is None:
            return True
        r, m = members.index(self.rank[i]), members.index(self.rank[j])
        return a[0][m] == b[1][r] and a[1][m] == b[0][r]


def attribute(tables: list, facts: dict, pg_config: dict, *, same_clock: bool):
    """Attribute the unnamed gloo calls of a run (module docstring).

    ``tables``: (rank, COLLECTIVES_SCHEMA table) per rank; ``facts``: rank → the per-row facts
    :func:`tap` collected (None for rows not from a gloo span); ``pg_config``: group name →
    global ranks. Returns (the tables, rank → warnings). Tables of ranks with no unnamed call
    come back unchanged.
    """
    groups = {g: rk for g, rk in pg_config.items() if len(rk) >= 2}
    mine = {r: [g for g, rk in groups.items() if r in rk] for r, _ in tables}
    if not any(len(gs) > 1 for gs in mine.values()):
        return tables, {}
    present = {r for r, _ in tables}
    whole = {g: rk for g, rk in groups.items() if all(m in present for m in rk)}  # rules 1, 2, 5 need all members
    rows = {}
    calls, p2p = _Calls(), _Calls()
    unchecked: dict = defaultdict(int)
    mislabelled: dict = defaultdict(list)  # rank → the labels naming a group that does not hold it
    for r, t in tables:
        fs = facts.get(r) or []
        if not any(f and f["unnamed"] for f in fs):
            continue
        rows[r] = t.to_pylist()
        for i, (row, f) in enumerate(zip(rows[r], fs)):
            if not f or not f["unnamed"] or row["op"] is None:
                continue
            lab = f.get("label")  # rule 0: the trace names it (ignored when it names a group without r)
            if lab is not None and r not in pg_config.get(lab, ()):
                mislabelled[r].append(lab)
                lab = None
            if row["op"] in P2P:
                k = f.get("peer_arg")
                if k is None:
                    continue
                peers = {pg_config[g][k] for g in (mine[r] if lab is None else [lab])
                         if 0 <= k < len(pg_config[g]) and pg_config[g][k] != r}
                if lab is None and len(peers) > 1 and not peers & present:
                    unchecked[r] += 1  # no peer's trace to check against: today's row stays
                    continue
                p2p.add(r, i, row, f, peers)
            elif lab is not None:
                calls.add(r, i, row, f, {lab: pg_config[lab]})  # a 1-rank group too
            elif len(mine[r]) > 1 and not any(g in whole for g in mine[r]):
                unchecked[r] += 1
            else:
                calls.add(r, i, row, f, {g: groups[g] for g in mine[r]})
    _solve_collectives(calls, groups, whole, same_clock)
    bad_groups = _check_sequences(calls, whole)
    _solve_p2p(p2p, present)
    warnings: dict = defaultdict(list)
    unassigned: dict = defaultdict(int)
    for i, (r, j) in enumerate(calls.where):
        row, c = rows[r][j], calls.cand[i]
        if len(c) == 1 and not (c & bad_groups):
            (g,) = c
            row.update(pg_name=g, pg_ranks=list(pg_config[g]), group_size=len(pg_config[g]), seq=None,
                       k_source="membership")
        else:
            sizes = {len(pg_config[g]) for g in c}
            k = sizes.pop() if len(sizes) == 1 else None
            row.update(pg_name=None, pg_ranks=None, seq=None, group_size=k, k_source="membership" if k else None)
            unassigned[r] += 1
    for i, (r, j) in enumerate(p2p.where):
        row, c = rows[r][j], p2p.cand[i]
        if len(c) == 1:
            (peer,) = c
            src, dst = (r, peer) if row["op"] == "send" else (peer, r)
            row.update(peer=peer, pg_name=f"p2p:{src}->{dst}", pg_ranks=[src, dst], group_size=2, seq=None,
                       k_source="metadata")
        else:
            row.update(peer=None, pg_name=None, pg_ranks=None, seq=None)
            unassigned[r] += 1
    for g in sorted(bad_groups):
        for r in groups[g]:
            warnings[r].append(f"process group {g}: its members' calls, as attributed, do not form one sequence")
    for r, labs in mislabelled.items():
        warnings[r].append(
            f"{len(labs)} gloo call(s) inside a process-group range naming a group missing from this rank's pg_config "
            f"({', '.join(LABEL_PREFIX + g for g in sorted(set(labs)))}): the range is ignored, as if absent")
    for r, n in unchecked.items():
        warnings[r].append(
            f"{n} gloo call(s) without a process group in the trace stay in the default group (send/recv: peers "
            "numbered in it), unverified: the other ranks of the groups they may belong to were not ingested")
    for r, n in unassigned.items():
        warnings[r].append(
            f"{n} gloo call(s) without a process group in the trace could not be put in one group "
            "unambiguously: left unassigned (no pg_name, not matched across ranks)")
    out = []
    for r, t in tables:
        if r in rows:
            t = pa.Table.from_pylist(rows[r], schema=t.schema)
            need = [f is not None and not f["trace_seq"] and row["op"] is not None and row["pg_name"] is not None
                    for f, row in zip(facts[r], rows[r])]
            from tracekit.ingest.seq import number_seq

            t = number_seq(t, pa.array(need, pa.bool_()).to_numpy(zero_copy_only=False))
        out.append((r, t))
    return out, dict(warnings)


def _solve_collectives(c: _Calls, groups: dict, whole: dict, same_clock: bool) -> None:
    n = len(c.rank)
    if not n:
        return
    by_rank_sig = defaultdict(list)
    for i in range(n):
        by_rank_sig[(c.rank[i], c.sig(i))].append(i)
    for ids in by_rank_sig.values():
        ids.sort(key=lambda i: c.t0[i])
    starts = {k: [c.t0[i] for i in ids] for k, ids in by_rank_sig.items()}
    longest = {k: max(c.t1[i] - c.t0[i] for i in ids) for k, ids in by_rank_sig.items()}
    numeric = all(str(g).isdigit() for g in groups)
    changed = True
    while changed:
        changed = False
        if same_clock:
            for i in range(n):
                if c.op[i] not in ALL_DEPENDENT_OPS:
                    continue
                for g in list(c.cand[i] & whole.keys()):
                    if not all(_overlapping(c, by_rank_sig, starts, longest, i, m, g, groups)
                               for m in groups[g] if m != c.rank[i]):
                        c.cand[i].discard(g)
                        changed = True
        for g, members in whole.items():
            for sig in {c.sig(i) for i in range(n) if g in c.cand[i]}:
                sides = [([i for i in by_rank_sig.get((m, sig), ()) if g in c.cand[i]], g) for m in members]
                changed |= _force_counts(c.cand, sides)
        changed |= _same_thread(c)
        if numeric:
            changed |= _creation_order(c)


def _overlapping(c, by_rank_sig, starts, longest, i, m, g, groups) -> bool:
    """Whether rank m has a call of i's signature, possibly in g, whose interval meets i's (and,
    for an all-to-all, whose splits agree with i's as members of g)."""
    key = (m, c.sig(i))
    ids = by_rank_sig.get(key)
    if not ids:
        return False
    k = bisect.bisect_left(starts[key], c.t1[i])  # calls starting before i ends
    lo = c.t0[i] - longest[key]
    while k > 0:
        k -= 1
        j = ids[k]
        if c.t0[j] < lo:
            break
        if c.t1[j] > c.t0[i] and g in c.cand[j] and c.splits_agree(i, j, groups[g]):
            return True
    return False


def _force_counts(cand: list, sides: list[tuple[list[int], object]]) -> bool:
    """Rule 2 for one group (or directed pair) and signature: ``sides`` = per member, (its calls
    still possibly in the group, the label they carry for it: the group, or the pair's other end).
    Returns whether a candidate set changed."""
    sure = max(sum(len(cand[i]) == 1 for i in ids) for ids, _ in sides)
    poss = min(len(ids) for ids, _ in sides)
    if sure != poss:
        return False
    changed = False
    for ids, label in sides:
        for i in ids:
            if len(ids) == poss and cand[i] != {label}:
                cand[i].clear()
                cand[i].add(label)
                changed = True
            elif len(ids) != poss and len(cand[i]) > 1:
                cand[i].discard(label)
                changed = True
    return changed


def _same_thread(c: _Calls) -> bool:
    """Rule 3: the calls of one (rank, worker thread) share their candidates."""
    changed = False
    by_thread = defaultdict(list)
    for i, tr in enumerate(c.track):
        if tr is not None:
            by_thread[(c.rank[i], tr)].append(i)
    for ids in by_thread.values():
        common = set.intersection(*(c.cand[i] for i in ids))
        for i in ids:
            if c.cand[i] != common:
                c.cand[i] = set(common)
                changed = True
    return changed


def _creation_order(c: _Calls) -> bool:
    """Rule 4: per rank, a thread certainly in group H bounds the groups of the other threads:
    a thread with a larger id is in H or a later group, one with a smaller id in H or an earlier."""
    changed = False
    sure = defaultdict(dict)  # rank → thread id → group number
    for i, tr in enumerate(c.track):
        if isinstance(tr, int) and len(c.cand[i]) == 1:
            sure[c.rank[i]][tr] = int(next(iter(c.cand[i])))
    for i, tr in enumerate(c.track):
        known = sure.get(c.rank[i])
        if not isinstance(tr, int) or not known or len(c.cand[i]) < 2:
            continue
        for g in list(c.cand[i]):
            gn = int(g)
            if any((h > gn and t < tr) or (h < gn and t > tr) for t, h in known.items()):
                c.cand[i].discard(g)
                changed = True
    return changed


def _check_sequences(c: _Calls, groups: dict) -> set:
    """Rule 5: the groups whose members' assigned calls differ as sequences of signatures."""
    seqs = defaultdict(lambda: defaultdict(list))
    for i in sorted(range(len(c.rank)), key=lambda i: c.order[i]):
        if len(c.cand[i]) == 1:
            seqs[next(iter(c.cand[i]))][c.rank[i]].append(c.sig(i))
    bad = set()
    for g, per in seqs.items():
        if g not in groups:  # a labelled group not every member of which was ingested: no check
            continue
        got = [per.get(m, []) for m in groups[g]]
        if any(s != got[0] for s in got):
            bad.add(g)
    return bad


def _solve_p2p(c: _Calls, present: set) -> None:
    n = len(c.rank)
    if not n:
        return
    by = defaultdict(list)  # (rank, op, sig) → calls
    for i in range(n):
        by[(c.rank[i], c.op[i], c.sig(i))].append(i)
    other = {"send": "recv", "recv": "send"}
    changed = True
    while changed:
        changed = False
        for i in range(n):
            for p in list(c.cand[i] & present):
                if not any(c.rank[i] in c.cand[j] for j in by.get((p, other[c.op[i]], c.sig(i)), ())):
                    c.cand[i].discard(p)
                    changed = True
        pairs = {(c.rank[i], p, c.sig(i)) for i in range(n) if c.op[i] == "send" for p in c.cand[i] & present}
        for src, dst, sig in pairs:
            sends = [i for i in by.get((src, "send", sig), ()) if dst in c.cand[i]]
            recvs = [i for i in by.get((dst, "recv", sig), ()) if src in c.cand[i]]
            changed |= _force_counts(c.cand, [(sends, dst), (recvs, src)])
