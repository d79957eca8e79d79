"""Clock alignment across hosts, from the ends of matched collectives.

Ranks on one host share a clock; ranks on different hosts do not. A collective
ends at nearly the same true time on every rank of its group (each rank leaves
once the last piece arrives), so for two ranks a and b the differences
``end_a − end_b`` over their common instances estimate b's clock offset
relative to a. The median of those differences is the estimate (a straggler or
a late-leaving rank moves single samples, not the median); its uncertainty is
the standard error of a median under near-normal noise, 1.2533·σ/√n, with σ
estimated robustly as 1.4826·MAD, at least 1 ns.

Offsets are relative to the lowest rank and propagate through ranks that share
instances (breadth-first), so ranks that never meet the reference directly
still get an offset when some chain of groups connects them. ``host`` mode
gives every rank of a host the median offset of that host's ranks.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque

from tracekit.errors import BadInputError

ALIGN_MODES = ("none", "host", "collectives")


def choose_alignment(align: str | None, hosts: dict[int, str | None]) -> str:
    """The mode to use: ``align`` if given, else collectives when ≥ 2 distinct known hosts, else none."""
    if align is not None:
        if align not in ALIGN_MODES:
            raise BadInputError(f"--align must be one of {', '.join(ALIGN_MODES)}, not {align!r}")
        return align
    known = {h for h in hosts.values() if h}
    return "collectives" if len(known) > 1 else "none"


def _pair_samples(rows: list[dict]) -> dict[tuple[int, int], list[int]]:
    ends: dict = defaultdict(dict)
    for r in rows:
        if r.get("op") is None or r.get("seq") is None or r.get("ts_ns") is None:
            continue
        ends[(r["pg_name"], r["seq"])][r["rank"]] = r["ts_ns"] + r["dur_ns"]
    pairs: dict = defaultdict(list)
    for per_rank in ends.values():
        rs = sorted(per_rank)
        for i, a in enumerate(rs):
            for b in rs[i + 1 :]:
                pairs[(a, b)].append(per_rank[a] - per_rank[b])
    return pairs


def _robust(diffs: list[int]) -> tuple[int, int]:
    med = statistics.median(diffs)
    mad = statistics.median([abs(d - med) for d in diffs])
    err = 1.2533 * 1.4826 * mad / max(1, len(diffs)) ** 0.5
    return round(med), max(1, round(err))


def estimate_offsets(
    rows: list[dict], ranks: list[int], hosts: dict[int, str | None], mode: str
) -> dict[int, tuple[int, int, str | None]]:
    """rank → (offset_ns to ADD to the rank's times, uncertainty ns, warning or None).

    ``rows`` are collectives rows (rank, pg_name, seq, op, ts_ns, dur_ns).
    Mode ``none`` returns zeros. A rank with no instance shared with the
    reference's component keeps offset 0 and gets a warning.
    """
    out = {r: (0, 0, None) for r in ranks}
    if mode == "none" or len(ranks) < 2:
        return out
    pairs = _pair_samples(rows)
    est: dict[tuple[int, int], tuple[int, int]] = {}
    adj: dict = defaultdict(list)
    for (a, b), diffs in pairs.items():
        off, err = _robust(diffs)  # end_a − end_b: add `off` to b's clock to match a
        est[(a, b)] = (off, err)
        adj[a].append((b, off, err))
        adj[b].append((a, -off, err))
    ref = min(ranks)
    got = {ref: (0, 0)}
    q = deque([ref])
    while q:
        a = q.popleft()
        for b, off, err in sorted(adj[a]):
            if b not in got:
                got[b] = (got[a][0] + off, got[a][1] + err)
                q.append(b)
    return _finish(out, got, ranks, hosts, mode, ref)


def _finish(out: dict, got: dict, ranks, hosts, mode: str, ref: int) -> dict:
    """``out`` from the walk's offsets ``got`` (rank → (offset, uncertainty)): the ranks it did not
    reach warned, and in ``host`` mode each host's median offset."""
    for r in ranks:
        if r in got:
            out[r] = (got[r][0], got[r][1], None)
        else:
            out[r] = (0, 0, f"clock offset unknown: no collective shared with rank {ref}'s groups; not aligned")
    if mode == "host":
        by_host: dict = defaultdict(list)
        for r in ranks:
            by_host[hosts.get(r)].append(r)
        for members in by_host.values():
            offs = [out[r][0] for r in members if r in got]
            if not offs:
                continue
            off = round(statistics.median(offs))
            err = max(out[r][1] for r in members if r in got)
            for r in members:
                out[r] = (off, err, out[r][2] if r not in got else None)
    return out


def _read_columns(f, cols):
    """Columns ``cols`` of the table in file ``f``: Parquet (``.parquet``) or an Arrow IPC file."""
    if str(f).endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(f, columns=cols, use_threads=False)
    import pyarrow.feather as feather

    return feather.read_table(f, columns=cols, use_threads=False, memory_map=False)


ALIGN_READ_RANKS = 64
"""Ranks whose collectives' ends :func:`estimate_offsets_from_files` reads into DuckDB at a time."""


def estimate_offsets_from_files(
    files: dict[int, str], ranks: list[int], hosts: dict[int, str | None], mode: str, con
) -> dict[int, tuple[int, int, str | None]]:
    """:func:`estimate_offsets` (the same result, to the ns) from collectives Parquet files instead of
    rows in memory, so its memory does not grow with the collectives.

    ``files``: rank → a Parquet or Arrow IPC file holding that rank's collectives rows and no other rank's (at
    least the columns rank, pg_name, seq, op, ts_ns, dur_ns; a later row of one (pg_name, seq)
    wins, as in :func:`estimate_offsets`); ``con``: a DuckDB connection (give it a memory limit and a temp
    directory: it sorts and joins there, spilling beyond the limit). How: the ends of every
    (pg_name, seq, rank) go to a DuckDB table (read with pyarrow, ALIGN_READ_RANKS ranks at a time:
    DuckDB's own reader over thousands of files holds state per file); the distinct member sets of the instances (a few per
    process group) give each rank's neighbours, and the breadth-first walk from the lowest rank
    (neighbours in rank order, as :func:`estimate_offsets` visits them) picks the one pair per
    rank whose estimate it uses; only those pairs' differences are computed, and streamed, one
    pair at a time, into :func:`_robust`. Python memory: the member sets, the walk (per rank) and
    one pair's differences (at most the smaller rank's collectives).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {r: (0, 0, None) for r in ranks}
    if mode == "none" or len(ranks) < 2:
        return out

    # the ends, read with pyarrow a few ranks at a time (their six columns only) into a DuckDB table;
    # a rank's rows are in its one file: the last of a (pg_name, seq) wins, as in estimate_offsets
    con.execute("CREATE OR REPLACE TEMP TABLE _tk_rows (pg_name VARCHAR, seq BIGINT, rank BIGINT, e BIGINT, o BIGINT)")
    cols = ["rank", "pg_name", "seq", "op", "ts_ns", "dur_ns"]
    order = sorted(files.items())
    for i in range(0, len(order), ALIGN_READ_RANKS):
        parts = []
        for _, f in order[i:i + ALIGN_READ_RANKS]:
            t = _read_columns(f, cols)
            t = t.append_column("o", pa.array(np.arange(t.num_rows, dtype=np.int64)))
            keep = pc.and_(pc.and_(t["op"].is_valid(), t["seq"].is_valid()), t["ts_ns"].is_valid())
            t = t.filter(keep)
            parts.append(pa.table(dict(pg_name=t["pg_name"], seq=t["seq"], rank=t["rank"],
                                       e=pc.add(t["ts_ns"], t["dur_ns"]), o=t["o"])))
        chunk = pa.concat_tables(parts)  # noqa: F841  (read by the statement below)
        con.execute("INSERT INTO _tk_rows SELECT pg_name, seq, rank, e, o FROM chunk")
        del parts, chunk
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _tk_ends AS
        SELECT pg_name, seq, rank, e FROM (
            SELECT *, row_number() OVER (PARTITION BY pg_name, seq, rank ORDER BY o DESC) AS k FROM _tk_rows)
        WHERE k = 1""")
    con.execute("DROP TABLE _tk_rows")
    # each instance's ranks; two ranks are neighbours when some instance holds both
    member_sets = [tuple(m) for (m,) in con.execute("""
        SELECT DISTINCT list(rank ORDER BY rank) FROM _tk_ends GROUP BY pg_name, seq HAVING count(*) >= 2
        """).fetchall()]
    sets_of: dict = defaultdict(list)
    for i, m in enumerate(member_sets):
        for r in m:
            sets_of[r].append(i)
    ref = min(ranks)
    parent = {ref: None}
    order = [ref]
    q = deque([ref])
    while q:
        a = q.popleft()
        for b in sorted({r for i in sets_of.get(a, ()) for r in member_sets[i]} - {a}):
            if b not in parent:
                parent[b] = a
                order.append(b)
                q.append(b)
    del member_sets, sets_of
    est: dict = {}
    edges = sorted({(min(a, b), max(a, b)) for b, a in parent.items() if a is not None})
    if edges:
        con.register("_tk_edges", pa.table(dict(a=pa.array([a for a, _ in edges], pa.int64()),
                                                b=pa.array([b for _, b in edges], pa.int64()))))
        res = con.sql("""
            SELECT g.a, g.b, x.e - y.e AS d
            FROM _tk_edges g
            JOIN _tk_ends x ON x.rank = g.a
            JOIN _tk_ends y ON y.rank = g.b AND y.pg_name IS NOT DISTINCT FROM x.pg_name AND y.seq = x.seq
            ORDER BY g.a, g.b""")
        cur, diffs = None, []
        for batch in res.to_arrow_reader(65_536):  # streamed
            cols = batch.to_pydict()
            for a, b, d in zip(cols["a"], cols["b"], cols["d"]):
                if (a, b) != cur:
                    if diffs:
                        est[cur] = _robust(diffs)
                    cur, diffs = (a, b), []
                diffs.append(d)
        if diffs:
            est[cur] = _robust(diffs)
        con.unregister("_tk_edges")
    con.execute("DROP TABLE _tk_ends")
    got = {ref: (0, 0)}
    for b in order[1:]:
        a = parent[b]
        off, err = est[(a, b)] if a < b else est[(b, a)]
        got[b] = (got[a][0] + (off if a < b else -off), got[a][1] + err)
    return _finish(out, got, ranks, hosts, mode, ref)
