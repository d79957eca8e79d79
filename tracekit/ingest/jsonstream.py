"""Streaming reader for Chrome/Kineto trace JSON: bounded chunks of ``traceEvents``.

A Kineto trace is one JSON object whose ``traceEvents`` array holds every
event; the other top-level keys (``distributedInfo``, ``deviceProperties``,
``baseTimeNanoseconds``, ...) may come before or after it. Parsing the whole
document at once costs memory proportional to the file and, in Python,
superlinear time (DESIGN.md, "Performance facts"). This module instead reads
decompressed bytes in blocks and cuts the array between two events:

* a cut after byte ``p`` is accepted only when ``[`` + bytes[start:p] + ``]``
  decodes as a JSON array of objects. Because the previous cut was at array
  depth, a prefix that decodes is made of whole events, so the check is exact
  (a ``},`` inside a string or a nested object never passes it);
* candidates are tried from the end of the buffer backwards, ``},`` first (the
  way every known exporter writes the separator).

Chunks that do not decode are retried after repairing the defects real
exporters produce: invalid UTF-8 (decoded with replacement characters) and bare
``inf`` / ``-inf`` / ``NaN`` / ``Infinity`` tokens (read as null).

Fast path: where the C scanner :mod:`tracekit.ingest._kscan` is built (it is
optional), the array is read with it instead, block by block, into
:class:`FastChunk` records (no Python object per event). A second thread
decompresses (ISA-L, via ``isal``, when installed) and scans, both without the
GIL, while the caller's thread turns the previous block's records into rows.
The scanner is strict: at the first event it does not take (malformed JSON,
invalid UTF-8, bare NaN, an id or time of an odd type, a float beyond a
double...), the rest of the file goes through the cut-and-decode path above,
which repairs or reports exactly as it always did.

Errors are ``FileError`` naming the file and the problem (truncated gzip,
not JSON, no ``traceEvents`` array, array never closed).
"""

from __future__ import annotations

import gzip
import os
import queue
import re
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import msgspec

from tracekit.errors import FileError

try:  # ISA-L's inflate: the same gzip, decompressed 3-5x faster than zlib (a dependency; zlib if absent)
    from isal import igzip as _igzip
    from isal import isal_zlib as _isal_zlib

    _GZIP_ERRORS: tuple = (gzip.BadGzipFile, zlib.error, _isal_zlib.error, OSError)
except ImportError:  # pragma: no cover
    _igzip = None
    _GZIP_ERRORS = (gzip.BadGzipFile, zlib.error, OSError)

try:  # the optional C scanner (setup.py); without it every chunk takes the msgspec path
    from tracekit.ingest import _kscan
except ImportError:  # pragma: no cover - exercised by TRACEKIT_NO_KSCAN in the tests
    _kscan = None

_SCAN_MORE, _SCAN_CLOSED, _SCAN_UNSUPPORTED = 0, 1, 2


def fast_scanner_available() -> bool:
    """True when the C scanner is built and not disabled by ``TRACEKIT_NO_KSCAN=1``."""
    return _kscan is not None and os.environ.get("TRACEKIT_NO_KSCAN", "") in ("", "0")


BLOCK = 8 << 20  # bytes of decompressed JSON per chunk (~30-60k events)
_MAX_CUT_TRIES = 6


class Ev(msgspec.Struct, gc=False):
    """One trace event; ``args`` stays raw JSON until somebody needs it."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class ExactEv(msgspec.Struct, gc=False):
    """Like :class:`Ev` but ``ts``/``dur`` kept as their JSON text, for exact ns."""

    ph: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"null")
    dur: msgspec.Raw = msgspec.Raw(b"null")


_EV_LIST = msgspec.json.Decoder(list[Ev])
_EXACT_LIST = msgspec.json.Decoder(list[ExactEv])
_ANY = msgspec.json.Decoder()

_BARE_CONST = re.compile(rb"(?<=[:\[,\s])(-?)(?:Infinity|inf|NaN|nan)(?=\s*[,\]}])")
_WS = b" \t\r\n"


@dataclass
class Chunk:
    """A run of whole events and the exact bytes they were decoded from."""

    events: list  # list[Ev]
    text: bytes  # b"[" + events + b"]", after any repair
    repaired: list[str] = field(default_factory=list)

    def exact(self) -> list:
        """The same events with ts/dur as raw JSON text (for exact ns conversion)."""
        return _EXACT_LIST.decode(self.text)


@dataclass
class FastChunk:
    """Events read by the C scanner: fixed-width records (see ``_kscan.c``), the distinct
    strings their codes index, and the text their ``args`` offsets point into."""

    records: bytes
    strings: list
    text: bytes


def _open(path: Path):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return _igzip.open(path, "rb") if _igzip is not None else gzip.open(path, "rb")
    return open(path, "rb")


class _Reader:
    """Decompressed bytes of a file in blocks, with errors turned into FileError."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = _open(path)
        self.consumed = 0
        self.eof = False

    def read(self, n: int = BLOCK) -> bytes:
        if self.eof:
            return b""
        try:
            data = self.fh.read(n)
        except EOFError:
            raise FileError(
                self.path, f"truncated gzip stream after {self.consumed:,} bytes of JSON (file incomplete?)"
            ) from None
        except _GZIP_ERRORS as exc:
            raise FileError(self.path, f"corrupt gzip data after {self.consumed:,} bytes ({exc})") from None
        if not data:
            self.eof = True
        self.consumed += len(data)
        return data

    def close(self) -> None:
        self.fh.close()


def _repair(text: bytes) -> tuple[bytes, list[str]]:
    notes = []
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        text = text.decode("utf-8", "replace").encode("utf-8")
        notes.append("invalid UTF-8 replaced")
    fixed, n = _BARE_CONST.subn(b"null", text)
    if n:
        notes.append(f"{n} bare inf/NaN token(s) read as null")
        text = fixed
    return text, notes


def _decode_repaired(doc: bytes):
    """``(value, notes)``: ``doc`` decoded as JSON, after :func:`_repair` if it needs it; None if not JSON."""
    try:
        return _ANY.decode(doc), []
    except (msgspec.DecodeError, UnicodeDecodeError):
        pass
    fixed, notes = _repair(doc)
    try:
        return _ANY.decode(fixed), notes
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


def _decode_events(body: bytes) -> Chunk | None:
    """Decode ``[body]`` as events, repairing known defects; None if not whole events."""
    text = b"[" + body + b"]"
    try:
        return Chunk(_EV_LIST.decode(text), text)
    except msgspec.ValidationError:
        return _decode_mixed(text, [])
    except (msgspec.DecodeError, UnicodeDecodeError):
        pass
    text2, notes = _repair(text)
    if not notes:
        return None
    try:
        return Chunk(_EV_LIST.decode(text2), text2, notes)
    except msgspec.ValidationError:
        return _decode_mixed(text2, notes)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


def _decode_error(body: bytes) -> str:
    """msgspec's description of why ``[body]`` is not JSON (one line)."""
    try:
        _ANY.decode(b"[" + body + b"]")
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        return " ".join(str(exc).split())
    return "not an array of event objects"


def _decode_mixed(text: bytes, notes: list[str]) -> Chunk | None:
    """An array with non-object items: keep the objects, note the rest."""
    try:
        items = _ANY.decode(text)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not isinstance(items, list):
        return None
    objs = [x for x in items if isinstance(x, dict)]
    dropped = len(items) - len(objs)
    clean = msgspec.json.encode(objs)
    try:
        evs = _EV_LIST.decode(clean)
    except msgspec.ValidationError:
        return None
    return Chunk(evs, clean, notes + [f"{dropped} non-object item(s) in traceEvents skipped"])


def _skip_ws(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


class _ScanPump:
    """A thread that decompresses and scans blocks, queueing ("chunk", FastChunk) items.

    It ends with one last item: ("closed", (trailing_comma, text from the array's ']'
    on)), ("slow", text from the first event the scanner did not take), or ("error",
    FileError). The reader is the pump's until then and the caller's after
    :meth:`join`. At most ``depth`` chunks wait (bounded memory).
    """

    def __init__(self, stream: "TraceStream", rd, buf: bytes, depth: int = 1):
        # one chunk waiting (an 8 MB block and its records) keeps the scan thread ahead of the
        # reader; a second one cost ~15 MiB of peak on large files and saved ~2 % of the time
        self.stream, self.rd, self.buf = stream, rd, buf
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="tracekit-scan", daemon=True)
        self._t.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        rd, block, buf = self.rd, self.stream.block, self.buf
        try:
            while not self._stop.is_set():
                while not rd.eof and len(buf) < block:
                    more = rd.read(block)
                    if not more:
                        break
                    buf += more
                status, off, records, strings, trailing_comma = _kscan.scan(buf, 0)
                if records and not self._put(("chunk", FastChunk(records, strings, buf))):
                    return
                if status == _SCAN_CLOSED:
                    self._put(("closed", (trailing_comma, buf[off:])))
                    return
                if status == _SCAN_UNSUPPORTED or rd.eof:
                    self._put(("slow", buf[off:]))
                    return
                if off == 0 and len(buf) > 16 * block:
                    raise FileError(self.stream.path, f"malformed JSON in traceEvents near byte {rd.consumed - len(buf):,}")
                buf = buf[off:]
                if off == 0:  # one event longer than the block: read more before scanning again
                    more = rd.read(block)
                    if more:
                        buf += more
        except BaseException as exc:  # handed to the reading thread
            self._put(("error", exc))

    def get(self):
        return self._q.get()

    def join(self) -> None:
        self._t.join()

    def stop(self) -> None:
        """End the thread early (the consumer stopped): unblock it and wait for it."""
        self._stop.set()
        while self._t.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass


class TraceStream:
    """Iterate a Chrome/Kineto JSON trace as chunks of events plus its metadata.

    ``meta`` (the top-level keys other than ``traceEvents``) is complete once
    iteration has finished: keys written after the array are read at the end.
    """

    def __init__(self, path: str | Path, block: int = BLOCK, fast: bool = True):
        self.path = Path(path)
        self.block = block
        self.fast = fast
        self.meta: dict = {}
        self.notes: list[str] = []
        self.fast_events = 0  # events read by the C scanner
        self.slow_from: int | None = None  # byte where the msgspec path took over, if it did

    def __iter__(self) -> Iterator[Chunk]:
        if not self.path.exists():
            raise FileError(self.path, "no such file")
        if self.path.is_dir():
            raise FileError(self.path, "is a directory, expected a trace file")
        rd = _Reader(self.path)
        n_events = 0
        try:
            for ch in self._run(rd):
                n_events += len(ch.events) if isinstance(ch, Chunk) else 1
                yield ch
        finally:
            rd.close()
        if n_events == 0 and any("non-object" in n for n in self.notes):
            raise FileError(self.path, "not a trace: traceEvents holds no event objects")

    # -- phases ------------------------------------------------------------------

    def _run(self, rd: _Reader) -> Iterator[Chunk]:
        buf = rd.read(self.block)
        if not buf.strip():
            while not rd.eof and not buf.strip():
                buf += rd.read(self.block)
            if not buf.strip():
                raise FileError(self.path, "empty file")
        if buf.startswith(b"\xef\xbb\xbf"):
            buf = buf[3:]
        i = _skip_ws(buf, 0)
        first = buf[i : i + 1]
        if first == b"[":  # bare JSON-array form of the Chrome trace format
            body = buf[i + 1 :]
            self._array_closed_by = b""
        elif first == b"{":
            body = yield from self._header(rd, buf)
            self._array_closed_by = b"}"
        else:
            raise FileError(self.path, f"not a JSON trace (starts with {buf[i:i+16]!r})")
        yield from self._events(rd, body)

    def _header(self, rd: _Reader, buf: bytes):
        """Find ``"traceEvents": [`` at the top level; returns the bytes after ``[``."""
        start = 0
        key = b'"traceEvents"'
        while True:
            j = buf.find(key, start)
            if j < 0:
                if rd.eof:
                    self._no_events(buf)
                start = max(0, len(buf) - len(key))
                more = rd.read(self.block)
                if not more and rd.eof:
                    self._no_events(buf)
                buf += more
                continue
            k = _skip_ws(buf, j + len(key))
            if k >= len(buf) and not rd.eof:
                buf += rd.read(self.block)
                continue
            if buf[k : k + 1] != b":":
                start = j + 1
                continue
            k = _skip_ws(buf, k + 1)
            if k >= len(buf) and not rd.eof:
                buf += rd.read(self.block)
                continue
            if buf[k : k + 1] != b"[":
                raise FileError(self.path, "traceEvents is not an array")
            got = _decode_repaired(buf[:j] + b'"traceEvents":[]}')
            if got is None:
                start = j + 1  # the key was inside a string
                continue
            meta, notes = got
            self.notes.extend(notes)
            meta.pop("traceEvents", None)
            self.meta.update(meta)
            return buf[k + 1 :]
        yield  # pragma: no cover  (makes this a generator for `yield from`)

    def _no_events(self, buf: bytes):
        try:
            doc = _ANY.decode(buf)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            if buf.lstrip().startswith(b"{") and not buf.rstrip().endswith(b"}"):
                raise FileError(self.path, "truncated JSON: the document ends early (file incomplete?)") from None
            raise FileError(self.path, f"not valid JSON ({exc})") from None
        kind = type(doc).__name__
        raise FileError(self.path, f"no traceEvents array: a JSON {kind}, not a Kineto/Chrome trace")

    def _events(self, rd, buf: bytes):
        if self.fast and fast_scanner_available():
            yield from self._events_fast(rd, buf)
        else:
            yield from self._events_slow(rd, buf)

    def _events_fast(self, rd, buf: bytes):
        """The array read by the C scanner on a second thread (decompress + scan, both
        without the GIL), while this thread turns the records into rows. Hands over to
        :meth:`_events_slow` at the first event the scanner does not take, and to
        :meth:`_tail` for what follows the array."""
        pump = _ScanPump(self, rd, buf)
        try:
            while True:
                kind, item = pump.get()
                if kind == "chunk":
                    self.fast_events += len(item.records) // _kscan.RECORD_SIZE
                    yield item
                    continue
                pump.join()
                if kind == "error":
                    raise item
                if kind == "closed":
                    trailing_comma, rest = item
                    if trailing_comma:
                        self.notes.append("trailing comma after the last event")
                    rest = [rest]
                    while not rd.eof:
                        more = rd.read(self.block)
                        if not more:
                            break
                        rest.append(more)
                        if sum(len(r) for r in rest) > 16 * self.block:
                            raise FileError(self.path, "malformed JSON after traceEvents (too much text after the array)")
                    rest = b"".join(rest)
                    if not self._after_array(rest[1:]):  # the scanner found the very ']'
                        yield from self._tail(rest)  # the general reader says what is wrong
                    return
                # "slow": something the scanner does not take (or a file that ends inside an
                # event): the general reader repairs it or says exactly what is wrong
                self.slow_from = rd.consumed - len(item)
                yield from self._events_slow(rd, item)
                return
        finally:
            pump.stop()

    def _events_slow(self, rd, buf: bytes) -> Iterator[Chunk]:
        while True:
            while not rd.eof and len(buf) < self.block:
                more = rd.read(self.block)
                if not more:
                    break
                buf += more
            if rd.eof:
                yield from self._tail(buf)
                return
            cut = self._cut(buf)
            if cut is None:
                # No whole event decodes in this much text: read more (a huge
                # event), unless that is already far more than any event.
                if len(buf) > 16 * self.block:
                    raise FileError(self.path, f"malformed JSON in traceEvents near byte {rd.consumed - len(buf):,}")
                more = rd.read(self.block)
                if not more:
                    yield from self._tail(buf)
                    return
                buf += more
                continue
            chunk, nxt = cut
            self.notes.extend(chunk.repaired)
            yield chunk
            buf = buf[nxt:]

    def _cut(self, buf: bytes):
        """The longest prefix of whole events followed by a comma; (chunk, next index) or None."""
        lim = len(buf)
        tries = 0
        while tries < _MAX_CUT_TRIES:
            p = buf.rfind(b"},", 0, lim)
            if p < 0:
                return None
            lim = p
            tries += 1
            ch = _decode_events(buf[: p + 1])
            if ch is not None:
                return ch, p + 2
        return None

    def _after_array(self, after: bytes) -> bool:
        """Read the top-level keys in ``after`` (the text after the array's closing ']').

        True when that text closes the document properly (the keys go to ``meta``);
        False otherwise, for :meth:`_tail` to report.
        """
        rest = after.strip(_WS)
        if self._array_closed_by == b"":
            return not rest
        if not rest.endswith(b"}"):
            return False
        inner = rest[:-1].strip(_WS)
        if not inner:
            return True
        if not inner.startswith(b","):
            return False
        got = _decode_repaired(b"{" + inner[1:] + b"}")
        if got is None or not isinstance(got[0], dict):
            return False
        self.meta.update(got[0])
        return True

    def _tail(self, buf: bytes) -> Iterator[Chunk]:
        """The last events, the closing ``]`` and any top-level keys after it."""
        closer = self._array_closed_by
        lim = len(buf)
        body_error = None
        while True:
            r = buf.rfind(b"]", 0, lim)
            if r < 0:
                if body_error is not None:
                    raise FileError(self.path, f"malformed JSON in traceEvents ({body_error})")
                raise FileError(self.path, "truncated JSON: traceEvents array is never closed (file incomplete?)")
            lim = r
            j = r - 1  # the last non-blank byte before this ']'
            while j >= 0 and buf[j] in _WS:
                j -= 1
            if j >= 0 and buf[j] in b"[{:":
                # this ']' closes something in the keys after the array, as no event list
                # ends so; skipping it here keeps a long tail of keys linear, not quadratic
                continue
            rest = buf[r + 1 :].strip(_WS)
            trailing: dict | None = None
            if closer == b"":
                if rest:
                    continue
                trailing = {}
            else:
                if not rest.endswith(b"}"):
                    continue
                inner = rest[:-1].strip(_WS)
                if inner == b"":
                    trailing = {}
                elif inner.startswith(b","):
                    got = _decode_repaired(b"{" + inner[1:] + b"}")
                    if got is None or not isinstance(got[0], dict):
                        continue
                    trailing = got[0]
                else:
                    continue
            body = buf[:r].strip(_WS)
            if body.endswith(b","):  # a trailing comma, as some exporters write
                body = body[:-1]
                self.notes.append("trailing comma after the last event")
            if body:
                ch = _decode_events(body)
                if ch is None:
                    # maybe the ']' we found closes something inside the last event
                    if body_error is None:
                        body_error = _decode_error(body)
                    continue
                self.notes.extend(ch.repaired)
                yield ch
            self.meta.update(trailing)
            return
