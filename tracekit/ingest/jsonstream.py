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
exporters produce: invalid UTF-8 (decoded with replacement characters), bare
``inf`` / ``-inf`` / ``NaN`` / ``Infinity`` tokens (read as null) and lone UTF-16
surrogate escapes (read as U+FFFD). If that is not enough, the events are read one by
one (:func:`_recover`): strings with unescaped quotes, raw control characters or stray
backslashes are repaired, and an event that still does not decode is dropped and counted
(``events_fixed`` / ``events_dropped``, each a note). Blank text between events is
dropped however long it is.

Fast path: where the C scanner :mod:`tracekit.ingest._kscan` is built (it is
optional), the array is read with it instead, block by block, into
:class:`FastChunk` records (no Python object per event). A second thread
decompresses (ISA-L, via ``isal``, when installed) and scans, both without the
GIL, while the caller's thread turns the previous block's records into rows.
The scanner is strict: at the first event it does not take (malformed JSON,
invalid UTF-8, bare NaN, an id or time of an odd type, a float beyond a
double...), the rest of the file goes through the cut-and-decode path above,
which repairs or reports exactly as it always did.

Errors are ``FileError`` naming the file and the problem (truncated gzip with the
bytes of JSON it held, not JSON, no ``traceEvents`` array, array never closed, trailing
data after the document, a second ``traceEvents`` key, malformed JSON at byte N of the
decompressed text).
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
    id: Any = None  # async ("b"/"e") events: what pairs a begin with its end


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
_WS_BYTES = (b" ", b"\t", b"\r", b"\n")
# a \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or a \uDC00-\uDFFF one not after
# such a high one; (?<!\\)((?:\\\\)*) makes sure the backslash is not itself escaped
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)((?:\\\\)*)(?:\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


_BARE_HINT = re.compile(rb"Infinity|inf|NaN|nan")
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass
class Chunk:
    """A run of whole events and the exact bytes they were decoded from."""

    events: list  # list[Ev]
    text: bytes  # b"[" + events + b"]", after any repair
    repaired: list[str] = field(default_factory=list)
    fixed: int = 0  # events whose text was repaired (see _recover)
    dropped: int = 0  # events that could not be read even so (quarantined)

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
                self.path, f"truncated gzip stream after {_gunzip_length(self.path):,} bytes of JSON (file incomplete?)"
            ) from None
        except _GZIP_ERRORS as exc:
            out, at = _gunzip_failure(self.path)
            where = f"in compressed bytes {at:,}-{at + 4096:,} (where zlib found it), " if at is not None else ""
            raise FileError(self.path, f"corrupt gzip data ({where}after {max(out, self.consumed):,} bytes of JSON: "
                                       f"{exc})") from None
        if not data:
            self.eof = True
        self.consumed += len(data)
        return data

    def close(self) -> None:
        self.fh.close()


def _gunzip_failure(path: Path, step: int = 4096) -> tuple[int, int | None]:
    """Where a corrupt gzip file fails: (bytes of data decompressed before the failure, the
    offset in the compressed file of the ``step``-byte block whose inflate failed, or None when
    zlib finds no failure). A second pass, on the error path only: the reader's block lost the
    part decompressed before the error."""
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    total = pos = 0
    try:
        with open(path, "rb") as fh:
            while block := fh.read(step):
                total += len(d.decompress(block))
                while d.unused_data and d.eof:  # a multi-member gzip file: the next member
                    rest = d.unused_data
                    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
                    total += len(d.decompress(rest))
                pos += len(block)
    except zlib.error:
        return total, pos
    return total, None


def _gunzip_length(path: Path) -> int:
    """Bytes of data a (truncated) gzip file decompresses to before it ends: a second pass, on the
    error path only, since the reader loses the part of a block decompressed before the cut."""
    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
    total = 0
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                total += len(d.decompress(block))
                while d.unused_data and d.eof:  # a multi-member gzip file: the next member
                    rest = d.unused_data
                    d = zlib.decompressobj(zlib.MAX_WBITS | 16)
                    total += len(d.decompress(rest))
    except zlib.error:
        pass
    return total


def _repair(text: bytes) -> tuple[bytes, list[str]]:
    notes = []
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        text = text.decode("utf-8", "replace").encode("utf-8")
        notes.append("invalid UTF-8 replaced")
    n = 0
    if _BARE_HINT.search(text):  # a cheap scan first: the lookbehind pattern is slow on long text
        fixed, n = _BARE_CONST.subn(b"null", text)
    if n:
        notes.append(f"{n} bare inf/NaN token(s) read as null")
        text = fixed
    n = 0
    if _SURROGATE_HINT.search(text):
        fixed, n = _LONE_SURROGATE.subn(rb"\1\\ufffd", text)
    if n:
        notes.append(f"{n} lone UTF-16 surrogate escape(s) read as U+FFFD")
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
        evs = _EV_LIST.decode(text2)
        fixed = sum(1 for e in evs if _has_replacement(e)) if "invalid UTF-8 replaced" in notes else 0
        return Chunk(evs, text2, notes, fixed)
    except msgspec.ValidationError:
        return _decode_mixed(text2, notes)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


def _has_replacement(e: Ev) -> bool:
    """Whether an event's strings hold U+FFFD (what invalid UTF-8 was replaced with)."""
    return any(isinstance(v, str) and "\ufffd" in v for v in (e.name, e.cat, e.pid, e.tid)) or (
        b"\xef\xbf\xbd" in bytes(e.args))


def _decode_error(body: bytes, base: int = 0) -> str:
    """msgspec's description of why ``[body]`` is not JSON (one line); the byte it names is
    given as ``base`` + its index in ``[body]``: the offset in the file's JSON when ``base`` is
    the offset of ``body`` minus one."""
    try:
        _ANY.decode(b"[" + body + b"]")
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        msg = " ".join(str(exc).split())
        return re.sub(r"\(byte (\d+)\)", lambda m: f"at byte {base + int(m.group(1)):,}", msg)
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


# -- recovering events whose strings are broken (issue: Kineto's with_stack names) ----------

_STRUCT = re.compile(rb'["{}\[\]]')
_STR_SPECIAL = re.compile(rb'["\\\x00-\x1f]')
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_ESCAPES = frozenset(b'"\\/bfnrt')
_CLOSERS = frozenset(b":,}]")
_EV_ONE = msgspec.json.Decoder(Ev)


def _repair_object(buf: bytes, i: int) -> tuple[bytes, int, bool] | None:
    """The object at ``buf[i] == '{'`` with its strings repaired: ``(text, end, changed)``, or
    None when it does not end within ``buf``.

    Inside a string: a ``"`` not followed (after blanks) by ``:`` ``,`` ``}`` or ``]`` is a quote
    the exporter forgot to escape (``"say "hi" now"``); a backslash that starts no JSON escape is
    a literal one (``C:\\Users``); a raw control character (a newline) is escaped.
    """
    out: list[bytes] = []
    depth, j, n, changed = 0, i, len(buf), False
    while True:
        m = _STRUCT.search(buf, j)
        if m is None:
            return None
        k = m.start()
        c = buf[k]
        out.append(buf[j : k + 1])
        j = k + 1
        if c != 0x22:  # { } [ ]
            depth += 1 if c in b"{[" else -1
            if depth == 0:
                return b"".join(out), j, changed
            continue
        while True:  # a string's body, up to its closing quote
            m = _STR_SPECIAL.search(buf, j)
            if m is None:
                return None
            k = m.start()
            c = buf[k]
            out.append(buf[j:k])
            if c == 0x5C:  # backslash
                if k + 1 >= n:
                    return None
                if buf[k + 1] in _ESCAPES:
                    out.append(buf[k : k + 2])
                    j = k + 2
                elif buf[k + 1] == 0x75 and _HEX4.match(buf, k + 2):  # \uXXXX
                    out.append(buf[k : k + 6])
                    j = k + 6
                else:
                    out.append(b"\\\\")
                    j, changed = k + 1, True
            elif c == 0x22:
                t = k + 1
                while t < n and buf[t] in _WS:
                    t += 1
                if t >= n:
                    return None
                if buf[t] in _CLOSERS:
                    out.append(b'"')
                    j = k + 1
                    break
                out.append(b'\\"')
                j, changed = k + 1, True
            else:  # a raw control character
                out.append(b"\\u%04x" % c)
                j, changed = k + 1, True


_INCOMPLETE = "incomplete"  # what _recover returns when text ends inside its first event


def _recover(body: bytes, final: bool) -> tuple[Chunk, int] | None | str:
    """Events of ``body`` (text after a cut between events) read one by one, repairing their
    strings (:func:`_repair_object`) and the defects :func:`_repair` knows; an event that still
    does not decode is dropped and counted. Returns (chunk, index after the last event taken and
    its comma), or None if the text is not a run of objects (then it is reported as malformed).
    With ``final`` the events must run to the end of ``body``; else the last, cut one is left,
    and :data:`_INCOMPLETE` says that the text ends inside the first event (read more)."""
    evs, texts, notes = [], [], set()
    fixed = dropped = 0
    i, n, nxt = _skip_ws(body, 0), len(body), 0
    while i < n:
        if body[i] != 0x7B:
            return None
        got = _repair_object(body, i)
        if got is None:
            if final:
                return None
            if not evs and not dropped:
                return _INCOMPLETE
            break
        text, end, changed = got
        k = _skip_ws(body, end)
        if k < n and body[k] != 0x2C:  # not followed by a comma: not a run of events
            return None
        if k >= n and not final:
            break
        try:
            ev = _EV_ONE.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            text2, more = _repair(text)
            try:
                ev = _EV_ONE.decode(text2)
                text, changed = text2, True
                notes.update(m.split(" ", 1)[1] if m[0].isdigit() else m for m in more)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                ev = None
        if ev is None:
            dropped += 1
        else:
            evs.append(ev)
            texts.append(text)
            fixed += changed
        i = _skip_ws(body, k + 1)
        nxt = k + 1
        if k >= n:
            break
    if not evs and not dropped:
        return None
    return Chunk(evs, b"[" + b",".join(texts) + b"]", sorted(notes), fixed, dropped), (n if final else nxt)


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
        self.events_fixed = 0  # events read after repairing their text
        self.events_dropped = 0  # malformed events that could not be read (quarantined)
        self._recover_from = 0  # _cut reads events one by one only from this much text on
        self.slow_from: int | None = None  # byte where the msgspec path took over, if it did
        self.bare_array = False  # the document is a bare JSON array (Chrome's array form), not an object

    def __iter__(self) -> Iterator[Chunk]:
        if not self.path.exists():
            raise FileError(self.path, "no such file")
        if self.path.is_dir():
            raise FileError(self.path, "is a directory, expected a trace file")
        rd = _Reader(self.path)
        n_events = 0
        try:
            for ch in self._run(rd):
                if isinstance(ch, Chunk):
                    n_events += len(ch.events)
                    self.events_fixed += ch.fixed
                    self.events_dropped += ch.dropped
                else:
                    n_events += 1
                yield ch
        finally:
            rd.close()
        if self.events_fixed:
            self.notes.append(f"{self.events_fixed} event(s) with broken text repaired")
        if self.events_dropped:
            self.notes.append(f"{self.events_dropped} malformed event(s) quarantined")
        self.notes = list(dict.fromkeys(self.notes))
        if n_events == 0 and (self.bare_array or any("non-object" in n for n in self.notes)):
            where = "a JSON list" if self.bare_array else "traceEvents"
            raise FileError(self.path, f"not a trace: {where} holds no event objects")

    # -- phases ------------------------------------------------------------------

    def _run(self, rd: _Reader) -> Iterator[Chunk]:
        buf = rd.read(self.block)
        while not rd.eof and not buf.strip(_WS):  # blank blocks before the document are dropped
            buf = rd.read(self.block)
        if not buf.strip():
            raise FileError(self.path, "empty file")
        if buf.startswith(b"\xef\xbb\xbf"):
            buf = buf[3:]
        i = _skip_ws(buf, 0)
        first = buf[i : i + 1]
        if first == b"[":  # bare JSON-array form of the Chrome trace format
            body = buf[i + 1 :]
            self._array_closed_by = b""
            self.bare_array = True
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
                        yield from self._tail(rest, rd.consumed - len(rest))  # the general reader says what is wrong
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
            if buf[:1] in _WS_BYTES:  # blank text between events is dropped, however long
                buf = buf.lstrip(_WS)
            while not rd.eof and len(buf) < self.block:
                more = rd.read(self.block)
                if not more:
                    break
                buf += more
                if buf[:1] in _WS_BYTES:
                    buf = buf.lstrip(_WS)
            if rd.eof:
                yield from self._tail(buf, rd.consumed - len(buf))
                return
            self._slow_base = rd.consumed - len(buf)  # byte offset of buf, for _check_structure
            cut = self._cut(buf)
            if cut is None:
                # No whole event decodes in this much text: read more (a huge
                # event), unless that is already far more than any event.
                if len(buf) > 16 * self.block:
                    raise FileError(self.path, f"malformed JSON in traceEvents near byte {rd.consumed - len(buf):,}")
                more = rd.read(self.block)
                if not more:
                    yield from self._tail(buf, rd.consumed - len(buf))
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
        # no cut decodes: read the events one by one, repairing broken strings; when the text
        # ended inside its first event (a huge one), not again before the text has doubled,
        # so that the scans of a growing event stay linear in its length
        if len(buf) < self._recover_from:
            return None
        got = _recover(buf, final=False)
        if got is _INCOMPLETE:
            self._recover_from = 2 * len(buf)
            self._check_structure(buf)
            return None
        return got if got is not None and got[1] > 0 else None

    def _check_structure(self, buf: bytes) -> None:
        """``buf`` (text at array depth) ends inside its first event as far as the brackets go:
        a huge event, or a damaged one that swallows the rest. Raise FileError at the first byte
        a JSON decoder rejects, if it rejects one before the end of the text (after the repairs
        of :func:`_repair`); a huge event's text is only cut short, never rejected. One decode,
        done once per doubling of ``buf`` (linear in the end)."""
        try:
            _ANY.decode(b"[" + buf)
            return
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            first = " ".join(str(exc).split())
        if "truncated" in first.lower():
            return
        text, _ = _repair(buf)
        try:
            _ANY.decode(b"[" + text)
            return
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            msg = " ".join(str(exc).split())
        m = re.search(r"\(byte (\d+)\)", msg)
        if "truncated" in msg.lower() or m is None:
            return
        at = int(m.group(1)) - 1
        if "trailing characters" in msg:  # the array closed: _tail reports what follows it
            return
        base = self._slow_base
        raise FileError(self.path, f"malformed JSON in traceEvents ({msg.replace(m.group(0), f'at byte {base + at:,}')}); "
                                   "refused: one damaged event breaks the structure of the events after it")

    def _after_array(self, after: bytes) -> bool:
        """Read the top-level keys in ``after`` (the text after the array's closing ']').

        True when that text closes the document properly (the keys go to ``meta``);
        False otherwise, for :meth:`_tail` to report.
        """
        keys, _junk = self._doc_close(after)
        if keys is None:
            return False
        self._take_keys(keys)
        return True

    def _take_keys(self, keys: dict) -> None:
        if "traceEvents" in keys:
            raise FileError(self.path, 'a second "traceEvents" key after the first array (two traces joined '
                                       "in one file?): refused, split the file")
        self.meta.update(keys)

    def _doc_close(self, rest: bytes) -> tuple[dict | None, int | None]:
        """``rest``: the text after a ``]`` that may close the array. ``(keys, None)`` when it closes
        the document exactly (``keys``: the top-level keys written after the array); ``(None, k)``
        when the document closes before ``rest[k:]``, which is not blank; ``(None, None)`` otherwise."""
        n = len(rest)
        k = _skip_ws(rest, 0)
        if self._array_closed_by == b"":
            return ({}, None) if k == n else (None, k)
        if k < n and rest[k] == 0x7D:  # '}'
            e = _skip_ws(rest, k + 1)
            return ({}, None) if e == n else (None, e)
        if k >= n or rest[k] != 0x2C:  # ','
            return None, None
        tail = rest.rstrip(_WS)
        if tail.endswith(b"}"):
            got = _decode_repaired(b"{" + tail[k + 1 : -1] + b"}")
            if got is not None and isinstance(got[0], dict):
                return got[0], None
        q = k  # text after the document: find the '}' where the keys close (a few tries)
        for _ in range(8):
            q = rest.find(b"}", q + 1)
            if q < 0:
                break
            got = _decode_repaired(b"{" + rest[k + 1 : q] + b"}")
            if got is not None and isinstance(got[0], dict):
                e = _skip_ws(rest, q + 1)
                return (got[0], None) if e == n else (None, e)
        return None, None

    def _tail(self, buf: bytes, base: int) -> Iterator[Chunk]:
        """The last events, the closing ``]`` and any top-level keys after it (``base``: the byte
        offset of ``buf`` in the decompressed JSON, for messages).

        Linear in ``len(buf)``: at most :data:`_MAX_TAIL_TRIES` ``]`` from the end are tried
        (each one decode of the events before it), then one forward pass reads the events one
        by one to the ``]`` that closes the array (:func:`_array_close`, strings repaired as in
        :func:`_recover`). A tail neither reads is refused (FileError) at the first byte a JSON
        decoder rejects: the damage, not some later ``]``. A damaged event is refused, not
        skipped, when it breaks the structure (an unclosed object swallows the events after it,
        so no later event could be trusted); one whose brackets balance is skipped and counted.
        """
        lim = len(buf)
        tries = 0
        junk_at = None
        while tries < _MAX_TAIL_TRIES:
            r = buf.rfind(b"]", 0, lim)
            if r < 0:
                break
            lim = r
            j = r - 1  # the last non-blank byte before this ']'
            while j >= 0 and buf[j] in _WS:
                j -= 1
            if j >= 0 and buf[j] in b"[{:":
                # this ']' closes something in the keys after the array, as no event list
                # ends so; skipping it here keeps a long tail of keys linear, not quadratic
                continue
            tries += 1
            trailing, junk = self._doc_close(buf[r + 1 :])
            if trailing is None:
                if junk is not None and junk_at is None:
                    junk_at = r + 1 + junk
                continue
            ch = self._tail_events(buf[:r], one_by_one=False)
            if ch is None:  # maybe the ']' we found closes something inside the last event
                continue
            if ch is not _NO_EVENTS:
                yield ch
            self._take_keys(trailing)
            return
        r = _array_close(buf)  # one forward pass: events one by one, their strings repaired
        if r is not None:
            trailing, junk = self._doc_close(buf[r + 1 :])
            if trailing is not None:
                ch = self._tail_events(buf[:r], one_by_one=True)
                if ch is not None:
                    if ch is not _NO_EVENTS:
                        yield ch
                    self._take_keys(trailing)
                    return
            elif junk is not None:
                junk_at = r + 1 + junk
        self._tail_error(buf, base, junk_at)

    def _tail_events(self, raw_body: bytes, one_by_one: bool):
        """The events of ``raw_body`` (the text before a ``]`` that closes the array): a Chunk,
        :data:`_NO_EVENTS` when there is none, or None when they do not read."""
        body = raw_body.strip(_WS)
        if body.endswith(b","):  # a trailing comma, as some exporters write
            body = body[:-1].rstrip(_WS)
            trailing_comma = True
        else:
            trailing_comma = False
        if not body:
            if trailing_comma:
                self.notes.append("trailing comma after the last event")
            return _NO_EVENTS
        ch = _decode_events(body)
        if ch is None and one_by_one:
            got = _recover(body, final=True)
            ch = got[0] if got is not None else None
        if ch is None:
            return None
        if trailing_comma:
            self.notes.append("trailing comma after the last event")
        self.notes.extend(ch.repaired)
        return ch

    def _tail_error(self, buf: bytes, base: int, junk_at: int | None):
        """Raise the FileError for a tail no ``]`` reads: the first byte a JSON decoder rejects
        in the events (one linear decode), else the trailing data, else an unclosed array."""
        try:
            _ANY.decode(b"[" + buf)
            first = None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            first = " ".join(str(exc).split())
        if first is not None and "truncated" not in first.lower():
            m = re.search(r"\(byte (\d+)\)", first)
            at = int(m.group(1)) - 1 if m else None  # index in buf of the byte named
            if at is not None and not ("trailing characters" in first and junk_at is not None):
                if "trailing characters" in first:  # the array closes there but the document does not
                    raise FileError(self.path, f"malformed JSON after traceEvents at byte {base + at:,} "
                                               f"({buf[at : at + 16]!r}...)")
                msg = first.replace(m.group(0), f"at byte {base + at:,}")
                raise FileError(self.path, f"malformed JSON in traceEvents ({msg}); refused: one damaged "
                                           f"event breaks the structure of the events after it")
        if junk_at is not None:
            snippet = buf[junk_at : junk_at + 16]
            raise FileError(self.path, f"trailing data after the JSON document at byte {base + junk_at:,} "
                                       f"({snippet!r}...)")
        raise FileError(self.path, "truncated JSON: traceEvents array is never closed (file incomplete?)")


_NO_EVENTS = Chunk([], b"[]")  # _tail_events: the array held no events after the cut
_MAX_TAIL_TRIES = 4  # ']' tried from the end before the forward pass (each costs O(len(tail)))


def _array_close(buf: bytes) -> int | None:
    """Index of the ``]`` that closes the event array in ``buf`` (text at array depth, after a
    cut between events), found by reading the events forward one by one
    (:func:`_repair_object`, linear in each event); None when the text is not a run of objects
    separated by commas and closed by ``]`` (a damaged or non-object item)."""
    n = len(buf)
    i = _skip_ws(buf, 0)
    while i < n:
        c = buf[i]
        if c == 0x5D:  # ']'
            return i
        if c != 0x7B:  # '{'
            return None
        got = _repair_object(buf, i)
        if got is None:
            return None
        k = _skip_ws(buf, got[1])
        if k < n and buf[k] == 0x5D:
            return k
        if k >= n or buf[k] != 0x2C:
            return None
        i = _skip_ws(buf, k + 1)
    return None
