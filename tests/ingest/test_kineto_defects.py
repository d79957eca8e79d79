"""Each defect real exporters produce, on its hand-made fixture (fixtures/defects/, see NOTE.md)."""

from __future__ import annotations

import json

from tracekit import analyses
import pytest

from tests.conftest import FIXTURES
from tracekit.cli import main
from tracekit.ingest import ingest_paths, rank_from_filename
from tracekit.ingest.kineto import text_to_ns
from tracekit.store import Store

D = FIXTURES / "defects"


def ingest(tmp_path, name, **kw):
    store = Store(tmp_path / "store")
    rid = ingest_paths([D / name], store, **kw)
    return analyses.connect(store), rid


def test_bare_inf_nan_tokens_are_read(tmp_path):
    con, _ = ingest(tmp_path, "inf_nan.json")
    assert con.execute("SELECT count(*) FROM events").fetchone() == (3,)
    (warnings,) = con.execute("SELECT warnings FROM ranks").fetchone()
    assert "3 bare inf/NaN token(s) read as null" in warnings


def test_ts_zero_events_are_quarantined_not_the_start(tmp_path):
    con, _ = ingest(tmp_path, "ts_zero.json")
    assert con.execute("SELECT events, events_quarantined FROM ranks").fetchone() == (2, 2)
    # the trace starts at the first real kernel, 1,000,000 µs = 1e9 ns
    assert con.execute("SELECT min(ts_ns), list(name ORDER BY ts_ns) FROM events").fetchone() == (
        1_000_000_000, ["gemm_a", "gemm_b"]
    )


def test_ts_from_decimal_text_is_exact(tmp_path):
    con, _ = ingest(tmp_path, "ts_text.json")
    rows = con.execute("SELECT name, ts_ns, dur_ns FROM events ORDER BY ts_ns").fetchall()
    assert rows == [
        ("aten::add", 12_345_678_901_234_567, 1_001),  # 17 significant digits, float in JSON
        ("aten::mm", 1_712_195_495_519_689_047, 12_500),  # a string ts
        ("aten::relu", 1_712_195_495_519_700_999, 1),
    ]


@pytest.mark.parametrize(
    "text, ns",
    [("1712195495519689.047", 1712195495519689047), ('"12.5"', 12500), ("-3.25", -3250), ("1e3", 1_000_000),
     ("null", None), ("inf", None), ("abc", None), ("0.0006", 1), ("0.0005", 0)],
)
def test_text_to_ns(text, ns):
    assert text_to_ns(text) == ns


def test_keys_after_trace_events(tmp_path):
    store = Store(tmp_path / "s")
    from tracekit.ingest.kineto import read_rank_file
    import re

    rf = read_rank_file(D / "keys_after_events.json", tmp_path / "raw.parquet", re.compile("nccl"))
    assert rf.meta["baseTimeNanoseconds"] == 1700000000000000000
    assert rf.meta["distributedInfo"]["rank"] == 5
    assert rf.meta["traceName"] == 'x ] } , " tricky'
    con, _ = ingest(tmp_path, "keys_after_events.json")
    assert con.execute("SELECT rank, events FROM ranks").fetchone() == (5, 1)
    del store


def test_invalid_utf8_names_are_kept_with_replacement(tmp_path):
    con, _ = ingest(tmp_path, "bad_utf8.json")
    names = [r[0] for r in con.execute("SELECT name FROM events ORDER BY ts_ns").fetchall()]
    assert names == ["aten::\ufffd\ufffdweird", "aten::fine"]


def test_overlapping_kernels_clipped_and_noise_tolerated(tmp_path):
    con, _ = ingest(tmp_path, "overlapping_kernels.json")
    rows = con.execute("SELECT name, ts_ns, dur_ns, clipped, clipped_ns FROM events ORDER BY ts_ns").fetchall()
    assert rows == [
        ("k1", 1_000_000_000, 10_000, True, 5_000),  # [0, 15] µs overlaps k2 at 10 µs by 5 µs: cut
        ("k2", 1_000_010_000, 10_000, False, 0),  # overlaps k3 by 50 ns: clock noise, kept
        ("k3", 1_000_019_950, 5_000, False, 0),
    ]
    (w,) = con.execute("SELECT warnings FROM ranks").fetchone()
    assert any("1 GPU event(s) overlapped" in x for x in w)


def test_kernel_before_its_launch_is_kept_with_warning(tmp_path):
    con, _ = ingest(tmp_path, "kernel_before_launch.json")
    assert con.execute("SELECT count(*) FROM events WHERE name = 'early_kernel' AND launch_event_id IS NOT NULL").fetchone() == (1,)
    (w,) = con.execute("SELECT warnings FROM ranks").fetchone()
    assert any("start before their own launch call (largest skew 3.000 µs)" in x for x in w)


def test_sync_is_never_compute(tmp_path):
    """NCCL [0,100] µs; other stream: sync [0,100] + GEMM [60,100] → overlap 40 %."""
    con, _ = ingest(tmp_path, "sync_not_compute.json")
    assert con.execute("SELECT class FROM events WHERE name = 'Stream Sync'").fetchone() == ("sync",)
    assert con.execute("SELECT overlap_ratio FROM overlap_by_rank").fetchone()[0] == pytest.approx(0.4, abs=1e-12)


def test_all_to_all_split_sizes(tmp_path):
    con, _ = ingest(tmp_path, "alltoall_splits.json")
    rows = con.execute("SELECT op, size_bytes, wire_bytes, in_splits, approx FROM collectives ORDER BY ts_ns").fetchall()
    # rank 0 of 4, input splits [11, 12, 13, 14] elements: sends 12 + 13 + 14 = 39 elements × 4 B
    assert rows[0] == ("all_to_all", 50 * 4, 39 * 4, [11, 12, 13, 14], False)
    # a split list cut by the profiler after 30 entries: approx, wire from the even-split bound
    assert rows[1][0] == "all_to_all" and rows[1][4] is True and rows[1][2] == round(3 / 4 * 64 * 4)
    # "[]" means even splits: (k−1)/k · S = 3/4 · 192
    assert rows[2] == ("all_to_all", 48 * 4, 144, [], False)


@pytest.mark.parametrize("name, rank", [("rank-3.json", 3), ("rank3.json", 3), ("worker3.pt.trace.json", 3),
                                        ("rank_3.json.gz", 3), ("trace.json", None), ("myrank7.json", None)])
def test_rank_from_filename(name, rank):
    assert rank_from_filename(name) == rank


def test_ranks_from_file_names_and_metadata_only_rank(tmp_path):
    con, _ = ingest(tmp_path, "rank_names")
    rows = con.execute("SELECT rank, events, warnings FROM ranks ORDER BY rank").fetchall()
    assert [(r, n) for r, n, _ in rows] == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 0)]
    assert any("metadata only" in w for w in rows[4][2])


def test_custom_all_reduce_builtin_and_user_pattern(tmp_path):
    con, _ = ingest(tmp_path, "custom_allreduce.json")
    assert con.execute("SELECT name FROM events WHERE class = 'comm'").fetchall() == [
        ("void vllm::cross_device_reduce_1stage<float, 2>(...)",)
    ]
    assert con.execute("SELECT op FROM collectives").fetchall() == [("all_reduce",)]
    store = Store(tmp_path / "s2")
    ingest_paths([D / "custom_allreduce.json"], store, comm_patterns=[r"fancy_allreduce"])
    con2 = analyses.connect(store)
    assert con2.execute("SELECT count(*) FROM events WHERE class = 'comm'").fetchone() == (2,)
    # comm by a user's pattern, no metadata: counted in overlap, unattributed
    assert con2.execute("SELECT count(*) FROM collectives WHERE op IS NULL").fetchone() == (1,)


def test_bad_comm_pattern_exits_2(tmp_path, capsys):
    assert main(["ingest", str(D / "custom_allreduce.json"), "--store", str(tmp_path / "s"), "--comm-pattern", "("]) == 2
    assert "--comm-pattern" in capsys.readouterr().err


def test_clock_alignment_across_hosts(tmp_path):
    """Rank 1's clock reads 5,000 µs ahead; its ends match rank 0's except one 200 µs outlier."""
    con, _ = ingest(tmp_path, "two_hosts")
    assert con.execute("SELECT rank, host, clock_offset_ns, clock_offset_err_ns FROM ranks ORDER BY rank").fetchall() == [
        (0, "node-a", 0, 0), (1, "node-b", -5_000_000, 1)
    ]
    # after alignment rank 1 arrives 2 µs after rank 0, except instance 2 where it straggles by 42 µs
    rows = con.execute("SELECT seq, straggler, skew_ns FROM collective_instances ORDER BY seq").fetchall()
    assert rows == [(0, 1, 2_000), (1, 1, 2_000), (2, 1, 42_000), (3, 1, 2_000), (4, 1, 2_000)]


def test_clock_alignment_can_be_turned_off(tmp_path):
    con, _ = ingest(tmp_path, "two_hosts", align="none")
    assert con.execute("SELECT max(abs(clock_offset_ns)) FROM ranks").fetchone() == (0,)
    assert con.execute("SELECT min(skew_ns) FROM collective_instances").fetchone() == (5_002_000,)


def test_bad_align_value(tmp_path, capsys):
    assert main(["ingest", str(D / "two_hosts"), "--store", str(tmp_path / "s"), "--align", "sideways"]) == 2


def test_integer_ts_too_large_for_ns_is_quarantined(tmp_path):
    """An integer µs ts whose ×1000 would overflow int64 is quarantined, never wrapped."""
    p = tmp_path / "rank0.json"
    p.write_text('{"traceEvents": ['
                 '{"ph": "X", "cat": "cpu_op", "name": "ok", "pid": 1, "tid": 1, "ts": 1000000, "dur": 5},'
                 '{"ph": "X", "cat": "cpu_op", "name": "huge", "pid": 1, "tid": 1, "ts": 9300000000000000, "dur": 5}]}')
    store = Store(tmp_path / "s")
    ingest_paths([p], store)
    con = analyses.connect(store)
    assert con.execute("SELECT list(name), min(ts_ns) FROM events").fetchone() == (["ok"], 1_000_000_000)
    assert con.execute("SELECT events_quarantined FROM ranks").fetchone() == (1,)


@pytest.fixture(params=["1", "0"], ids=["msgspec", "scanner"])
def both_decoders(request, monkeypatch):
    monkeypatch.setenv("TRACEKIT_NO_KSCAN", request.param)


def test_begin_end_pairs_nest_per_thread_and_missing_phase_is_counted(tmp_path, both_decoders):
    con, _ = ingest(tmp_path, "begin_end.json")
    rows = con.execute("SELECT name, ts_ns, dur_ns FROM events ORDER BY ts_ns").fetchall()
    # by hand from make_defects.py (BASE = 1e6 µs): ProfilerStep#1 B at BASE, its E at BASE+100;
    # aten::mm B at BASE+10.5, its E (the latest B open on tid 1) at BASE+30.25
    assert rows == [("ProfilerStep#1", 1_000_000_000, 100_000), ("aten::mm", 1_000_010_500, 19_750),
                    ("aten::add", 1_000_040_000, 5_000)]
    events, quarantined, warnings = con.execute("SELECT events, events_quarantined, warnings FROM ranks").fetchone()
    assert (events, quarantined) == (3, 2 + 2)  # two without "ph", one B never ended, one E without a B
    assert '2 event(s) without a "ph" (phase) quarantined' in warnings
    assert ("unpaired duration events quarantined: 1 B without an E ('never_ended', pid/tid 1/2); "
            "1 E without a B (unnamed, pid/tid 1/2)") in warnings


def test_begin_end_pairs_across_chunks(tmp_path, monkeypatch):
    from tracekit.ingest.jsonstream import TraceStream

    monkeypatch.setattr(TraceStream.__init__, "__defaults__", (256, True))  # a chunk holds ~2 events
    evs = [{"ph": "B", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 1000 + i} for i in range(20)]
    evs += [{"ph": "E", "pid": 1, "tid": 1, "ts": 2000 + i} for i in range(20)]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"traceEvents": evs}))
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NO_KSCAN", flag)
        store = Store(tmp_path / f"s{flag}")
        ingest_paths([f], store)
        got = store.connect().execute("SELECT name, ts_ns, dur_ns FROM events ORDER BY ts_ns").fetchall()
        # stack order: op19 ends first (at 2000 µs), op0 last (at 2019 µs)
        assert got == [(f"op{i}", (1000 + i) * 1000, (2019 - i - (1000 + i)) * 1000) for i in range(20)], flag


def test_broken_strings_are_repaired_or_quarantined_event_by_event(tmp_path, both_decoders):
    con, _ = ingest(tmp_path, "broken_strings.json")
    names = [r[0] for r in con.execute("SELECT name FROM events WHERE category = 'python_function' ORDER BY ts_ns").fetchall()]
    assert names == ['print("hi") at f.py', "line one\nline two", "C:\\Users\\me\\work\\step.py(12)", "caf\ufffd.py(3): f"]
    events, quarantined, warnings = con.execute("SELECT events, events_quarantined, warnings FROM ranks").fetchone()
    assert (events, quarantined) == (5, 1)  # "ts": 1000005.0.0 is no number: that event only is lost
    assert "4 event(s) with broken text repaired" in warnings
    assert "1 malformed event(s) quarantined" in warnings
    # the communication after the broken events is still read, with its metadata
    assert con.execute("SELECT op, size_bytes, dur_ns FROM collectives").fetchall() == [("all_reduce", 4096, 20_000)]


def test_comm_pattern_cannot_hang_the_ingest(tmp_path, capsys):
    # '(a+)+$' backtracks exponentially in Python's re on 'aaaa...b': it must be run by a
    # linear-time engine or refused, never hang
    import time

    name = "a" * 40 + "b"
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": nm, "pid": 0, "tid": 7, "ts": ts, "dur": 5, "args": {"device": 0, "stream": 7}}
        for nm, ts in ((name, 1000), ("my_kernel_aaa", 2000))]}))
    t0 = time.monotonic()
    rc = main(["ingest", str(f), "--store", str(tmp_path / "s"), "--comm-pattern", "(a+)+$"])
    assert time.monotonic() - t0 < 60  # a hang is minutes; this is a bound, not a timing
    err = capsys.readouterr().err
    from tracekit.ingest.comm_families import re2

    if re2 is None:
        assert rc == 2 and err.count("\n") == 1 and "nested quantifier" in err
    else:
        assert rc == 0
        con = Store(tmp_path / "s").connect()
        # '(a+)+$' does not match '...ab', and matches 'my_kernel_aaa'
        assert con.execute("SELECT class FROM events ORDER BY ts_ns").fetchall() == [("compute",), ("comm",)]


@pytest.mark.parametrize("pattern, why", [("(a+)+$", "nested quantifier"), (r"(a)\1", "backreference"),
                                          ("(a|aa)*c", "nested quantifier")])
def test_slow_patterns_refused_without_re2(pattern, why, monkeypatch):
    from tracekit.errors import BadInputError
    from tracekit.ingest import comm_families

    monkeypatch.setattr(comm_families, "re2", None)
    with pytest.raises(BadInputError, match=why):
        comm_families.compile_comm_patterns([pattern])
    assert comm_families.compile_comm_patterns(["my_allreduce", "^x+y"]).search("foo_my_ALLREDUCE")


def test_slow_pattern_refused_at_the_command_line_without_re2(tmp_path, capsys, monkeypatch):
    from tests.conftest import store_snapshot
    from tracekit.ingest import comm_families

    monkeypatch.setattr(comm_families, "re2", None)
    store = tmp_path / "s"
    assert main(["ingest", str(D / "custom_allreduce.json"), "--store", str(store)]) == 0
    before = store_snapshot(store)
    capsys.readouterr()
    rc = main(["ingest", str(D / "ts_zero.json"), "--store", str(store), "--comm-pattern", "(x+)+y"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1
    assert lines[0] == ("tracekit: --comm-pattern '(x+)+y' has a nested quantifier, which can make matching take "
                        "exponential time (install google-re2, or simplify the pattern)")
    assert store_snapshot(store) == before
