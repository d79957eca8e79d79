"""hang_instances, hang_divergence: where the ranks of a hung (or desynchronised) job parted ways,
from their Flight Recorder dumps (the fr_entries / fr_groups / fr_dumps tables) — a Python analysis.

Reads: runs, fr_entries, fr_groups, fr_dumps, process_groups, collectives

Placing the hang on the Kineto timeline (a run that has both): Flight Recorder times are each rank's
wall clock; the store's ts_ns are the traces' clock. One offset (wall − trace clock) is estimated
from the run's collectives by an independent route: for every rank, every pair of a Kineto
collective call (collectives.issue_ts_ns) and a Flight Recorder entry of the same process group
and op gives a candidate offset; the true one is where most candidates agree — the densest
window of TIMELINE_TOL_NS — and its median is taken (at least two pairs, and half the Kineto calls
that have a candidate, must agree; it assumes the ranks' wall clocks agree, as on one host). timeline_ts_ns = first_created_ns − that offset.

Entries are matched across ranks by (process group, collective_seq_id), the key tracekit uses for
every collective (collectives' (pg_name, seq)); p2p entries (is_p2p, collective_seq_id 0) are
left out. A group's members are, in order: the ranks a dump's pg_config or tracekit's agent names
(fr_groups); for the default group ("default_pg" or pg_name '0') every rank of runs.world_size;
else the ranks that have any entry of the group (members_source says which). For each
instance and member rank:

- *arrived*: the rank recorded the instance;
- *unknown*: the rank left no dump, or its ring buffer no longer holds that point (its oldest entry
  of the group has a higher seq, or it has none of the group and its oldest entry is newer than
  the instance's first arrival);
- *missing*: otherwise (the rank never issued it: it was elsewhere).

The classification follows torchfrtrace's order of checks (torch 2.13,
``torch/distributed/flight_recorder/components/utils.py``, ``match_one_event`` and
``error_analysis``): missing ranks, then op (``collective type``), then sizes (input and output
shapes; not compared for all_to_all, gather and scatter, whose shapes differ by rank), then dtypes,
then state (scheduled / started / completed). A mismatch names as culprits the ranks outside the
largest group of agreeing ranks; on a tie, the ranks that differ from the lowest rank
(culprit_basis says which; with two ranks a tie is the rule, and the lowest rank is presumed right).

hang_instances: one row per (run, process group, collective seq) that at least one rank recorded.

run_id          VARCHAR    run
pg_name         VARCHAR    process group name ('0' = the default group)
pg_desc         VARCHAR    its description as recorded ('default_pg', 'undefined', a group_desc)
seq             BIGINT     collective_seq_id (per group, from 1)
op              VARCHAR    the op most arrived ranks recorded (the lowest rank's on a tie)
members         INTEGER[]  the group's global ranks (see above), sorted
members_source  VARCHAR    fr_groups / world / entries
arrived_ranks   INTEGER[]  ranks that recorded it, sorted
missing_ranks   INTEGER[]  ranks that never issued it, sorted
unknown_ranks   INTEGER[]  ranks whose dump cannot say (no dump, or evicted from the ring), sorted
match_state     VARCHAR    fully_matched / missing_ranks / op_mismatch / size_mismatch / dtype_mismatch / state_mismatch
culprit_ranks   INTEGER[]  the ranks that diverge (the missing ones, or the minority); empty when matched
culprit_basis   VARCHAR    missing / majority / tie (differs from the lowest rank); NULL when matched
detail          VARCHAR    what differs, e.g. "rank 1: broadcast where ranks 0 have all_reduce"; NULL when matched
first_created_ns BIGINT    earliest time_created_ns over arrived ranks (wall clock ns)
last_created_ns BIGINT     latest time_created_ns over arrived ranks (wall clock ns)

hang_divergence: one row per run with Flight Recorder entries: the first instance (earliest
first_created_ns, then pg_name, seq) whose match_state is not fully_matched, or a fully_matched
row with NULL details when every instance matched.

run_id             VARCHAR    run
match_state        VARCHAR    as hang_instances; fully_matched when nothing diverged
pg_name            VARCHAR    the diverging instance's group; NULL when nothing diverged
pg_desc            VARCHAR    its description
dimension          VARCHAR    tp / pp / dp / ep / cp from the group's description or process_groups; NULL when not known
seq                BIGINT     its collective seq
op                 VARCHAR    its op (the majority's)
culprit_ranks      INTEGER[]  as hang_instances
culprit_basis      VARCHAR    as hang_instances
detail             VARCHAR    as hang_instances
culprit_rank       INTEGER    the lowest culprit rank
culprit_last_pg    VARCHAR    that rank's last recorded entry: its group
culprit_last_seq   BIGINT     … its collective seq
culprit_last_op    VARCHAR    … its op
culprit_last_state VARCHAR    … its state
culprit_last_frame VARCHAR    … its innermost stack frame outside torch ("function file:line"); NULL when no stack was dumped
waiting_ranks      INTEGER[]  the ranks that issued the instance (arrived), culprits excepted, sorted
waited_ns          BIGINT     longest wait, an upper bound: max over waiting ranks of the time from issuing it to the rank's next recorded call, or to its dump when it issued none after (gloo leaves every state 'scheduled', so nothing finer is known); NULL when neither time is known
ranks_without_dump INTEGER[]  ranks 0..world_size−1 that left no dump
mismatched         BIGINT     instances of the run whose match_state is not fully_matched
instances          BIGINT     instances of the run (hang_instances rows)
timeline_ts_ns     BIGINT     the diverging instance's first arrival on the store's clock (the Kineto timeline), ns; NULL without Kineto collectives to align on, or when nothing diverged
timeline_offset_ns BIGINT     the offset used: Flight Recorder wall clock − store clock, ns; NULL when it cannot be estimated
timeline_pairs     BIGINT     the (Kineto call, Flight Recorder entry) pairs that agreed on it (0: not estimated)
"""

from __future__ import annotations

from collections import Counter, defaultdict

_NO_SIZE_CHECK = {"all_to_all", "gather", "scatter"}
_STATE_ORDER = {"scheduled": 0, "started": 1, "completed": 2}
_DIMS = {"tp", "pp", "dp", "ep", "cp"}

INSTANCE_COLS = [
    ("run_id", "VARCHAR"), ("pg_name", "VARCHAR"), ("pg_desc", "VARCHAR"), ("seq", "BIGINT"), ("op", "VARCHAR"),
    ("members", "INTEGER[]"), ("members_source", "VARCHAR"), ("arrived_ranks", "INTEGER[]"),
    ("missing_ranks", "INTEGER[]"), ("unknown_ranks", "INTEGER[]"), ("match_state", "VARCHAR"),
    ("culprit_ranks", "INTEGER[]"), ("culprit_basis", "VARCHAR"), ("detail", "VARCHAR"),
    ("first_created_ns", "BIGINT"), ("last_created_ns", "BIGINT"),
]
DIVERGENCE_COLS = [
    ("run_id", "VARCHAR"), ("match_state", "VARCHAR"), ("pg_name", "VARCHAR"), ("pg_desc", "VARCHAR"),
    ("dimension", "VARCHAR"), ("seq", "BIGINT"), ("op", "VARCHAR"), ("culprit_ranks", "INTEGER[]"),
    ("culprit_basis", "VARCHAR"), ("detail", "VARCHAR"), ("culprit_rank", "INTEGER"), ("culprit_last_pg", "VARCHAR"),
    ("culprit_last_seq", "BIGINT"), ("culprit_last_op", "VARCHAR"), ("culprit_last_state", "VARCHAR"),
    ("culprit_last_frame", "VARCHAR"), ("waiting_ranks", "INTEGER[]"), ("waited_ns", "BIGINT"),
    ("ranks_without_dump", "INTEGER[]"), ("mismatched", "BIGINT"), ("instances", "BIGINT"),
    ("timeline_ts_ns", "BIGINT"), ("timeline_offset_ns", "BIGINT"), ("timeline_pairs", "BIGINT"),
]

TIMELINE_TOL_NS = 200_000
"""Width of the window in which candidate offsets must agree, ns: Flight Recorder stamps a call when
the backend's work is created, Kineto when the op starts (tens of µs apart), while consecutive
collectives of a rank are rarely this close with the same gaps on every rank."""

MAX_PAIR_CALLS = 64
"""Kineto calls per rank (the last ones) used for the offset, to bound the pairs."""


def timeline_offset(kineto: list[tuple], fr: list[tuple], tol_ns: int = TIMELINE_TOL_NS) -> tuple[int | None, int]:
    """(offset ns, pairs that agree) of Flight Recorder wall-clock times against the store's clock
    (module doc); (None, n) when fewer than two pairs, or fewer than half the Kineto calls that have
    a candidate, agree. ``kineto``, ``fr``: (rank, pg_name,
    op, t_ns) rows."""
    import numpy as np

    by_key: dict[tuple, list[int]] = defaultdict(list)
    for r, pg, op, t in fr:
        if t is not None:
            by_key[(r, pg, op)].append(t)
    per_rank: dict[int, list[tuple]] = defaultdict(list)
    for row in kineto:
        if row[3] is not None:
            per_rank[row[0]].append(row)
    diffs, calls = [], 0
    for r, rows in per_rank.items():
        for _r, pg, op, t in sorted(rows, key=lambda x: x[3])[-MAX_PAIR_CALLS:]:
            cand = by_key.get((r, pg, op), ())
            calls += bool(cand)
            diffs.extend(f - t for f in cand)
    if len(diffs) < 2:
        return None, len(diffs)
    d = np.sort(np.asarray(diffs, dtype=np.int64))
    ends = np.searchsorted(d, d + tol_ns, side="right")
    counts = ends - np.arange(len(d))
    i = int(np.argmax(counts))
    n = int(counts[i])
    if n < max(2, (calls + 1) // 2):  # at least two pairs, and half the calls that have a candidate
        return None, n
    return int(np.median(d[i:ends[i]])), n


def _table(con, name: str, cols: list[tuple[str, str]], rows: list[dict]) -> None:
    sel = ", ".join(f'unnest(?::{t}[]) AS "{n}"' for n, t in cols)
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT {sel}", [[r.get(n) for r in rows] for n, _t in cols])


def _split(values: dict[int, object]) -> tuple[object, list[int], str]:
    """(the majority value, the ranks outside it, basis) of rank → value."""
    counts = Counter(values.values())
    top = max(counts.values())
    best = [v for v, c in counts.items() if c == top]
    if len(best) == 1:
        value, basis = best[0], "majority"
    else:
        value, basis = values[min(values)], "tie"
    return value, sorted(r for r, v in values.items() if v != value), basis


def _fmt(ranks) -> str:
    return ", ".join(map(str, sorted(ranks)))


def classify(entries: dict[int, dict], members: list[int], unknown: set[int]) -> dict:
    """match_state, culprit_ranks, culprit_basis, detail and op of one instance: ``entries`` rank →
    its fr_entries row (arrived ranks), ``members`` the group, ``unknown`` the ranks that cannot say."""
    missing = sorted(set(members) - set(entries) - unknown)
    ops = {r: e["op"] for r, e in entries.items()}
    op, _o, _b = _split(ops)
    out = dict(op=op, missing_ranks=missing, culprit_ranks=[], culprit_basis=None, detail=None,
               match_state="fully_matched")
    if missing:
        out.update(match_state="missing_ranks", culprit_ranks=missing, culprit_basis="missing",
                   detail=f"rank(s) {_fmt(missing)} never issued {op} (issued by {_fmt(entries)})")
        return out
    checks = [("op_mismatch", ops, lambda v: str(v))]
    if op not in _NO_SIZE_CHECK:
        checks.append(("size_mismatch", {r: (repr(e["input_sizes"]), repr(e["output_sizes"])) for r, e in entries.items()},
                       lambda v: f"in {v[0]} out {v[1]}"))
    checks.append(("dtype_mismatch", {r: (repr(e["input_dtypes"]), repr(e["output_dtypes"])) for r, e in entries.items()},
                   lambda v: f"in {v[0]} out {v[1]}"))
    for state, values, show in checks:
        value, odd, basis = _split(values)
        if odd:
            agree = sorted(r for r, v in values.items() if v == value)
            what = "; ".join(f"rank {r}: {show(values[r])}" for r in odd)
            out.update(match_state=state, culprit_ranks=odd, culprit_basis=basis,
                       detail=f"{what} where rank(s) {_fmt(agree)} have {show(value)}")
            return out
    states = {r: e["state"] for r, e in entries.items()}
    if len(set(states.values())) > 1:
        low = min(_STATE_ORDER.get(s, -1) for s in states.values())
        odd = sorted(r for r, s in states.items() if _STATE_ORDER.get(s, -1) == low)
        out.update(match_state="state_mismatch", culprit_ranks=odd, culprit_basis="majority",
                   detail="; ".join(f"rank {r}: {states[r]}" for r in sorted(states)))
    return out


def _user_frame(frames) -> str | None:
    if not frames:
        return None
    for f in frames:
        if "/torch/" not in f and "tracekit/collectors/pg_labels.py" not in f:  # torch and tracekit's own wrapper
            return f
    return frames[0]


def triage(run: dict, entries: list[dict], groups: list[dict], dumps: list[dict], dims: dict[str, str],
           kineto: list[tuple] = ()) -> tuple[list[dict], dict]:
    """The hang_instances rows and the hang_divergence row of one run (see the module doc).
    ``run``: {run_id, world_size}; ``entries``/``groups``/``dumps``: its fr_* rows; ``dims``:
    pg_name → dimension from process_groups; ``kineto``: the run's (rank, pg_name, op, issue_ts_ns)
    collectives, to place the divergence on the timeline."""
    rid = run["run_id"]
    dumped = {d["rank"] for d in dumps}
    dumped_at = {d["rank"]: d["dumped_at_ns"] for d in dumps}
    world = run.get("world_size") or (max(dumped) + 1 if dumped else 0)
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for e in entries:
        by_rank[e["rank"]].append(e)
    for r in by_rank:
        by_rank[r].sort(key=lambda e: e["record_id"])
    coll = [e for e in entries if (e["collective_seq_id"] or 0) > 0 and not e["is_p2p"]]
    pgs: dict[str, dict[int, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))  # pg → seq → rank → entry
    desc: dict[str, str] = {}
    for e in coll:
        pgs[e["pg_name"]][e["collective_seq_id"]].setdefault(e["rank"], e)
        desc.setdefault(e["pg_name"], e["pg_desc"])
    named = {g["pg_name"]: sorted(g["ranks"]) for g in groups}
    oldest = {r: min((e["time_created_ns"] or 0) for e in es) for r, es in by_rank.items() if es}
    rows = []
    for pg, seqs in pgs.items():
        if pg in named:
            members, src = named[pg], "fr_groups"
        elif desc.get(pg) == "default_pg" or pg == "0":
            members, src = list(range(world)), "world"
        else:
            members, src = sorted({r for s in seqs.values() for r in s}), "entries"
        seq_of = defaultdict(list)
        for s, got in seqs.items():
            for r in got:
                seq_of[r].append(s)
        for seq in range(min(seqs), max(seqs) + 1):
            got = seqs.get(seq, {})
            if not got:
                continue  # evicted from every ring
            first = min(e["time_created_ns"] or 0 for e in got.values())
            unknown = set()
            for r in members:
                if r in got:
                    continue
                if r not in dumped:
                    unknown.add(r)
                elif seq_of[r] and min(seq_of[r]) > seq:
                    unknown.add(r)
                elif not seq_of[r] and oldest.get(r, 0) > first:
                    unknown.add(r)
            c = classify(got, members, unknown)
            created = [e["time_created_ns"] for e in got.values() if e["time_created_ns"] is not None]
            rows.append(dict(run_id=rid, pg_name=pg, pg_desc=desc.get(pg), seq=seq, members=members, members_source=src,
                             arrived_ranks=sorted(got), unknown_ranks=sorted(unknown),
                             first_created_ns=min(created) if created else None,
                             last_created_ns=max(created) if created else None, **c))
    rows.sort(key=lambda r: (r["pg_name"], r["seq"]))
    bad = [r for r in rows if r["match_state"] != "fully_matched"]
    offset, pairs = timeline_offset(list(kineto), [(e["rank"], e["pg_name"], e["op"], e["time_created_ns"]) for e in coll]) \
        if kineto else (None, 0)
    div = dict(run_id=rid, match_state="fully_matched", ranks_without_dump=sorted(set(range(world)) - dumped),
               mismatched=len(bad), instances=len(rows), timeline_offset_ns=offset, timeline_pairs=pairs if offset is not None else 0)
    if bad:
        first = min(bad, key=lambda r: (r["first_created_ns"] if r["first_created_ns"] is not None else 1 << 62,
                                        r["pg_name"], r["seq"]))
        d = first["pg_desc"]
        div.update({k: first[k] for k in ("match_state", "pg_name", "pg_desc", "seq", "op", "culprit_ranks",
                                          "culprit_basis", "detail")})
        div["dimension"] = d if d in _DIMS else dims.get(first["pg_name"])
        culprit = first["culprit_ranks"][0] if first["culprit_ranks"] else None
        div["culprit_rank"] = culprit
        last = by_rank[culprit][-1] if culprit is not None and by_rank.get(culprit) else None
        if last is not None:
            div.update(culprit_last_pg=last["pg_name"], culprit_last_seq=last["collective_seq_id"],
                       culprit_last_op=last["op"], culprit_last_state=last["state"],
                       culprit_last_frame=_user_frame(last["frames"]))
        waiting = [r for r in first["arrived_ranks"] if r not in first["culprit_ranks"]]
        div["waiting_ranks"] = waiting
        got = pgs[first["pg_name"]][first["seq"]]
        waits = []
        for r in waiting or first["arrived_ranks"]:
            t0 = got[r]["time_created_ns"]
            later = [e["time_created_ns"] for e in by_rank[r] if e["record_id"] > got[r]["record_id"]
                     and e["time_created_ns"] is not None]
            end = min(later) if later else dumped_at.get(r)
            if t0 is not None and end is not None:
                waits.append(end - t0)
        div["waited_ns"] = max(waits) if waits else None
        if offset is not None and first["first_created_ns"] is not None:
            div["timeline_ts_ns"] = first["first_created_ns"] - offset
    return rows, div


def create(con) -> None:
    """Build hang_instances and hang_divergence on ``con`` (every run with fr_entries rows)."""
    def fetch(sql):
        cur = con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    entries = fetch("SELECT run_id, rank, record_id, pg_name, pg_desc, collective_seq_id, is_p2p, op, input_sizes, "
                    "output_sizes, input_dtypes, output_dtypes, state, time_created_ns, frames FROM fr_entries")
    inst, divs = [], []
    if entries:
        runs = {r["run_id"]: r for r in fetch("SELECT run_id, world_size FROM runs")}
        groups, dumps = defaultdict(list), defaultdict(list)
        for g in fetch("SELECT run_id, pg_name, ranks FROM fr_groups"):
            groups[g["run_id"]].append(g)
        for d in fetch("SELECT run_id, rank, dumped_at_ns FROM fr_dumps"):
            dumps[d["run_id"]].append(d)
        dims = defaultdict(dict)
        for p in fetch("SELECT run_id, pg_name, dimension FROM process_groups WHERE dimension <> 'other'"):
            dims[p["run_id"]][p["pg_name"]] = p["dimension"]
        per_run = defaultdict(list)
        for e in entries:
            per_run[e["run_id"]].append(e)
        kineto = defaultdict(list)
        for c in fetch("SELECT run_id, rank, pg_name, op, coalesce(issue_ts_ns, ts_ns) AS t FROM collectives "
                       "WHERE run_id IN (SELECT DISTINCT run_id FROM fr_entries) AND op IS NOT NULL"):
            kineto[c["run_id"]].append((c["rank"], c["pg_name"], c["op"], c["t"]))
        for rid in sorted(per_run):
            rows, div = triage(runs.get(rid, {"run_id": rid}) | {"run_id": rid}, per_run[rid], groups[rid], dumps[rid],
                               dims[rid], kineto[rid])
            inst += rows
            divs.append(div)
    _table(con, "hang_instances", INSTANCE_COLS, inst)
    _table(con, "hang_divergence", DIVERGENCE_COLS, divs)


def hang_marks(con, run_id: str) -> list[dict]:
    """The divergence point as a mark for a timeline export: [{ts_ns, name, args}] (ts_ns on the
    store's clock), [] when nothing diverged or it could not be placed (no Kineto collectives)."""
    cur = con.execute("SELECT * FROM hang_divergence WHERE run_id = ? AND timeline_ts_ns IS NOT NULL", [run_id])
    names = [c[0] for c in cur.description]
    out = []
    for row in cur.fetchall():
        d = dict(zip(names, row))
        out.append(dict(ts_ns=d["timeline_ts_ns"],
                        name=f"hang: {d['match_state']} in group {d['pg_name']} seq {d['seq']} ({d['op']})",
                        args={"culprit_ranks": d["culprit_ranks"], "detail": d["detail"],
                              "waiting_ranks": d["waiting_ranks"], "offset_ns": d["timeline_offset_ns"]}))
    return out
