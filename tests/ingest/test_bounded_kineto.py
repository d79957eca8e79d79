"""A damaged event in a Kineto file: refused (exit 2) or skipped in time linear in the file, and
the message names the byte of the damage, not a later ``]``."""

from __future__ import annotations

import json
import re
import time

import pytest

from tracekit.cli import main
from tracekit.errors import FileError
from tracekit.ingest.jsonstream import TraceStream

HEAD = '{"schemaVersion": 1, "traceEvents": ['
TAIL = '], "displayTimeUnit": "ms", "traceName": "rank0"}'


def _events(n: int) -> list[str]:
    # args with nested lists: every event holds several ']' (what made the old recovery quadratic)
    return [json.dumps({"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 1000 + 10 * i,
                        "dur": 5, "args": {"correlation": i, "stream": 7, "device": 0,
                                           "Input Dims": [[1, 2], [3]], "Input type": ["float", "int"]}})
            for i in range(n)]


def _damaged(n: int, how: str) -> tuple[str, int, int]:
    """A document of ``n`` events, the middle one damaged; (text, start, end) of that event's bytes."""
    parts = _events(n)
    mid = n // 2
    if how == "unclosed":  # its last '}' lost: the object swallows every event after it
        parts[mid] = parts[mid][:-1]
    elif how == "byte deleted":  # the closing quote of its first key lost: brackets still balance
        parts[mid] = parts[mid][:4] + parts[mid][5:]
    start = len(HEAD) + sum(len(p) + 1 for p in parts[:mid])
    return HEAD + ",".join(parts) + TAIL, start, start + len(parts[mid])


def _byte_named(msg: str) -> int:
    m = re.search(r"at byte ([\d,]+)", msg)
    assert m, msg
    return int(m.group(1).replace(",", ""))


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_4000_events_one_unclosed_exit_2_fast_naming_the_byte(tmp_path, capsys):
    text, start, end = _damaged(4000, "unclosed")
    p = tmp_path / "rank0.json"
    p.write_text(text)
    t0 = time.perf_counter()
    rc = main(["ingest", str(p), "--store", str(tmp_path / "store")])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert took < 10, took
    # the missing '}' was at byte end; the decoder rejects the '{' of the next event, just after
    # the ',' that follows: end + 1
    assert _byte_named(err[0]) == end + 1
    assert text[end + 1] == "{" and text[end] == ","
    assert "rank0.json" in err[0] and "malformed JSON in traceEvents" in err[0]
    assert not (tmp_path / "store").exists()


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("block", [1 << 14, 1 << 18, 8 << 20])
def test_unclosed_event_same_byte_whatever_the_block(tmp_path, fast, block):
    """Through the cut-and-decode path (file larger than a block) as through the tail."""
    text, start, end = _damaged(6000, "unclosed")
    p = tmp_path / "t.json"
    p.write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(FileError) as ei:
        for _ in TraceStream(p, block=block, fast=fast):
            pass
    assert time.perf_counter() - t0 < 10
    assert _byte_named(str(ei.value)) == end + 1


@pytest.mark.serial  # asserts a wall-time bound: not beside the multi-process tests
def test_time_is_linear_in_the_events(tmp_path):
    """10x the events costs well under 100x the time (the old recovery was quadratic: 4,000
    events took ~50x as long as 500). The ratio is taken, not a wall-clock figure."""
    times = []
    for n in (2000, 20000):
        text, _, _ = _damaged(n, "unclosed")
        p = tmp_path / f"t{n}.json"
        p.write_text(text)
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            with pytest.raises(FileError):
                for _ in TraceStream(p, fast=False):
                    pass
            best = min(best, time.perf_counter() - t0)
        times.append(best)
    assert times[1] < 30 * max(times[0], 0.005), times


def test_event_with_balanced_damage_is_skipped_and_counted(tmp_path, capsys):
    """A deleted byte that leaves the brackets balanced: that one event is skipped (quarantined,
    counted in a warning), the other 3,999 are read."""
    text, start, end = _damaged(4000, "byte deleted")
    p = tmp_path / "rank0.json"
    p.write_text(text)
    s = tmp_path / "store"
    assert main(["ingest", str(p), "--store", str(s), "--run-id", "r"]) == 0
    err = capsys.readouterr().err
    assert "1 malformed event(s) quarantined" in err or "1 event(s) quarantined" in err, err
    import duckdb

    n = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{s}/runs/r/events/*.parquet')").fetchone()[0]
    assert n == 3999


def test_trailing_data_named_where_it_is(tmp_path):
    """Good events, then junk after the document: the junk's byte, not an earlier one."""
    parts = _events(300)
    doc = HEAD + ",".join(parts) + TAIL
    p = tmp_path / "t.json"
    p.write_text(doc + "\n{junk")
    with pytest.raises(FileError) as ei:
        for _ in TraceStream(p, fast=False):
            pass
    assert "trailing data after the JSON document" in str(ei.value)
    assert _byte_named(str(ei.value)) == len(doc) + 1


def test_corrupt_gzip_names_where_it_fails(tmp_path):
    """A deflate stream damaged ~20 kB in: the message gives the 4 kB block of the compressed file
    where zlib fails and the JSON bytes decompressed before it (not 'after 0 bytes')."""
    import zlib

    text, _, _ = _damaged(4000, "none")
    raw = text.encode()
    c = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    parts, flushes = [], []
    for off in range(0, len(raw), 50000):  # full flushes: deflate blocks start at known offsets
        parts.append(c.compress(raw[off:off + 50000]) + c.flush(zlib.Z_FULL_FLUSH))
        flushes.append(sum(map(len, parts)))
    parts.append(c.flush())
    gz = bytearray(b"".join(parts))
    at = flushes[len(flushes) // 2]  # a block header half way through: invalid block type
    for i in range(at, at + 8):
        gz[i] = 0xFF
    # an independent count: where zlib itself stops, fed the same 4 kB blocks
    d, out, fail = zlib.decompressobj(zlib.MAX_WBITS | 16), 0, None
    for off in range(0, len(gz), 4096):
        try:
            out += len(d.decompress(bytes(gz[off:off + 4096])))
        except zlib.error:
            fail = off
            break
    assert fail is not None and 16384 <= fail < len(gz) - 4096  # in the deflate data, not at the CRC
    p = tmp_path / "c.json.gz"
    p.write_bytes(bytes(gz))
    with pytest.raises(FileError) as ei:
        for _ in TraceStream(p):
            pass
    msg = str(ei.value)
    assert f"corrupt gzip data (in compressed bytes {fail:,}-{fail + 4096:,} (where zlib found it), after {out:,} bytes" in msg
    assert out > 100000
