"""Flight Recorder dumps: reading them (pickle and JSON forms, the restricted unpickler), the store
tables, and the hang triage (analyses/hang.py) on hand-made dumps whose answer is known by
construction. Real dumps of real jobs: tests/collectors/test_flight_recorder_jobs.py (slow)."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

from conftest import FIXTURES, store_snapshot
from tracekit import analyses
from tracekit.cli import main
from tracekit.collectors.faults import Fault, parse_fault
from tracekit.errors import BadInputError
from tracekit.ingest import ingest_paths
from tracekit.store import Store

T0 = 1_796_000_000_000_000_000  # a wall-clock ns


def entry(seq, op="all_reduce", *, pg=("0", "default_pg"), size=(1024,), dtype="Float", state="scheduled",
          t=None, record_id=None, frames=None, out_size=None):
    """One entry as torch 2.13 writes it (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp)."""
    e = {
        "record_id": seq - 1 if record_id is None else record_id, "pg_id": int(pg[0]), "process_group": pg,
        "thread_name": "python3.11", "thread_id": "140", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": f"gloo:{op}", "time_created_ns": T0 + seq * 1_000_000 if t is None else t,
        "input_sizes": [list(size)], "input_dtypes": [dtype], "output_sizes": [list(out_size or size)],
        "output_dtypes": [dtype], "state": state, "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None, "retired": True, "timeout_ms": 600000, "is_p2p": False,
    }
    if frames is not None:
        e["frames"] = frames
    return e


def dump(entries, *, version="2.10", tracekit=None):
    d = {"version": version, "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}, "comm_lib_version": "",
         "pg_status": {}, "entries": entries}
    if tracekit is not None:
        d["tracekit"] = tracekit
    return d


def write(dirpath, rank, d, form="pickle"):
    dirpath.mkdir(parents=True, exist_ok=True)
    if form == "pickle":  # torch's own name: TORCH_FR_DUMP_TEMP_FILE prefix + rank, no suffix
        (dirpath / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(d))
    else:
        (dirpath / f"fr-rank{rank}.json").write_text(json.dumps(d))


def triage(tmp_path, dumps, form="pickle", **kw):
    """Write ``dumps`` (rank → dump dict), ingest them, return (hang_divergence row, hang_instances rows)."""
    d = tmp_path / "dumps"
    for r, x in dumps.items():
        write(d, r, x, form)
    st = Store(tmp_path / "store")
    rid = ingest_paths([d], st, **kw)
    con = analyses.connect(st, [rid])
    cur = con.execute("SELECT * FROM hang_divergence")
    div = dict(zip([c[0] for c in cur.description], cur.fetchone()))
    cur = con.execute("SELECT * FROM hang_instances ORDER BY pg_name, seq")
    names = [c[0] for c in cur.description]
    return div, [dict(zip(names, r)) for r in cur.fetchall()]


# --------------------------------------------------------------------------- reading


def test_pickle_and_json_forms_give_the_same_rows(tmp_path):
    frames = [{"name": "all_reduce", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 3245},
              {"name": "train_step", "filename": "/job/train.py", "line": 42}]
    d = dump([entry(1, frames=frames), entry(2, "all_gather", size=(4,), out_size=(2, 4), dtype="BFloat16")])
    rows = {}
    for form in ("pickle", "json"):
        sub = tmp_path / form
        write(sub / "d", 0, d, form)
        st = Store(sub / "store")
        rid = ingest_paths([sub / "d"], st)
        con = st.connect()
        rows[form] = con.execute(
            "SELECT rank, pg_name, pg_desc, collective_seq_id, op, input_sizes, output_sizes, in_bytes, out_bytes, "
            "state, time_created_ns, frames FROM fr_entries ORDER BY record_id").fetchall()
        assert con.execute("SELECT source, backend, world_size FROM runs").fetchone() == ("flight_recorder", "gloo", 1)
        assert con.execute("SELECT version, entries FROM fr_dumps").fetchone() == ("2.10", 2)
        assert rid
    assert rows["pickle"] == rows["json"]
    first, second = rows["pickle"]
    # 1024 float32 = 4096 bytes; all_gather of 4 bf16 into 2×4: 8 in, 16 out
    assert first[:10] == (0, "0", "default_pg", 1, "all_reduce", [[1024]], [[1024]], 4096, 4096, "scheduled")
    assert first[11] == ["all_reduce /x/torch/distributed/distributed_c10d.py:3245", "train_step /job/train.py:42"]
    assert second[4:9] == ("all_gather", [[4]], [[2, 4]], 8, 16) and second[11] is None


def test_a_pickle_holding_an_object_is_refused_nothing_executed_store_unchanged(tmp_path, capsys):
    marker = tmp_path / "executed"

    class Evil:
        def __reduce__(self):
            return (shutil.copyfile, (__file__, str(marker)))  # would create the marker when unpickled

    ok = tmp_path / "ok"
    write(ok, 0, dump([entry(1)]))
    store = tmp_path / "store"
    assert main(["ingest", str(ok), "--store", str(store)]) == 0
    before = store_snapshot(store)
    bad = tmp_path / "bad"
    write(bad, 0, dump([entry(1)]))
    write(bad, 1, dump([entry(1), {"payload": Evil()}]))
    capsys.readouterr()
    assert main(["ingest", str(bad), "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert "nccl_trace_rank_1" in err and "refused" in err and "shutil.copyfile" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
    assert store_snapshot(store) == before


def test_torch_typed_list_markers_are_read_without_torch(tmp_path):
    from tracekit.ingest.flight_recorder import load_dump

    # {'version': '2.10', 'entries': [], 'x': build_intlist([1, 2])}, as torch::jit::pickle_save writes typed lists
    raw = (b"\x80\x02}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x07\x00\x00\x00entries]"
           b"X\x01\x00\x00\x00xctorch.jit._pickle\nbuild_intlist\n](K\x01K\x02e\x85Ru.")
    f = tmp_path / "nccl_trace_rank_0"
    f.write_bytes(raw)
    assert load_dump(f) == {"version": "2.10", "entries": [], "x": [1, 2]}
    f.write_bytes(raw.replace(b"(K\x01K\x02", b"(X\x01\x00\x00\x00aK\x02"))  # a str in an int list
    with pytest.raises(BadInputError, match="typed list"):
        load_dump(f)


def test_odd_fields_are_stored_as_null_not_guessed(tmp_path):
    odd = {"record_id": "x", "collective_seq_id": "seven", "process_group": 5, "pg_id": 3, "input_sizes": "bad",
           "input_dtypes": ["Float"], "output_sizes": [[2, "n"]], "output_dtypes": ["Mystery"], "time_created_ns": "12",
           "profiling_name": "nccl:send 0->1", "duration_ms": True}
    div, inst = triage(tmp_path, {0: dump([entry(1), odd, "not an entry"]), 1: dump([entry(1)])}, form="json")
    con = Store(tmp_path / "store").connect()
    got = con.execute("SELECT record_id, pg_name, collective_seq_id, op, input_sizes, output_sizes, in_bytes, out_bytes, "
                      "time_created_ns, duration_ns FROM fr_entries WHERE rank = 0 ORDER BY record_id").fetchall()
    # the odd entry: record id by position (1), group from pg_id, no seq, send from its name, shapes unknown → no bytes
    assert got[1] == (1, "3", None, "send", None, [[2, -1]], None, None, 12, None)
    assert len(got) == 2 and div["match_state"] == "fully_matched" and len(inst) == 1


def test_an_unknown_major_version_is_refused(tmp_path, capsys):
    write(tmp_path / "d", 0, dump([entry(1)], version="3.0"), "json")
    assert main(["ingest", str(tmp_path / "d"), "--store", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "fr-rank0.json" in err and "'3.0'" in err and "major versions 1, 2" in err


def test_other_pickles_in_a_trace_folder_are_left_alone(tmp_path):
    from tracekit.ingest.flight_recorder import is_fr_dump

    d = tmp_path / "d"
    write(d, 0, dump([entry(1)]))
    (d / "ckpt_100").write_bytes(pickle.dumps([1, 2, 3], protocol=2))  # not a dict: a checkpoint, say
    (d / "state_7").write_bytes(pickle.dumps({"weights": [0.5]}, protocol=2))  # a dict, but none of the dump's keys
    assert [is_fr_dump(d / n) for n in ("nccl_trace_rank_0", "ckpt_100", "state_7")] == [True, False, False]
    st = Store(tmp_path / "s")
    ingest_paths([d], st)
    assert st.connect().execute("SELECT count(*) FROM fr_dumps").fetchone() == (1,)


def test_two_dumps_of_one_rank_are_refused(tmp_path, capsys):
    d = tmp_path / "d"
    write(d, 0, dump([entry(1)]))
    write(d, 0, dump([entry(1)]), "json")
    assert main(["ingest", str(d), "--store", str(tmp_path / "s")]) == 2
    assert "a second Flight Recorder dump of rank 0" in capsys.readouterr().err


def test_dumps_beside_kineto_traces_of_the_same_job(tmp_path):
    d = tmp_path / "job"
    shutil.copytree(FIXTURES / "tp_2rank", d)
    write(d, 0, dump([entry(1), entry(2)]), "json")
    write(d, 1, dump([entry(1)]), "json")
    st = Store(tmp_path / "store")
    rid = ingest_paths([d], st)
    con = analyses.connect(st)
    assert con.execute("SELECT count(*) > 0 FROM events WHERE run_id = ?", [rid]).fetchone() == (True,)
    assert con.execute("SELECT rank, count(*) FROM fr_entries GROUP BY rank ORDER BY rank").fetchall() == [(0, 2), (1, 1)]
    assert con.execute("SELECT match_state, seq, culprit_ranks FROM hang_divergence").fetchone() == ("missing_ranks", 2, [1])
    # these hand-made dumps' times have nothing to do with the traces: no offset is claimed
    assert con.execute("SELECT timeline_ts_ns, timeline_offset_ns, timeline_pairs FROM hang_divergence").fetchone() == (None, None, 0)
    assert con.execute("SELECT schema_version FROM runs").fetchone() == ("1.2",)


def test_a_run_without_dumps_has_no_hang_section(tmp_path):
    from tracekit.report.data import build_report

    st = Store(tmp_path / "store")
    rid = ingest_paths([FIXTURES / "tp_2rank"], st)
    rep = build_report(st, rid)
    assert rep["hang"] is None
    assert analyses.connect(st).execute("SELECT count(*) FROM hang_divergence").fetchone() == (0,)


# --------------------------------------------------------------------------- triage


def test_healthy_dumps_are_fully_matched(tmp_path):
    div, inst = triage(tmp_path, {r: dump([entry(s) for s in (1, 2, 3)]) for r in (0, 1)})
    assert div["match_state"] == "fully_matched" and div["instances"] == 3 and div["mismatched"] == 0
    assert div["seq"] is None and div["culprit_rank"] is None and div["ranks_without_dump"] == []
    assert [(i["seq"], i["match_state"], i["members"], i["members_source"]) for i in inst] == [
        (s, "fully_matched", [0, 1], "world") for s in (1, 2, 3)]


def test_a_rank_that_never_arrived(tmp_path):
    stack = [{"name": "load_batch", "filename": "/job/data.py", "line": 7}]
    # rank 2 stopped after seq 2 and called a p2p send on another group instead (no collective_seq_id)
    other = entry(0, "send", pg=("1", "pp"), record_id=2, t=T0 + 2_500_000, frames=stack)
    other["is_p2p"], other["p2p_seq_id"] = True, 1
    dumps = {0: dump([entry(s) for s in (1, 2, 3)], tracekit={"rank": 0, "world_size": 3, "dumped_at_ns": T0 + 9_000_000}),
             1: dump([entry(s) for s in (1, 2, 3)], tracekit={"rank": 1, "world_size": 3, "dumped_at_ns": T0 + 8_000_000}),
             2: dump([entry(1), entry(2), other])}
    div, inst = triage(tmp_path, dumps, form="json")
    assert [i["match_state"] for i in inst] == ["fully_matched", "fully_matched", "missing_ranks"]
    assert div["match_state"] == "missing_ranks" and div["seq"] == 3 and div["op"] == "all_reduce"
    assert div["culprit_ranks"] == [2] and div["culprit_rank"] == 2 and div["culprit_basis"] == "missing"
    assert (div["culprit_last_pg"], div["culprit_last_op"], div["culprit_last_frame"]) == ("1", "send", "load_batch /job/data.py:7")
    assert div["waiting_ranks"] == [0, 1]
    # seq 3 issued at T0 + 3 ms; dumped at T0 + 9 ms (rank 0) and + 8 ms (rank 1): the longest wait 6 ms
    assert div["waited_ns"] == 6_000_000


def test_a_rank_without_dump_is_unknown_not_missing(tmp_path):
    tk = {"world_size": 3}
    dumps = {0: dump([entry(1), entry(2)], tracekit={"rank": 0, **tk}), 1: dump([entry(1)], tracekit={"rank": 1, **tk})}
    div, inst = triage(tmp_path, dumps, form="json")
    assert div["ranks_without_dump"] == [2]
    assert [(i["seq"], i["missing_ranks"], i["unknown_ranks"]) for i in inst] == [(1, [], [2]), (2, [1], [2])]
    assert div["culprit_ranks"] == [1]


def test_an_entry_evicted_from_the_ring_is_unknown(tmp_path):
    # rank 1's ring kept seq 4..6 only (record ids 3..5), rank 0's all of 1..6: seq 1..3 cannot be judged for rank 1
    dumps = {0: dump([entry(s) for s in range(1, 7)]), 1: dump([entry(s) for s in range(4, 7)])}
    div, inst = triage(tmp_path, dumps)
    assert div["match_state"] == "fully_matched"
    assert [i["unknown_ranks"] for i in inst] == [[1], [1], [1], [], [], []]


@pytest.mark.parametrize("culprit_entry, state, detail", [
    (entry(2, "broadcast"), "op_mismatch", "rank 2: broadcast where rank(s) 0, 1 have all_reduce"),
    (entry(2, size=(2, 512)), "size_mismatch", "rank 2: in [[2, 512]] out [[2, 512]] where rank(s) 0, 1 have in [[1024]] out [[1024]]"),
    (entry(2, dtype="Int"), "dtype_mismatch", "rank 2: in ['Int'] out ['Int'] where rank(s) 0, 1 have in ['Float'] out ['Float']"),
])
def test_a_mismatch_names_the_minority(tmp_path, culprit_entry, state, detail):
    dumps = {r: dump([entry(1), entry(2), entry(3)]) for r in (0, 1)}
    dumps[2] = dump([entry(1), culprit_entry, entry(3)])
    div, _inst = triage(tmp_path, dumps)
    assert (div["match_state"], div["seq"], div["culprit_ranks"], div["culprit_basis"]) == (state, 2, [2], "majority")
    assert div["detail"] == detail and div["mismatched"] == 1 and div["waiting_ranks"] == [0, 1]


def test_op_is_checked_before_size_and_a_tie_blames_the_higher_rank(tmp_path):
    dumps = {0: dump([entry(1)]), 1: dump([entry(1, "broadcast", size=(8,))])}
    div, _ = triage(tmp_path, dumps)
    assert (div["match_state"], div["culprit_ranks"], div["culprit_basis"]) == ("op_mismatch", [1], "tie")


def test_state_mismatch_names_the_least_advanced(tmp_path):
    dumps = {0: dump([entry(1, state="completed"), entry(2, state="started")]),
             1: dump([entry(1, state="completed"), entry(2, state="started")]),
             2: dump([entry(1, state="completed"), entry(2, state="scheduled")])}
    div, _ = triage(tmp_path, dumps)
    assert (div["match_state"], div["seq"], div["culprit_ranks"]) == ("state_mismatch", 2, [2])


def test_the_first_divergence_is_the_earliest_across_groups(tmp_path):
    # group 1 (a tp pair, ranks named by tracekit's agent) diverges at T0+5 ms; group 0 at T0+7 ms
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1]}, "1": {"desc": "tp", "ranks": [0, 1]}}
    g1 = ("1", "tp")
    r0 = [entry(1, t=T0 + 1_000_000, record_id=0), entry(1, pg=g1, t=T0 + 5_000_000, record_id=1),
          entry(2, t=T0 + 7_000_000, record_id=2)]
    r1 = [entry(1, t=T0 + 1_000_000, record_id=0), entry(1, "all_gather", pg=g1, t=T0 + 5_000_100, record_id=1),
          entry(2, "broadcast", t=T0 + 7_000_000, record_id=2)]
    dumps = {0: dump(r0, tracekit={"rank": 0, "groups": groups}), 1: dump(r1, tracekit={"rank": 1, "groups": groups})}
    div, inst = triage(tmp_path, dumps, form="json")
    assert (div["pg_name"], div["pg_desc"], div["dimension"], div["seq"], div["match_state"]) == ("1", "tp", "tp", 1, "op_mismatch")
    assert div["mismatched"] == 2 and {i["members_source"] for i in inst} == {"fr_groups"}


def test_analyze_json_and_terminal_show_the_triage(tmp_path, capsys):
    d = tmp_path / "d"
    write(d, 0, dump([entry(1), entry(2)]))
    write(d, 1, dump([entry(1)]))
    st = tmp_path / "s"
    assert main(["ingest", str(d), "--store", str(st)]) == 0
    capsys.readouterr()
    assert main(["analyze", "--store", str(st), "--json"]) == 0
    hang = json.loads(capsys.readouterr().out)["hang"]
    assert hang["divergence"]["match_state"] == "missing_ranks" and hang["divergence"]["culprit_ranks"] == [1]
    assert [r["seq"] for r in hang["diverging"]] == [2] and [x["rank"] for x in hang["dumps"]] == [0, 1]
    assert hang["divergence"]["waited_ns"] is None  # the dumps say not when they were taken, rank 0 issued nothing after
    assert main(["analyze", "--store", str(st)]) == 0
    out = capsys.readouterr().out
    assert "When the job hangs" in out and "first divergence: group 0 (default_pg), seq 2, all_reduce: missing_ranks" in out
    assert "up to — " in out
    html = tmp_path / "r.html"
    assert main(["analyze", "--store", str(st), "--html", str(html)]) == 0
    page = html.read_text()
    assert 'id="tk-sec-hang"' in page and "first divergence: group 0 (default_pg), seq 2" in page


def test_the_dumps_collectives_summary(tmp_path):
    from tracekit.report.data import build_report

    d = tmp_path / "d"
    timed = [entry(s, size=(256,)) for s in (1, 2, 3)]
    for e, ms in zip(timed, (1.0, 3.0, 2.0)):
        e["duration_ms"] = ms  # NCCL with TORCH_NCCL_ENABLE_TIMING: recorded on completion
    write(d, 0, dump(timed + [entry(4, "all_gather", size=(8,), out_size=(2, 8), dtype="Half")]))
    write(d, 1, dump([entry(s, size=(256,)) for s in (1, 2, 3)] + [entry(4, "all_gather", size=(8,), out_size=(2, 8), dtype="Half")]))
    st = Store(tmp_path / "s")
    rid = ingest_paths([d], st)
    rows = build_report(st, rid)["hang"]["collectives"]
    got = [(r["op"], r["in_bytes"], r["calls"], r["ranks"], r["instances"], r["bytes"], r["timed"], r["median_duration_ns"])
           for r in rows]
    # all_gather of 8 halves = 16 B per call; all_reduce of 256 floats = 1024 B; durations 1, 3, 2 ms → median 2 ms
    assert got == [("all_gather", 16, 2, 2, 1, 32, 0, None), ("all_reduce", 1024, 6, 2, 3, 6144, 3, 2_000_000)]


def test_the_timeline_offset_is_where_the_pairs_agree():
    import random

    from tracekit.analyses.hang import timeline_offset

    rnd = random.Random(7)
    off = 1_790_857_026_000_000_000
    kin, fr = [], []
    for r in (0, 1):
        t = 5_615_404_000_000_000 + r * 333_000
        for i in range(12):
            t += rnd.randrange(300_000, 3_000_000)  # 0.3-3 ms between calls
            kin.append((r, "0", "all_reduce", t)) if 3 <= i < 9 else None  # the trace's window: 6 calls per rank
            fr.append((r, "0", "all_reduce", t + off + rnd.randrange(10_000, 50_000)))  # stamped 10-50 µs later
    got, pairs = timeline_offset(kin, fr)
    assert pairs == 12 and off + 10_000 <= got <= off + 50_000
    # one call each on two ranks, at unrelated times: the two candidates disagree → no offset
    assert timeline_offset([(0, "0", "all_reduce", 10), (1, "0", "all_reduce", 5_000_000)],
                           [(0, "0", "all_reduce", 100), (1, "0", "all_reduce", 100)])[0] is None
    # a different op never pairs
    assert timeline_offset([(0, "0", "broadcast", 10), (0, "0", "broadcast", 20)], fr) == (None, 0)


# --------------------------------------------------------------------------- fault specs


def test_fault_specs():
    assert parse_fault("hang:1@3") == Fault("hang", 1, 3)
    assert parse_fault("desync:0@2") == Fault("op", 0, 2)
    assert parse_fault("delay:2@5:150") == Fault("delay", 2, 5, 150.0)
    assert parse_fault("delay:2@5:150").spec() == "delay:2@5:150"
    for bad in ("hang:1", "hang:x@1", "delay:1@2", "size:1@2:5", "crash:1@2"):
        with pytest.raises(BadInputError):
            parse_fault(bad)


# --------------------------------------------------------------------------- property: known truth by construction

from hypothesis import given, settings, strategies as hs  # noqa: E402

from tracekit.analyses.hang import triage as triage_rows  # noqa: E402
from tracekit.ingest.flight_recorder import entry_rows  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(2, 6), k=hs.integers(1, 8), data=hs.data())
def test_the_culprit_and_seq_are_the_ones_built_in(n, k, data):
    """n ranks issue all_reduce seq 1..k; one rank c diverges at seq s (1 ≤ s ≤ k) in one of three ways:
    it stops before s (never arrives), calls broadcast at s, or uses another shape at s. With n ≥ 3 the
    culprit is the minority; with n = 2 a mismatch is a tie (then the higher rank is named)."""
    c = data.draw(hs.integers(0, n - 1), label="culprit")
    s = data.draw(hs.integers(1, k), label="seq")
    how = data.draw(hs.sampled_from(["missing", "op", "size"]), label="how")
    rows = []
    for r in range(n):
        ents = []
        for q in range(1, k + 1):
            if r == c and how == "missing" and q >= s:
                break
            op = "broadcast" if (r == c and how == "op" and q == s) else "all_reduce"
            size = (2, 512) if (r == c and how == "size" and q == s) else (1024,)
            ents.append(entry(q, op, size=size))
        rows += entry_rows("x", r, dump(ents))
    inst, div = triage_rows({"run_id": "x", "world_size": n}, rows, [], [{"rank": r, "dumped_at_ns": None} for r in range(n)], {})
    want_state = {"missing": "missing_ranks", "op": "op_mismatch", "size": "size_mismatch"}[how]
    assert (div["match_state"], div["seq"]) == (want_state, s)
    if how == "missing" or n > 2:
        assert div["culprit_ranks"] == [c]
        assert div["culprit_basis"] == ("missing" if how == "missing" else "majority")
    else:  # a tie: the rank that differs from rank 0
        assert div["culprit_ranks"] == [1] and div["culprit_basis"] == "tie"
    # a rank that stopped misses every later seq too; a mismatch is one instance
    assert div["mismatched"] == (k - s + 1 if how == "missing" else 1) and div["instances"] == k


def test_fr_with_nsys_is_refused():
    from tracekit.collectors.profile.runner import ProfileOptions

    with pytest.raises(BadInputError, match="--nsys"):
        ProfileOptions(fr=True, nsys=True).validated()
    with pytest.raises(BadInputError, match="--fr-buffer"):
        ProfileOptions(fr=True, fr_buffer=0).validated()
    with pytest.raises(BadInputError, match="--timeout"):
        ProfileOptions(timeout_s=0).validated()
