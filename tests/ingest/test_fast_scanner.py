"""The C scanner (tracekit.ingest._kscan) against the msgspec reader it speeds up.

The msgspec path (``TRACEKIT_NO_KSCAN=1``) is the reference: every store built
with the scanner must equal, row for row, the store built without it; where the
two ever differed, the right value is checked by hand (exact decimal ns).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import duckdb
import msgspec
import numpy as np
import pytest

from tests.conftest import FIXTURES, TRACES
from tracekit.errors import FileError
from tracekit.ingest import ingest_paths
from tracekit.ingest import jsonstream
from tracekit.ingest.jsonstream import Chunk, FastChunk, TraceStream, fast_scanner_available
from tracekit.ingest.kineto import REC_DTYPE, text_to_ns

kscan = pytest.importorskip("tracekit.ingest._kscan", reason="the C scanner is not built")


def test_scanner_is_built_and_matches_the_record_layout():
    # pip install builds it on this machine kind (gcc and Python headers are there); a
    # silently missing scanner would make every ingest take the slow path
    assert fast_scanner_available()
    assert REC_DTYPE.itemsize == kscan.RECORD_SIZE == 104


def test_scanner_reads_the_args_keys_of_the_one_table():
    # the C scanner's key list (exported as _kscan.ARG_KEYS) is kineto.ARGS' "id" and "flag"
    # rows: same spellings, each integer into the REC field REC_DTYPE names, same flag bits
    from tracekit.ingest.kineto import _F_ODD, ARG_BITS, ARGS, PH_B, PH_E, PH_M, PH_NONE, PH_OTHER, PH_X

    want = [(a.key, a.rec, REC_DTYPE.fields[a.rec][1] if a.rec else -1, ARG_BITS[a.field])
            for a in ARGS if a.role in ("id", "flag")]
    assert list(kscan.ARG_KEYS) == want
    assert [k for k, *_ in want] == ["correlation", "External id", "external id", "device", "stream",
                                     "Collective name", "In msg nelems"]
    src = (Path(jsonstream.__file__).parent / "_kscan.c").read_text()
    assert f"#define F_ODD {_F_ODD} " in src
    assert kscan.PHASES == {"other": PH_OTHER, "X": PH_X, "M": PH_M, "B": PH_B, "E": PH_E, "none": PH_NONE}
    # every other key is skipped: a key that is ours spelled differently sets nothing
    _, _, r, _, _ = _scan('{"ph":"X","args":{"Correlation":5,"correlation ":6,"stream":7}}]')
    assert (r["fl"][0], r["strm"][0], r["corr"][0]) == (ARG_BITS["stream"], 7, 0)


def test_phases_missing_null_and_begin_end():
    _, _, r, _, _ = _scan('{"ts":1},{"ph":null},{"ph":"B"},{"ph":"E"},{"ph":"i"},{"ph":5},{"ph":"XX"}]')
    assert r["ph"].tolist() == [5, 5, 3, 4, 0, 0, 0]


# -- the scanner itself --------------------------------------------------------------------


def _scan(text: str | bytes):
    b = text.encode() if isinstance(text, str) else text
    st, off, recs, strings, tc = kscan.scan(b, 0)
    return st, off, np.frombuffer(recs, REC_DTYPE), strings, tc


def test_statuses_more_closed_unsupported():
    st, off, r, _, _ = _scan('{"ph":"X","ts":1},{"ph":"X","ts":2}, {"ph":"X"')
    assert (st, len(r)) == (0, 2)
    assert off == len('{"ph":"X","ts":1},{"ph":"X","ts":2}, ')  # where the cut event starts
    st, off, r, _, tc = _scan('{"ph":"X","ts":1}\n]\n, "traceName": "x"}')
    assert (st, off, len(r), tc) == (1, 18, 1, 0)
    st, off, r, _, tc = _scan('{"ph":"X","ts":1},\n]')
    assert (st, len(r), tc) == (1, 1, 1)  # trailing comma reported
    st, off, r, _, _ = _scan('{"ph":"X","ts":1},{"ph":"X","ts":NaN},{"ph":"X","ts":3}]')
    assert (st, off, len(r)) == (2, 18, 1)  # stops at the NaN event, keeps the one before
    st, off, r, _, _ = _scan('{"ph":"X","ts":1} {"ph":"X"}]')  # missing comma
    assert (st, off, len(r)) == (2, 0, 0)
    st, off, r, _, _ = _scan("  ]")
    assert (st, off, len(r)) == (1, 2, 0)
    # an event whose separator has not arrived yet is not taken
    st, off, r, _, _ = _scan('{"ph":"X","ts":1}  ')
    assert (st, off, len(r)) == (0, 0, 0)


@pytest.mark.parametrize(
    "text,ns,ok",
    [
        ("1669783687464181", 1669783687464181000, 1),
        ("4458676780056.763", 4458676780056763, 1),  # above 2^42 µs: a double cannot say this
        ("1712195495533685.110", 1712195495533685110, 1),  # epoch µs with decimals (19 digits)
        ("1.0005", 1000, 1),  # half to even, as Decimal
        ("1.0015", 1002, 1),
        ("1.5e3", 1500000, 1),
        ("25E-1", 2500, 1),
        ("-0", 0, 1),
        ("0.0000001", 0, 1),
        ("9223372036854774", 9223372036854774000, 1),
        ("9223372036854775", 0, 0),  # (2^63-1)//1000 µs: out of range, as the msgspec path says
        ("9223372036854775.9", 0, 0),  # x1000 overflows int64: not ok (quarantined)
        ("null", 0, 0),
    ],
)
def test_times_are_exact_decimal_ns(text, ns, ok):
    st, _, r, _, _ = _scan('{"ph":"X","ts":%s,"dur":%s}]' % (text, text))
    assert st == 1
    assert (int(r["ts"][0]), int(r["ts_ok"][0])) == (ns, ok)
    assert (int(r["dur"][0]), int(r["dur_ok"][0])) == (ns, ok)
    if ok:
        assert text_to_ns(text) == ns  # the msgspec path's exact converter agrees


def test_strings_escapes_and_ids():
    name = 'a\\"b\\\\c\\u00e9\\ud83d\\ude00\\n'
    st, _, r, strings, _ = _scan(
        '{"ph":"X","name":"%s","cat":"kernel","pid":"Traces","tid":"stream 7","ts":1,"dur":2,'
        '"args":{"External id":5,"correlation":17,"device":3,"stream":7,"Collective name":"x","foo":[1,{"a":"]"}]}},'
        '{"ph":"M","name":"thread_name","pid":12,"tid":-3,"args":{"name":"gloo"}}]' % name
    )
    assert st == 1
    e = r[0]
    assert strings[e["name"]] == json.loads('"%s"' % name)
    assert strings[e["cat"]] == "kernel"
    assert (e["pid_k"], strings[e["pid"]], e["tid_k"], strings[e["tid"]]) == (1, "Traces", 1, "stream 7")
    assert (e["ext_u"], e["corr"], e["dev"], e["strm"]) == (5, 17, 3, 7)
    assert e["fl"] == 1 | 2 | 8 | 16 | 64  # corr, External id, device, stream, Collective name
    m = r[1]
    assert (m["ph"], m["pid_k"], m["pid"], m["tid"]) == (2, 0, 12, -3)


def test_odd_id_values_are_flagged_for_the_general_decoder():
    st, _, r, _, _ = _scan('{"ph":"X","args":{"correlation":"77","External id":null,"external id":4}}]')
    assert st == 1
    assert r["fl"][0] & 32  # a string correlation: decoded with msgspec by the caller
    assert r["fl"][0] & 4 and not r["fl"][0] & 2  # null "External id" falls back to "external id"
    assert r["ext_l"][0] == 4


@pytest.mark.parametrize(
    "bad",
    [
        b'{"ph":"X","name":"\xff"}]',  # invalid UTF-8 in a name
        b'{"ph":"X","args":{"s":"\xc3\x28"}}]',  # ... and in a value nobody reads
        b'{"ph":"X","name":"\\ud800"}]',  # lone surrogate
        b'{"ph":"X","name":"a\x01b"}]',  # raw control character
        b'{"ph":"X","ts":"12.5"}]',  # a time given as a string (the msgspec path reads it exactly)
        b'{"ph":"X","pid":1.5}]',
        b'{"ph":"X","ts":Infinity}]',
        b'{"ph":"X","args":' + b"[" * 300 + b"]" * 300 + b"}]",  # nesting beyond the scanner's depth
        b'{"ph":"X","na\\u006de":"x"}]',  # an escaped key
        b'{"ph":"X","args":{"Input Strides":[[1e16384]]}}]',  # beyond a double: msgspec refuses it
        b'{"ph":"X","args":{"x":-18e307}}]',
    ],
)
def test_what_the_scanner_does_not_take_goes_to_the_general_reader(bad):
    st, off, r, _, _ = _scan(bad)
    assert (st, off, len(r)) == (2, 0, 0)


# -- whole files: scanner and msgspec path give the same events --------------------------


def _events_of(path: Path, block: int, fast: bool, monkeypatch) -> list[tuple]:
    monkeypatch.setenv("TRACEKIT_NO_KSCAN", "0" if fast else "1")
    out = []
    for ch in TraceStream(path, block=block):
        if isinstance(ch, FastChunk):
            for e in np.frombuffer(ch.records, REC_DTYPE).tolist():
                d = dict(zip(REC_DTYPE.names, e))
                a = ch.text[d["a_s"] : d["a_e"]] if d["a_s"] >= 0 else b"null"
                name = ch.strings[d["name"]] if d["name"] >= 0 else None
                out.append((d["ph"], name, d["ts"] if d["ts_ok"] else None, msgspec.json.decode(a)))
        else:
            assert isinstance(ch, Chunk)
            for e in ch.events:
                ph = 1 if e.ph == "X" else 2 if e.ph == "M" else 0
                out.append((ph, e.name, text_to_ns(msgspec.json.encode(e.ts)), msgspec.json.decode(e.args)))
    return out


@pytest.mark.parametrize("block", [37, 256, 4096, 1 << 20])
def test_block_boundaries_do_not_change_events(block, monkeypatch):
    path = FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz"
    ref = _events_of(path, 1 << 22, fast=False, monkeypatch=monkeypatch)
    got = _events_of(path, block, fast=True, monkeypatch=monkeypatch)
    assert len(got) == len(ref) > 500
    assert got == ref


def test_fallback_mid_file_keeps_every_event(tmp_path, monkeypatch):
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 1000 + i, "dur": 1} for i in range(50)]
    text = json.dumps({"traceEvents": evs}).replace('"ts": 1030', '"ts": NaN')
    f = tmp_path / "t.json"
    f.write_text(text)
    s = TraceStream(f, block=300)
    kinds = [type(ch).__name__ for ch in s]
    assert "FastChunk" in kinds and "Chunk" in kinds  # scanner first, msgspec after the NaN
    assert s.slow_from is not None
    assert "1 bare inf/NaN token(s) read as null" in s.notes
    got = _events_of(f, 300, fast=True, monkeypatch=monkeypatch)
    assert [g[1] for g in got] == [f"op{i}" for i in range(50)]
    assert got[30][2] is None and got[29][2] == 1029000


def test_truncated_gzip_is_a_file_error_from_the_decompressing_thread(tmp_path):
    raw = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "ts": i, "dur": 1} for i in range(20000)]}).encode())
    f = tmp_path / "cut.json.gz"
    f.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(FileError, match="truncated gzip stream"):
        for _ in TraceStream(f, block=4096):
            pass


# -- stores: scanner vs msgspec path, row for row ------------------------------------------

_TARGETS = [  # every Kineto fixture and every shared Kineto trace
    "fixtures/tp_2rank",
    "fixtures/tp_chunks_2rank",
    "fixtures/ep_2rank",
    "fixtures/pp_2rank",
    "fixtures/pp_decode_2rank",
    "fixtures/kv_layerwise_2rank",
    "fixtures/kv_bulk_2rank",
    "fixtures/sweep_2rank",
    "fixtures/handmade/two_rank",
    "fixtures/defects/two_hosts",
    "fixtures/defects/rank_names",
] + [f"fixtures/defects/{p.name}" for p in sorted((FIXTURES / "defects").glob("*.json"))] + [
    "traces/param_dlrm_8rank_v100",
    "traces/hta_ddp_v100_r1of2",
    "traces/hta_nccl_parser_a100_r0of2",
    "traces/hta_pyper_a100_r0of16",
    "traces/hta_ws1_record_param_comms_v100",
    "traces/tracelens_b200_r0of8",
    "traces/hta_cpu_only_gloo/v_head",
    "traces/hta_cpu_only_gloo/v_b8cce2c",
    "traces/kineto_legacy_2021/worker0.pt.trace.json.gz",
    "traces/kineto_legacy_2021/worker0.1623143089861.pt.trace.json.gz",
    "traces/single_gpu_compute/mi250",
    "traces/single_gpu_compute/h100",
    "traces/single_gpu_compute/mi300",
]


def _target(rel: str) -> Path:
    if rel.startswith("traces/"):
        p = TRACES / rel[len("traces/") :]
        if not p.exists():
            pytest.skip(f"../shared/{rel} is not available")
        return p
    return FIXTURES.parent / rel


def _table_diff(a: Path, b: Path, pattern: str, exclude: str = "") -> tuple[int, int]:
    con = duckdb.connect()
    fa = sorted(str(p) for p in a.glob(pattern))
    fb = sorted(str(p) for p in b.glob(pattern))
    assert fa and len(fa) == len(fb)
    qa = f"SELECT * {exclude} FROM read_parquet({fa}, hive_partitioning=false)"
    qb = f"SELECT * {exclude} FROM read_parquet({fb}, hive_partitioning=false)"
    n1 = con.execute(f"SELECT count(*) FROM ({qa} EXCEPT ALL {qb})").fetchone()[0]
    n2 = con.execute(f"SELECT count(*) FROM ({qb} EXCEPT ALL {qa})").fetchone()[0]
    return n1, n2


@pytest.mark.parametrize("rel", _TARGETS)
def test_store_with_scanner_equals_store_without(rel, tmp_path, monkeypatch):
    src = _target(rel)
    monkeypatch.setenv("TRACEKIT_NO_KSCAN", "1")
    ingest_paths([src], tmp_path / "slow")
    monkeypatch.setenv("TRACEKIT_NO_KSCAN", "0")
    ingest_paths([src], tmp_path / "fast")
    for pattern, excl in [
        ("runs/*/events/*.parquet", ""),
        ("runs/*/collectives.parquet", ""),
        ("runs/*/ranks.parquet", ""),
        ("runs/*/run.parquet", "EXCLUDE (created_at)"),
    ]:
        assert _table_diff(tmp_path / "fast", tmp_path / "slow", pattern, excl) == (0, 0), pattern


def test_slow_path_exact_above_2_pow_42_us(tmp_path, monkeypatch):
    # hta_nccl_parser's timestamps (~4.46e12 µs) sit between 2^42 µs and the old 2^52/1000
    # bound, where round(x*1000) on a double is off by 1 ns; both paths must give the text
    evs = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 4458676780056.763, "dur": 1.5}]
    f = tmp_path / "rank0.json"
    f.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
                 '"ts": 4458676780056.763, "dur": 1.5}]}')
    assert evs[0]["ts"] * 1000 != 4458676780056763  # the double product really is off
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NO_KSCAN", flag)
        store = tmp_path / f"s{flag}"
        ingest_paths([f], store)
        ts = duckdb.connect().execute(
            f"SELECT ts_ns, dur_ns FROM read_parquet('{store}/runs/*/events/*.parquet')"
        ).fetchall()
        assert ts == [(4458676780056763, 1500)]


def test_without_the_scanner_module_the_reader_still_works(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "_kscan", None)
    assert not fast_scanner_available()
    kinds = {type(ch).__name__ for ch in TraceStream(FIXTURES / "tp_2rank" / "rank1.pt.trace.json.gz")}
    assert kinds == {"Chunk"}


def test_metadata_table_written_in_small_batches_gives_the_same_store(tmp_path, monkeypatch):
    import tracekit.ingest.kineto as kineto

    src = FIXTURES / "ep_2rank"
    ingest_paths([src], tmp_path / "mem")
    monkeypatch.setattr(kineto, "META_BATCH_ROWS", 3)  # a batch of the table after nearly every chunk
    flushed = []
    real = kineto.RankFile.flush_meta

    def spy(self, path):
        flushed.append(self.meta_pending)
        real(self, path)

    monkeypatch.setattr(kineto.RankFile, "flush_meta", spy)
    ingest_paths([src], tmp_path / "batches")
    assert sum(flushed) > 10
    for pattern in ("runs/*/events/*.parquet", "runs/*/collectives.parquet", "runs/*/ranks.parquet"):
        assert _table_diff(tmp_path / "mem", tmp_path / "batches", pattern) == (0, 0), pattern
    assert not list((tmp_path / "batches").rglob("*.meta"))  # the tables do not outlive the ingest


def test_meta_rows_columns_and_rows(tmp_path):
    import tracekit.ingest.staging as staging
    from tracekit.ingest.linkpass import ById

    rf = staging.RankFile(path=tmp_path / "x", sha256="", meta={})
    want = []
    for i in range(50):
        row = dict(event_id=10 * i, name=f"op{i % 4}", gpu=i % 3 == 0, device=i % 2, track=None if i % 5 == 0 else 7,
                   ts_ns=1000 + i, dur_ns=5 * i, input_dims=[[i, 2]], correlation=np.int64(i) if i % 2 else None)
        want.append(dict(row, correlation=None if row["correlation"] is None else int(row["correlation"])))
        rf.comm_meta.append(row)
        if i % 7 == 6 and i < 40:
            rf.flush_meta(tmp_path / "m.meta")
    rf.close_meta()
    assert len(rf.comm_meta) == 0 and (tmp_path / "m.meta").exists()
    rf.comm_meta.append(dict(event_id=999, name="late", gpu=False, device=None, track=None, ts_ns=1, dur_ns=2))
    want.append(dict(rf.comm_meta[-1]))
    times = {30: (1, 2), 470: (3, 4)}  # rows 3 and 47
    for w in want:
        if w["event_id"] in times:
            w["ts_ns"], w["dur_ns"] = times[w["event_id"]]
    m = rf.meta_rows(ById(np.array([30, 470]), [np.array([1, 3]), np.array([2, 4])], [None, None]))
    assert len(m) == 51
    assert [m.row(i) for i in range(51)] == want
    assert m.ts_ns.tolist() == [w["ts_ns"] for w in want] and m.dur_ns.tolist() == [w["dur_ns"] for w in want]
    assert m.gpu.tolist() == [w["gpu"] for w in want]
    assert [m.names[k] for k in m.name] == [w["name"] for w in want]
    assert [m.threads[k] for k in m.thread] == [(w["device"], w["track"]) for w in want]
    assert m.names_where(lambda nm: nm == "op1").tolist() == [i % 4 == 1 for i in range(50)] + [False]
    rf.remove_meta()
    assert not (tmp_path / "m.meta").exists()


def test_mutated_events_never_accepted_unless_valid_json():
    """Random byte mutations of a real trace: whatever the scanner accepts is valid JSON
    with exactly as many events as it reported, and it never reads past the buffer."""
    import random

    base = gzip.open(FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz").read()
    body = base[base.index(b"[", base.index(b'"traceEvents"')) + 1 :][:20000]
    toks = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\\u", b"\\ud800", b"\xff", b"\xc3", b"1e",
            b"-", b".", b"null", b"NaN", b" ", b"\n", b"0", b"9" * 25, b"1e999", b'"ts":', b'"args":']
    rnd = random.Random(20261129)
    accepted = 0
    for _ in range(3000):
        b = bytearray(body[: rnd.randrange(1, len(body))])
        for _ in range(rnd.randrange(1, 6)):
            p = rnd.randrange(len(b) + 1)
            op = rnd.random()
            if op < 0.4:
                b[p:p] = rnd.choice(toks)
            elif op < 0.7:
                del b[p : p + rnd.randrange(1, 8)]
            else:
                b[p : p + 1] = bytes([rnd.randrange(256)])
        st, off, recs, _, _ = kscan.scan(bytes(b), 0)
        assert 0 <= off <= len(b) and len(recs) % kscan.RECORD_SIZE == 0
        n = len(recs) // kscan.RECORD_SIZE
        if n:
            evs = msgspec.json.decode(b"[" + bytes(b[:off]).rstrip().rstrip(b",") + b"]")
            assert len(evs) == n
            accepted += n
    assert accepted > 10000


def test_ts_given_as_lists_is_quarantined_not_a_crash(tmp_path, monkeypatch):
    # found by the mutation property test: every ts of a chunk an empty list made numpy build a
    # 2-D array in the msgspec path's vector conversion (IndexError)
    from tracekit.ingest.kineto import _vector_ns

    out, ok = _vector_ns([[]], lambda: [], "ts")
    assert out.tolist() == [0] and ok.tolist() == [False]
    f = tmp_path / "rank0.json"
    f.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": [], "dur": 1}]}')
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NO_KSCAN", flag)
        store = tmp_path / f"s{flag}"
        ingest_paths([f], store)
        q = duckdb.connect().execute(f"SELECT events, events_quarantined FROM read_parquet('{store}/runs/*/ranks.parquet')")
        assert q.fetchall() == [(0, 1)]


# -- faults a break-it review found; each store checked by value, on both paths ---------------

_EV = '{"ph":"X","cat":"cpu_op","name":"%s","pid":%s,"tid":1,"ts":%s,"dur":1}'


def _two_paths(tmp_path, monkeypatch, text: str, name: str = "rank0.json"):
    """Ingest ``text`` with and without the scanner; the stores must be equal. Returns the events rows
    (name, device, ts_ns) and the ranks row (events, events_quarantined) of the scanner's store."""
    f = tmp_path / name
    f.write_text(text)
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NO_KSCAN", flag)
        ingest_paths([f], tmp_path / f"s{flag}")
    for pattern in ("runs/*/events/*.parquet", "runs/*/collectives.parquet", "runs/*/ranks.parquet"):
        assert _table_diff(tmp_path / "s0", tmp_path / "s1", pattern) == (0, 0), pattern
    con = duckdb.connect()
    ev = con.execute(
        f"SELECT name, device, ts_ns FROM read_parquet('{tmp_path}/s0/runs/*/events/*.parquet') ORDER BY event_id"
    ).fetchall()
    rk = con.execute(f"SELECT events, events_quarantined FROM read_parquet('{tmp_path}/s0/runs/*/ranks.parquet')")
    return ev, rk.fetchone()


def test_escaped_phase_is_still_a_complete_event(tmp_path, monkeypatch):
    text = '{"traceEvents":[{"ph":"\\u0058","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":5,"dur":1}]}'
    assert _two_paths(tmp_path, monkeypatch, text) == ([("a", 1, 5000)], (1, 0))


def test_four_decimal_ts_is_exact_on_both_paths(tmp_path, monkeypatch):
    # 539833777.3825 µs = 539833777382.5 ns: half to even gives ...382 (round(x*1000) on the double gave 383)
    text = '{"traceEvents":[%s]}' % (_EV % ("a", 1, "539833777.3825"))
    assert _two_paths(tmp_path, monkeypatch, text) == ([("a", 1, 539833777382)], (1, 0))


def test_bool_ts_is_quarantined_and_bool_pid_is_not_one(tmp_path, monkeypatch):
    import zlib

    text = '{"traceEvents":[%s,%s]}' % (_EV % ("a", 1, 5), _EV % ("b", 1, "true"))
    assert _two_paths(tmp_path, monkeypatch, text) == ([("a", 1, 5000)], (1, 1))
    text = '{"traceEvents":[%s,%s]}' % (_EV % ("a", 1, 5), _EV % ("b", "true", 6))
    (tmp_path / "p").mkdir()
    ev, _ = _two_paths(tmp_path / "p", monkeypatch, text)
    assert ev == [("a", 1, 5000), ("b", -(zlib.crc32(b"True") + 1), 6000)]


def test_ids_and_steps_beyond_int64_are_not_internal_errors(tmp_path, monkeypatch):
    import zlib

    big = "100000000000000000000"
    text = (
        '{"traceEvents":[%s,%s,' % (_EV % ("a", big, 5), _EV % ("ProfilerStep#99999999999999999999", 1, 4))
        + '{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":6,"dur":1,'
        '"args":{"correlation":99999999999999999999999,"External id":1}},'
        + '{"ph":"X","cat":"cpu_op","name":"end_overflows","pid":1,"tid":1,"ts":9000000000000000,"dur":9000000000000000}'
        + "]}"
    )
    ev, rk = _two_paths(tmp_path, monkeypatch, text)
    assert ("a", -(zlib.crc32(big.encode()) + 1), 5000) in ev
    assert rk == (3, 1)  # ts + dur beyond int64 ns: quarantined
    con = duckdb.connect()
    assert con.execute(
        f"SELECT correlation, step FROM read_parquet('{tmp_path}/s0/runs/*/events/*.parquet') WHERE name = 'cudaLaunchKernel'"
    ).fetchall() == [(None, None)]


def test_long_tail_of_keys_after_the_array(tmp_path, monkeypatch):
    tail = ", ".join(f'"k{i}": []' for i in range(3000))
    text = '{"traceEvents":[%s], %s, "distributedInfo": {"rank": 0}}' % (_EV % ("a", 1, 5), tail)
    assert _two_paths(tmp_path, monkeypatch, text) == ([("a", 1, 5000)], (1, 0))


def test_metadata_table_keeps_ints_beyond_64_bits(tmp_path, monkeypatch):
    import tracekit.ingest.kineto as kineto

    monkeypatch.setattr(kineto, "META_BATCH_ROWS", 1)
    evs = []
    for i in range(3):
        evs.append('{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":7,"ts":%d,"dur":2,'
                   '"args":{"correlation":%d}}' % (1000 + 10 * i, i))
        evs.append('{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","pid":0,"tid":7,'
                   '"ts":%d,"dur":3,"args":{"correlation":%d,"device":0,"stream":7,"Collective name":"allreduce",'
                   '"In msg nelems":%s,"dtype":"Float","Group size":2}}' % (1005 + 10 * i, i, 10**23 if i == 1 else 256))
    _two_paths(tmp_path, monkeypatch, '{"traceEvents":[%s]}' % ",".join(evs))
    sizes = duckdb.connect().execute(
        f"SELECT size_bytes FROM read_parquet('{tmp_path}/s0/runs/*/collectives.parquet') ORDER BY ts_ns"
    ).fetchall()
    assert sizes[0] == (1024,) and sizes[2] == (1024,) and len(sizes) == 3


def test_parallel_readers_give_the_same_store(tmp_path):
    """Rank files read by worker processes (staging files and metadata tables written there) give
    the same store as reading them in this process."""
    src = _target("traces/param_dlrm_8rank_v100")
    ingest_paths([src], tmp_path / "one", jobs=1)
    ingest_paths([src], tmp_path / "two", jobs=2)
    for pattern, excl in [("runs/*/events/*.parquet", ""), ("runs/*/collectives.parquet", ""),
                          ("runs/*/ranks.parquet", ""), ("runs/*/run.parquet", "EXCLUDE (created_at)")]:
        assert _table_diff(tmp_path / "one", tmp_path / "two", pattern, excl) == (0, 0), pattern


def test_lone_surrogate_and_escaped_key_are_read(tmp_path, monkeypatch):
    # valid JSON: a lone \\ud800 (Python's json reads it; UTF-8 cannot hold it: U+FFFD) and a
    # key spelled with an escape ("\\u0074s" is "ts")
    text = ('{"traceEvents":[' + _EV % ("a\\ud800b", 1, 5) + ","
            + _EV.replace('"ts"', '"\\u0074s"') % ("c", 1, 7) + "]}")
    assert json.loads(text)["traceEvents"][1]["ts"] == 7
    assert _two_paths(tmp_path, monkeypatch, text) == ([("a\ufffdb", 1, 5000), ("c", 1, 7000)], (2, 0))


@pytest.mark.parametrize("where", ["after the bracket", "between events", "before the document"])
def test_long_whitespace_runs_on_both_paths(where, tmp_path, monkeypatch):
    # 1 MB of blanks is 256 blocks of 4 KB: more than any event, which the readers must not
    # mistake for a malformed one (the same holds for 400 MB at the real block size)
    monkeypatch.setattr(TraceStream.__init__, "__defaults__", (4096, True))
    blank = " \n\t" * (1 << 18)
    a, b = _EV % ("a", 1, 5), _EV % ("b", 1, 6)
    text = {"after the bracket": '{"traceEvents":[' + blank + a + "," + b + "]}",
            "between events": '{"traceEvents":[' + a + "," + blank + b + "]}",
            "before the document": blank + '{"traceEvents":[' + a + "," + b + "]}"}[where]
    assert _two_paths(tmp_path, monkeypatch, text) == ([("a", 1, 5000), ("b", 1, 6000)], (2, 0))


def test_truncated_gzip_message_gives_the_bytes_really_decompressed(tmp_path):
    raw = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "ts": i, "dur": 1} for i in range(200000)]}).encode())
    f = tmp_path / "cut.json.gz"
    f.write_bytes(raw[: len(raw) // 2])
    got = len(zlib.decompressobj(47).decompress(raw[: len(raw) // 2]))  # all that the cut stream holds, in one call
    seen = 0  # Python's gzip module, 1 KB reads, loses the part of its last step before the cut
    with gzip.open(f, "rb") as fh:
        try:
            while piece := fh.read(1024):
                seen += len(piece)
        except EOFError:
            pass
    assert 1_000_000 < seen <= got < len(gzip.decompress(raw))
    with pytest.raises(FileError, match=f"truncated gzip stream after {got:,} bytes of JSON"):
        for _ in TraceStream(f):
            pass
