"""tracekit.ingest.pg_attribution on hand-built gloo rows: each rule alone, and the case no rule
can decide (left unassigned with a warning). The real 8-rank case is in tests/collectors/test_3d_workload.py."""

from __future__ import annotations

import pyarrow as pa

from tracekit.ingest.pg_attribution import attribute
from tracekit.store import COLLECTIVES_SCHEMA

# a 2 × 2 grid: "1" = tp {0,1}, "2" = tp {2,3}, "3" = dp {0,2}, "4" = dp {1,3}; "0" the world
GRID = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}


def _run(calls, pg_config=GRID, same_clock=True):
    """calls: (rank, op, bytes, ts, dur, thread, peer_arg, tag[, label]) → attributed rows per rank,
    warnings. ``label``: the group a process-group range around the call names (rule 0)."""
    tables, facts = [], {}
    for r in sorted({c[0] for c in calls}):
        rows = []
        for k, (rank, op, size, ts, dur, track, peer_arg, tag, *label) in enumerate(c for c in calls if c[0] == r):
            rows.append(dict(run_id="x", rank=r, event_id=k, pg_name="0", pg_ranks=GRID["0"], group_size=4, seq=k,
                             op=op, size_bytes=size, ts_ns=ts, dur_ns=dur, issue_ts_ns=ts))
            facts.setdefault(r, []).append(dict(unnamed=True, trace_seq=False, track=track, peer_arg=peer_arg, tag=tag,
                                                label=label[0] if label else None))
        tables.append((r, pa.Table.from_pylist(rows, schema=COLLECTIVES_SCHEMA)))
    out, warnings = attribute(tables, facts, pg_config, same_clock=same_clock)
    return {r: t.select(["pg_name", "seq", "group_size", "peer"]).to_pylist() for r, t in out}, warnings


def _names(got):
    return {r: [x["pg_name"] for x in rows] for r, rows in got.items()}


def test_timing_separates_tp_pairs_that_run_at_different_times():
    # tp {0,1} all-reduces at [0, 10), tp {2,3} at [20, 30): no dp pair (0,2) / (1,3) can have met
    calls = [(r, "all_reduce", 64, 0 if r < 2 else 20, 10, None, None, None) for r in range(4)]
    got, warnings = _run(calls)
    assert _names(got) == {0: ["1"], 1: ["1"], 2: ["2"], 3: ["2"]}
    assert got[0][0]["seq"] == 0 and got[0][0]["group_size"] == 2 and warnings == {}


def test_symmetric_calls_stay_unassigned_and_are_counted():
    # all four at once, same size, no thread facts: tp {0,1},{2,3} and dp {0,2},{1,3} (and the
    # world) explain it equally: nothing is assigned, nothing matched
    calls = [(r, "all_reduce", 64, 0, 10, None, None, None) for r in range(4)]
    got, warnings = _run(calls)
    assert _names(got) == {r: [None] for r in range(4)}
    assert all(rows[0]["seq"] is None and rows[0]["group_size"] is None for rows in got.values())
    assert warnings[2] == ["1 gloo call(s) without a process group in the trace could not be put in one group "
                           "unambiguously: left unassigned (no pg_name, not matched across ranks)"]
    # without a shared clock the staggered case is as undecidable
    got, _ = _run([(r, "all_reduce", 64, 0 if r < 2 else 20, 10, None, None, None) for r in range(4)], same_clock=False)
    assert _names(got) == {r: [None] for r in range(4)}


def test_counts_and_worker_threads_decide_the_symmetric_rest():
    # rank 0: one 64 B call (thread 7) and one 32 B call (thread 7 too): only dp {0,2} has a
    # 32 B call on both ends (ranks 0 and 2), so thread 7 is dp, its 64 B call with it; the
    # 64 B calls of 1..3 follow by counts (tp {0,1} then has none on rank 0, so none on 1 ...)
    calls = [(0, "all_reduce", 64, 0, 10, 7, None, None), (0, "all_reduce", 32, 20, 10, 7, None, None),
             (2, "all_reduce", 64, 0, 10, 8, None, None), (2, "all_reduce", 32, 20, 10, 8, None, None),
             (1, "all_reduce", 64, 0, 10, 9, None, None), (3, "all_reduce", 64, 0, 10, 5, None, None)]
    got, warnings = _run(calls)
    assert _names(got) == {0: ["3", "3"], 2: ["3", "3"], 1: ["4"], 3: ["4"]}
    assert [x["seq"] for x in got[0]] == [0, 1] and warnings == {}


def test_creation_order_of_worker_threads():
    # no clock: the 64 B calls of 0 and 1 are tp {0,1} by counts (2 and 3 have none); rank 0's
    # 16 B call on thread 11 could be tp {0,1} or dp {0,2} (the world is out: thread 11 starts
    # after tp's thread 10, so its group was created after tp "1"); and so on for 1, 2, 3 ...
    calls = [(0, "all_reduce", 64, 0, 10, 10, None, None), (1, "all_reduce", 64, 0, 10, 20, None, None),
             (0, "all_reduce", 16, 30, 10, 11, None, None), (1, "all_reduce", 16, 30, 10, 21, None, None),
             (2, "all_reduce", 16, 30, 10, 30, None, None), (3, "all_reduce", 16, 30, 10, 31, None, None)]
    got, _ = _run(calls, same_clock=False)
    assert _names(got)[0][0] == "1"
    # ... the grid's symmetry: tp (same group, a second thread) or dp (a later group)
    assert _names(got)[0][1] is None
    # on thread 9 (< 10) it is in tp or an earlier group: not dp "3"; not the world "0" either,
    # since rank 1's 16 B call (thread 21 > 20) cannot be in it; then by counts rank 1's is tp
    # and 2's and 3's are tp {2,3}
    calls[2] = (0, "all_reduce", 16, 30, 10, 9, None, None)
    got, warnings = _run(calls, same_clock=False)
    assert _names(got) == {0: ["1", "1"], 1: ["1", "1"], 2: ["2"], 3: ["2"]} and warnings == {}


def test_p2p_peer_is_the_only_group_rank_with_a_matching_end():
    # rank 1 sends to group rank 0 with tag "5": in tp {0,1} that is 0, in dp {1,3} it is 1
    # (itself), in the world 0 too: peer 0 either way. Rank 3 sends to group rank 0 (dp {1,3} → 1,
    # tp {2,3} → 2, world → 0); only 1 has a recv of that size and tag whose candidates include 3.
    calls = [(1, "send", 8, 0, 5, 1, 0, "5"), (0, "recv", 8, 0, 5, 1, 1, "5"),
             (3, "send", 8, 10, 5, 1, 0, "6"), (1, "recv", 8, 10, 5, 1, 1, "6"), (2, "recv", 8, 10, 5, 1, 0, "9")]
    got, warnings = _run(calls)
    assert [(x["pg_name"], x["peer"]) for x in got[3]] == [("p2p:3->1", 1)]
    assert [(x["pg_name"], x["peer"]) for x in got[1]] == [("p2p:1->0", 0), ("p2p:3->1", 3)]
    assert [(x["pg_name"], x["peer"]) for x in got[0]] == [("p2p:1->0", 1)]
    assert got[2][0]["pg_name"] is None and list(warnings) == [2]


def test_only_the_world_group_keeps_todays_rows():
    calls = [(r, "all_reduce", 64, 0, 10, None, None, None) for r in range(2)]
    got, warnings = _run(calls, pg_config={"0": [0, 1]})
    assert _names(got) == {0: ["0"], 1: ["0"]} and warnings == {}


def test_a_lone_rank_keeps_the_default_group_with_a_warning():
    # only rank 0 of the grid ingested: no group can be checked, the row stays as it was
    got, warnings = _run([(0, "all_reduce", 64, 0, 10, None, None, None), (0, "send", 8, 20, 5, None, 1, "0")])
    assert [(x["pg_name"], x["seq"]) for x in got[0]] == [("0", 0), ("0", 1)]
    assert warnings == {0: ["2 gloo call(s) without a process group in the trace stay in the default group "
                            "(send/recv: peers numbered in it), unverified: the other ranks of the groups they "
                            "may belong to were not ingested"]}


def test_a_label_names_the_group_the_timing_leaves_open():
    # the symmetric case above (all four at once, one size), each call inside its group's range:
    # the ranges decide, whichever group they name; seq is numbered within the group
    for lab, want in ((("3", "4", "3", "4")), {0: ["3"], 1: ["4"], 2: ["3"], 3: ["4"]}), \
                     ((("1", "1", "2", "2")), {0: ["1"], 1: ["1"], 2: ["2"], 3: ["2"]}):
        got, warnings = _run([(r, "all_reduce", 64, 0, 10, None, None, None, lab[r]) for r in range(4)])
        assert _names(got) == want and warnings == {}
        assert all(rows[0]["seq"] == 0 and rows[0]["group_size"] == 2 for rows in got.values())
    # ranks 0 and 2 labelled dp {0,2}; 1 and 3 not: rank 0's only call is dp's, so tp {0,1} and the
    # world have none on rank 0, so none on 1 (counts): 1 and 3 are dp {1,3}
    calls = [(r, "all_reduce", 64, 0, 10, None, None, None, "3" if r in (0, 2) else None) for r in range(4)]
    assert _names(_run(calls)[0]) == {0: ["3"], 1: ["4"], 2: ["3"], 3: ["4"]}


def test_a_label_naming_a_group_without_the_rank_is_ignored():
    # rank 0's range names tp {2,3}, which does not hold it: not trusted, the call is attributed as
    # if unlabelled (so the symmetric case stays undecided; taking it as "in no group" would let
    # the counts put 2 and 3 in tp {2,3} on no evidence)
    lab = ("2", None, None, None)
    got, warnings = _run([(r, "all_reduce", 64, 0, 10, None, None, None, lab[r]) for r in range(4)])
    assert _names(got) == {r: [None] for r in range(4)}
    assert warnings[0] == ["1 gloo call(s) inside a process-group range naming a group missing from this rank's pg_config "
                           "(tracekit.process_group:2): the range is ignored, as if absent",
                           "1 gloo call(s) without a process group in the trace could not be put in one group "
                           "unambiguously: left unassigned (no pg_name, not matched across ranks)"]
    assert len(warnings[1]) == 1  # the plain "could not be put in one group" line


def test_a_label_decides_without_the_other_ranks():
    # only rank 0 ingested (the lone-rank case above): labelled calls go to the group named, a
    # send's group rank 1 is its peer in that group (dp {0,2}: global rank 2); unlabelled stays
    got, warnings = _run([(0, "all_reduce", 64, 0, 10, None, None, None, "3"),
                          (0, "send", 8, 20, 5, None, 1, "0", "3"), (0, "all_reduce", 32, 30, 10, None, None, None)])
    assert [(x["pg_name"], x["peer"]) for x in got[0]] == [("3", None), ("p2p:0->2", 2), ("0", None)]
    assert [x["seq"] for x in got[0]] == [0, 0, 0]  # each the first of its group (pair)
    assert warnings == {0: ["1 gloo call(s) without a process group in the trace stay in the default group "
                            "(send/recv: peers numbered in it), unverified: the other ranks of the groups they "
                            "may belong to were not ingested"]}


def _grid_trace(rank: int, label: str | None) -> dict:
    """A hand-written gloo trace of one rank of GRID: one 64 B all-reduce at [100, 110) µs, issued
    on thread 1 (inside the range ``tracekit.process_group:<label>`` when given), run on gloo
    worker thread 9. Every rank the same: the timing fits tp and dp alike."""
    mine = [g for g, rk in GRID.items() if rank in rk]
    desc = {"0": "default_pg", "1": "tp", "2": "tp", "3": "dp", "4": "dp"}
    ev = [dict(ph="X", cat="user_annotation", name="ProfilerStep#0", pid=1, tid=1, ts=50, dur=100),
          dict(ph="X", cat="cpu_op", name="c10d::allreduce_", pid=1, tid=1, ts=101, dur=2,
               args={"Input Dims": [[[16]], [], [], [], [], []], "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"],
                     "Concrete Inputs": ["", "", "", "", "True", "-1"]}),
          dict(ph="X", cat="user_annotation", name="gloo:all_reduce", pid=1, tid=9, ts=102, dur=8,
               args={"Input Dims": [[16]], "Input type": ["float"]})]
    if label is not None:
        ev.append(dict(ph="X", cat="user_annotation", name=f"tracekit.process_group:{label}", pid=1, tid=1, ts=100, dur=4))
    pgs = [dict(pg_name=g, pg_desc=desc[g], backend_config="cpu:gloo", pg_size=len(GRID[g]), ranks=GRID[g]) for g in mine]
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 4, "pg_count": len(pgs), "pg_config": pgs},
            "traceEvents": ev}


def test_the_ingest_reads_the_range_around_a_gloo_call(tmp_path):
    """End to end on hand-written traces: without ranges (a user's trace) the four calls stay
    unassigned and warned, as before; with each rank's dp range, each is in its dp group and
    matched complete."""
    import json

    from tracekit.analyses import connect
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    for labels, want in ((None, {r: None for r in range(4)}), (("3", "4", "3", "4"), {0: "3", 1: "4", 2: "3", 3: "4"})):
        d = tmp_path / ("labelled" if labels else "plain")
        d.mkdir()
        for r in range(4):
            (d / f"rank{r}.pt.trace.json").write_text(json.dumps(_grid_trace(r, labels[r] if labels else None)))
        store = Store(tmp_path / "store")
        ingest_paths([str(d)], store, run_id=d.name)
        con = connect(store, [d.name])
        assert dict(con.execute("SELECT rank, pg_name FROM collectives").fetchall()) == want
        warned = {r for r, ws in con.execute("SELECT rank, warnings FROM ranks").fetchall()
                  if any("could not be put in one group unambiguously" in w for w in ws)}
        if labels:
            assert warned == set()
            assert con.execute("SELECT pg_name, count(*), bool_and(complete) FROM collective_instances "
                               "GROUP BY ALL ORDER BY 1").fetchall() == [("3", 1, True), ("4", 1, True)]
        else:
            assert warned == {0, 1, 2, 3}


def test_a_label_may_name_a_one_rank_group():
    # pg_config's 1-rank groups are no candidates of the timing rules, but a range may name one
    cfg = dict(GRID, **{"5": [0]})
    got, warnings = _run([(r, "all_reduce", 64, 0, 10, None, None, None, "5" if r == 0 else None) for r in range(2)]
                         + [(0, "all_reduce", 32, 20, 10, None, None, None, "1"),
                            (1, "all_reduce", 32, 20, 10, None, None, None, "1")], pg_config=cfg)
    assert [(x["pg_name"], x["group_size"]) for x in got[0]] == [("5", 1), ("1", 2)]
    # rank 1's 64 B call: not tp {0,1} (rank 0's is in "5"), and the world or dp {1,3} (ranks 2, 3
    # not ingested) cannot be told apart: unassigned
    assert _names(got)[1] == [None, "1"] and warnings[1][0].startswith("1 gloo call(s) without a process group")
