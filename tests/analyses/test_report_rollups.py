"""The report's remaining roll-ups as views: machine_summary, critical_path_events /
critical_path_top and fr_collectives, each against numbers worked out by hand or computed here
independently from the rows they roll up."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.analyses.test_size_buckets import _write_trace
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store


def _rows(con, sql, params=()):
    cur = con.execute(sql, list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_machine_summary_by_hand(tmp_path):
    # 4 ranks, hosts hA hA hB hB: groups "0" (0, 1) and "1" (2, 3) each on one host, 2 ranks per host;
    # group "2" (0, 2) across the two hosts, 1 rank per host
    calls = [("0", (0, 1), 4096, 10.0), ("1", (2, 3), 4096, 10.0), ("2", (0, 2), 4096, 10.0)]
    st = Store(tmp_path / "s")
    ingest_paths([_write_trace(tmp_path / "t", 4, calls, hosts=["hA", "hA", "hB", "hB"])], st, run_id="m")
    con = analyses.connect(st)
    try:
        got = _rows(con, "SELECT nodes, ranks_per_host, locality, groups, hosts FROM machine_summary "
                         "ORDER BY nodes, ranks_per_host")
    finally:
        con.close()
    assert got == [dict(nodes=1, ranks_per_host=2, locality="intra_node", groups=2, hosts=["hA", "hB"]),
                   dict(nodes=2, ranks_per_host=1, locality="inter_node", groups=1, hosts=["hA", "hB"])]


def test_critical_path_rollups_match_the_path_rows(session_store):
    """On fixtures/tp_2rank: the roll-ups recomputed in Python from critical_path's rows."""
    con = analyses.connect(session_store("tp"))
    try:
        path = _rows(con, "SELECT rank, step, event_rank, event_id, name, class, start_ns, end_ns, on_path_ns, pos "
                          "FROM critical_path WHERE on_path_ns > 0")
        total = con.execute("SELECT sum(length_ns) FROM critical_path_summary").fetchone()[0]
        events = {(r["name"], r["class"]): r for r in _rows(con, "SELECT * FROM critical_path_events")}
        top = _rows(con, "SELECT * EXCLUDE (run_id) FROM critical_path_top ORDER BY step, rank, on_path_ns DESC, pos")
    finally:
        con.close()
    assert path and total > 0
    want: dict = defaultdict(lambda: [0, set(), 0])
    for r in path:
        w = want[(r["name"], r["class"])]
        w[0] += 1
        w[1].add(r["event_rank"])
        w[2] += r["on_path_ns"]
    assert set(events) == set(want)
    for key, (n, ranks, ns) in want.items():
        e = events[key]
        assert (e["events"], e["ranks"], e["on_path_ns"]) == (n, len(ranks), ns)
        assert e["share"] == pytest.approx(ns / total)
    per_path = defaultdict(list)
    for r in path:
        per_path[(r["rank"], r["step"])].append(r)
    expect = []
    for (rank, step), rows in sorted(per_path.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        expect += sorted(rows, key=lambda r: (-r["on_path_ns"], r["pos"]))[:3]
    assert top == expect


def test_fr_collectives_by_hand(tmp_path):
    from tests.ingest.test_flight_recorder import dump, entry, write

    d = tmp_path / "d"
    timed = [entry(s, size=(256,)) for s in (1, 2, 3)]
    for e, ms in zip(timed, (1.0, 3.0, 2.0)):
        e["duration_ms"] = ms
    write(d, 0, dump(timed + [entry(4, "all_gather", size=(8,), out_size=(2, 8), dtype="Half")]))
    write(d, 1, dump([entry(s, size=(256,)) for s in (1, 2, 3)]))
    st = Store(tmp_path / "s")
    rid = ingest_paths([d], st)
    con = analyses.connect(st)
    try:
        got = _rows(con, "SELECT * EXCLUDE (run_id) FROM fr_collectives WHERE run_id = ? ORDER BY op", [rid])
    finally:
        con.close()
    # all_gather of 8 halves = 16 B, rank 0 only; all_reduce of 256 floats = 1024 B on both ranks,
    # seq 1–3, rank 0's timed 1, 3, 2 ms → median 2 ms
    assert got == [
        dict(pg_name="0", op="all_gather", in_bytes=16, calls=1, ranks=1, instances=1, bytes=16, timed=0,
             median_duration_ns=None, first_seq=4, last_seq=4),
        dict(pg_name="0", op="all_reduce", in_bytes=1024, calls=6, ranks=2, instances=3, bytes=6144, timed=3,
             median_duration_ns=2_000_000.0, first_seq=1, last_seq=3)]
