"""Fuzz the readers with a time limit per case: crashes, hangs, bad values and stores changed.

Each case is one mutated input file (a Kineto trace, an nccl-tests log or an Nsight Systems
export, from the fixtures), ingested into a copy of a store that already holds a good run, in a
worker process that stays up from case to case (tracekit imported once). A case is:

* ``ok``: the ingest succeeded; its collectives and events are then checked for bad values (a
  negative or NaN size, time, duration, bandwidth);
* ``refused``: it raised tracekit's own error (TracekitError) in one line, the store unchanged;
* ``crash``: any other exception, or a multi-line message;
* ``hang``: no answer within the limit (the worker is killed and started again);
* ``store changed``: a refused case whose store differs from the copy it started from.

Usage::

    python benchmarks/fuzz.py --cases 1000 --limit 20 --readers kineto nccl_tests nsys --seed 1

prints one line per reader with the counts (and the first few failures), and ``--out FILE`` writes
them as JSON. Mutations are byte-level (a byte deleted, inserted, replaced; a bracket, brace or
quote removed; a span duplicated, cut out or moved; the text truncated), line-level for the logs
(a line deleted, duplicated, cut, garbled), page-level for SQLite files (a page zeroed or
garbled, the file truncated). ``run_cases`` is also what tests/ingest/test_bounded_fuzz.py runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"


# -- inputs and mutations ---------------------------------------------------------------------

def bases(reader: str) -> list[tuple[str, bytes]]:
    """(file name, bytes) of the fixtures a reader's mutations start from."""
    if reader == "kineto":
        tp = gzip.decompress((FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz").read_bytes())
        doc = json.loads(tp)
        doc["traceEvents"] = doc["traceEvents"][:400]
        return [("rank0.json", (FIXTURES / "handmade" / "two_rank" / "rank0.json").read_bytes()),
                ("rank0.json", json.dumps(doc).encode()),
                ("rank0.json", (FIXTURES / "defects" / "alltoall_splits.json").read_bytes())]
    if reader == "nccl_tests":
        return [(p.name, p.read_bytes()) for p in sorted((FIXTURES / "nccl_tests").glob("*.log"))
                + sorted((FIXTURES / "nccl_tests").glob("*.out"))]
    if reader == "nsys":
        return [(p.name, p.read_bytes()) for p in sorted((FIXTURES / "nsys_job").glob("*.sqlite"))]
    raise ValueError(reader)


def mutate_bytes(b: bytes, rnd: random.Random) -> bytes:
    """One to three byte-level mutations of ``b``."""
    b = bytearray(b)
    for _ in range(rnd.randint(1, 3)):
        if not b:
            break
        kind = rnd.choice(["delete", "insert", "replace", "structural", "dup", "cut", "move", "truncate"])
        i = rnd.randrange(len(b))
        if kind == "delete":
            del b[i]
        elif kind == "insert":
            b.insert(i, rnd.choice(b'{}[]",:\\0123456789eE.-ntf \n\x00\xff'))
        elif kind == "replace":
            b[i] = rnd.randrange(256)
        elif kind == "structural":  # a bracket, brace, quote, comma or colon removed
            idx = [k for k in range(max(0, i - 4096), min(len(b), i + 4096)) if b[k] in b'{}[]",:']
            if idx:
                del b[rnd.choice(idx)]
        elif kind == "dup":
            j = min(len(b), i + rnd.randint(1, 2000))
            b[j:j] = b[i:j]
        elif kind == "cut":
            del b[i:i + rnd.randint(1, 2000)]
        elif kind == "move":
            j = min(len(b), i + rnd.randint(1, 2000))
            part = bytes(b[i:j])
            del b[i:j]
            k = rnd.randrange(len(b) + 1)
            b[k:k] = part
        elif kind == "truncate":
            del b[i:]
    return bytes(b)


def mutate_lines(b: bytes, rnd: random.Random) -> bytes:
    """Line-level mutations of a text log (and a byte-level one half the time)."""
    lines = b.split(b"\n")
    for _ in range(rnd.randint(1, 4)):
        if not lines:
            break
        i = rnd.randrange(len(lines))
        kind = rnd.choice(["delete", "dup", "cut", "garble", "swap", "number"])
        if kind == "delete":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, lines[i])
        elif kind == "cut":
            lines[i] = lines[i][: rnd.randint(0, len(lines[i]))]
        elif kind == "garble":
            lines[i] = bytes(rnd.randrange(32, 127) for _ in range(rnd.randint(1, 80)))
        elif kind == "swap":
            j = rnd.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "number":  # a number in the line replaced by an odd one
            toks = lines[i].split(b" ")
            k = [n for n, t in enumerate(toks) if t[:1].isdigit()]
            if k:
                toks[rnd.choice(k)] = rnd.choice([b"0", b"-1", b"1e400", b"nan", b"inf", b"99999999999999999999", b"N/A"])
                lines[i] = b" ".join(toks)
    out = b"\n".join(lines)
    return mutate_bytes(out, rnd) if rnd.random() < 0.5 else out


def mutate_pages(b: bytes, rnd: random.Random) -> bytes:
    """SQLite: a 4 kB page zeroed or garbled, bytes replaced, or the file truncated."""
    b = bytearray(b)
    kind = rnd.choice(["zero", "garble", "bytes", "truncate"])
    page = 4096 * rnd.randrange(max(1, len(b) // 4096))
    if kind == "zero":
        b[page:page + 4096] = bytes(min(4096, len(b) - page))
    elif kind == "garble":
        b[page:page + 4096] = bytes(rnd.randrange(256) for _ in range(min(4096, len(b) - page)))
    elif kind == "bytes":
        for _ in range(rnd.randint(1, 16)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
    else:
        del b[rnd.randrange(len(b)):]
    return bytes(b)


def make_cases(reader: str, n: int, seed: int) -> list[tuple[str, bytes]]:
    """``n`` mutated inputs (file name, bytes) for ``reader``, reproducible from ``seed``."""
    rnd = random.Random(f"{reader}:{seed}")
    src = bases(reader)
    fn = {"kineto": mutate_bytes, "nccl_tests": mutate_lines, "nsys": mutate_pages}[reader]
    out = []
    for _ in range(n):
        name, b = rnd.choice(src)
        data = fn(b, rnd)
        if reader == "kineto" and rnd.random() < 0.25:
            name, data = name + ".gz", gzip.compress(data, 1)
        out.append((name, data))
    return out


# -- the worker -------------------------------------------------------------------------------

def _snapshot(path: Path) -> dict:
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _bad_values(store: Path, rid: str) -> str | None:
    """A negative or NaN value in the run's numbers, named; None when there is none."""
    import duckdb

    d = store / "runs" / rid
    con = duckdb.connect()
    checks = [
        ("events", "events/*.parquet", "ts_ns <= 0 OR dur_ns < 0 OR dur_ns IS NULL"),
        ("collectives", "collectives.parquet",
         "size_bytes < 0 OR wire_bytes < 0 OR dur_ns < 0 OR isnan(CAST(size_bytes AS DOUBLE))"),
    ]
    for name, pattern, where in checks:
        files = sorted(d.glob(pattern))
        if not files:
            continue
        lst = "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"
        try:
            n = con.execute(f"SELECT count(*) FROM read_parquet({lst}, union_by_name = true) WHERE {where}").fetchone()[0]
        except duckdb.Error as exc:  # a column this source does not write
            if "not found" in str(exc).lower() or "binder" in str(exc).lower():
                continue
            raise
        if n:
            return f"{n} row(s) of {name} with {where}"
    return None


def _worker(conn, template: str) -> None:
    os.environ.setdefault("TRACEKIT_NO_PROGRESS", "1")
    from tracekit.errors import TracekitError
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    while True:
        job = conn.recv()
        if job is None:
            return
        path, store_dir = job
        shutil.copytree(template, store_dir, symlinks=True)  # the runs are links to their versions
        before = _snapshot(Path(store_dir))
        try:
            rid = ingest_paths([Path(path)], Store(store_dir))
        except TracekitError as exc:
            msg = str(exc)
            if "\n" in msg:
                conn.send(("crash", f"multi-line message: {msg[:200]!r}"))
            elif _snapshot(Path(store_dir)) != before:
                conn.send(("store changed", msg[:200]))
            else:
                conn.send(("refused", msg[:200]))
        except BaseException as exc:  # noqa: BLE001 - the point of the fuzz
            conn.send(("crash", f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
        else:
            try:
                bad = _bad_values(Path(store_dir), rid)
            except Exception as exc:  # noqa: BLE001
                bad = f"the stored run does not read: {type(exc).__name__}: {exc}"[:200]
            conn.send(("bad values", bad) if bad else ("ok", rid))
        finally:
            shutil.rmtree(store_dir, ignore_errors=True)


class Harness:
    """A worker process that ingests one case at a time; killed and restarted on a hang."""

    def __init__(self, template: Path):
        self.template = str(template)
        self.ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        self._start()

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.template), daemon=True)
        self.proc.start()
        child.close()

    def run(self, path: Path, store_dir: Path, limit_s: float) -> tuple[str, str, float]:
        t0 = time.perf_counter()
        self.conn.send((str(path), str(store_dir)))
        if self.conn.poll(limit_s):
            try:
                kind, detail = self.conn.recv()
            except EOFError:
                kind, detail = "crash", f"the worker died (exit code {self.proc.exitcode})"
                self._restart()
        elif not self.proc.is_alive():
            kind, detail = "crash", f"the worker died (exit code {self.proc.exitcode})"
            self._restart()
        else:
            kind, detail = "hang", f"no answer in {limit_s:g} s"
            self._restart()
        shutil.rmtree(store_dir, ignore_errors=True)
        return kind, detail, time.perf_counter() - t0

    def _restart(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self._start()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def template_store(where: Path) -> Path:
    """A store holding one good run (the hand-made two-rank trace), for 'store changed'."""
    from tracekit.ingest import ingest_paths
    from tracekit.store import Store

    s = where / "template"
    ingest_paths([FIXTURES / "handmade" / "two_rank"], Store(s), run_id="good")
    return s


def run_cases(reader: str, cases: list[tuple[str, bytes]], limit_s: float, workdir: Path) -> dict:
    """Run ``cases`` (file name, bytes) for ``reader``: counts per kind, the slowest case's
    seconds, and the first few failures (kind, case index, detail)."""
    template = template_store(workdir)
    h = Harness(template)
    counts = {k: 0 for k in ("ok", "refused", "crash", "hang", "bad values", "store changed")}
    failures, slowest = [], 0.0
    try:
        for i, (name, data) in enumerate(cases):
            d = workdir / f"case{i}"
            d.mkdir()
            p = d / name
            p.write_bytes(data)
            kind, detail, took = h.run(p, d / "store", limit_s)
            counts[kind] += 1
            slowest = max(slowest, took)
            if kind not in ("ok", "refused") and len(failures) < 10:
                failures.append((kind, i, detail))
                (workdir / f"failed-{reader}-{i}-{name}").write_bytes(data)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        h.close()
    return dict(reader=reader, cases=len(cases), limit_s=limit_s, counts=counts, slowest_s=round(slowest, 2),
                failures=failures)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="mutations per reader")
    ap.add_argument("--limit", type=float, default=20.0, help="seconds a case may take before it is a hang")
    ap.add_argument("--readers", nargs="+", default=["kineto", "nccl_tests", "nsys"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the failing inputs here")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="tracekit-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for reader in a.readers:
        t0 = time.perf_counter()
        wd = work / reader
        shutil.rmtree(wd, ignore_errors=True)
        wd.mkdir()
        r = run_cases(reader, make_cases(reader, a.cases, a.seed), a.limit, wd)
        r["wall_s"] = round(time.perf_counter() - t0, 1)
        results.append(r)
        c = r["counts"]
        print(f"{reader}: {r['cases']} cases in {r['wall_s']} s (slowest {r['slowest_s']} s): "
              + ", ".join(f"{k} {v}" for k, v in c.items()), flush=True)
        for f in r["failures"]:
            print(f"  {f[0]} case {f[1]}: {f[2]}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(results, indent=2))
    bad = sum(r["counts"][k] for r in results for k in ("crash", "hang", "bad values", "store changed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
