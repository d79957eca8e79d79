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
