"""Bounded-memory building blocks of the ingest: an external sort, a store of per-position values,
and a keyed table on disk.

The first two keep at most about ``budget`` bytes of rows in memory and write the rest to
files in a scratch directory (the ingest's staging directory), so that what an ingest holds
does not grow with the trace; below the budget nothing touches the disk. The third keeps
nothing in memory but its index and the blocks it read last.

* :class:`ExternalSort` — rows of fixed-width numpy columns, added in any order, read back in
  the lexicographic order of their first ``n_keys`` columns (keys must be distinct: callers end
  the key with a row position). Beyond the budget, held rows are sorted into *runs* on disk and
  the runs are merged block by block (a k-way merge: every block's rows up to the smallest
  last key among the runs that still have rows on disk can go out, in one sort of those rows).
* :class:`PositionStore` — values for the positions ``0, 1, 2, …`` of some rows (say, the GPU
  ops of a staging file in file order), put in any order, a later put of a position winning, and
  taken back in position order, ``k`` at a time. Beyond the budget, the pending puts go to one
  file per range of positions (a *bucket*); a bucket is read back, and scattered into dense
  arrays, when ``take`` reaches it.
* :class:`SortedColumns` — rows keyed by an int64 key, appended in key order, kept in a file
  with an index of one entry per appended block; ``lookup`` reads the blocks it needs (the
  comm spans and their launch calls of a rank, which grow with the trace).

Files are raw column bytes (``ndarray.tofile``), native byte order, deleted by ``close`` (the
classes are context managers). Errors: OSError from the scratch directory propagates.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

_COUNTER = itertools.count()

BATCH_ROWS = 65_536
"""Rows per batch :meth:`ExternalSort.batches` yields from memory (merged batches vary)."""

MIN_BLOCK_ROWS = 1024
"""Rows a merge reads from a run at a time, at least (with many runs the budget gives fewer)."""

MERGE_FAN_IN = 64
"""Runs merged at once; beyond it runs are first merged into larger ones (passes), so that open
files and the merge's blocks stay bounded."""

STATE_BUDGET = 8 * 2**20
"""Bytes of per-row state each table of an ingest's second pass may hold in memory (the link
pass's next starts and launch calls, the collectives' enclosing-op search, and the sorts behind
them). Beyond it they go to files in the staging directory, so that the pass's memory does not
grow with the trace. A sort or store holds up to about twice its budget while it sorts or
loads (see the classes)."""


def _row_bytes(dtypes) -> int:
    return sum(np.dtype(d).itemsize for d in dtypes)


def _count_at_most(keys: list[np.ndarray], bound: tuple) -> int:
    """Rows of a block sorted by ``keys`` (lexicographically) whose key is ≤ ``bound``."""
    lo, hi = 0, len(keys[0])
    for k, b in zip(keys[:-1], bound[:-1]):
        part = k[lo:hi]
        lo, hi = lo + int(np.searchsorted(part, b, side="left")), lo + int(np.searchsorted(part, b, side="right"))
        if lo == hi:
            return lo
    return lo + int(np.searchsorted(keys[-1][lo:hi], bound[-1], side="right"))


def _sort_order(cols: list[np.ndarray], n_keys: int) -> np.ndarray:
    if n_keys == 1:
        return np.argsort(cols[0], kind="stable")
    return np.lexsort(cols[:n_keys][::-1])


def _sorted_in_place(cols: list[np.ndarray], n_keys: int) -> list[np.ndarray]:
    """``cols`` reordered by their keys, one column at a time (the list's arrays are replaced, so
    at most one column is held twice)."""
    order = _sort_order(cols, n_keys)
    for i in range(len(cols)):
        cols[i] = cols[i][order]
    return cols


class ExternalSort:
    """Rows sorted by their first ``n_keys`` columns in at most about ``budget`` bytes.

    ``dtypes``: one numpy dtype per column. ``add(*cols)`` appends rows (equal-length arrays);
    ``batches()`` yields the rows in key order as lists of arrays (sizes vary, none empty), once.
    Keys must be distinct, or equal keys come out in no set order. ``n_runs``: the runs written
    (0 when every row stayed in memory). Memory: the held rows (≤ budget) while adding, and
    sorting them takes their sort order (8 B a row) and one column more; while merging, one block
    per run (half the budget in all, at least MIN_BLOCK_ROWS rows each) and the rows of one output
    step (at most as much again). More than MERGE_FAN_IN runs are first merged MERGE_FAN_IN at a
    time into larger runs, so that open files and blocks stay bounded.
    """

    def __init__(self, dtypes: Sequence, n_keys: int, budget: int, scratch: str | Path, name: str = "sort"):
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.n_keys = n_keys
        self.budget = max(int(budget), 1)
        self._row = _row_bytes(self.dtypes)
        self._scratch = Path(scratch)
        self._name = f"{name}.{os.getpid()}.{next(_COUNTER)}"
        self._held: list[list[np.ndarray]] = []
        self._held_rows = 0
        self._runs: list[tuple[Path, int]] = []  # (file, rows)
        self.rows = 0
        self.n_runs = 0  # runs written (0: all in memory)

    def add(self, *cols: np.ndarray) -> None:
        n = len(cols[0])
        if n == 0:
            return
        self._held.append([np.asarray(c, dtype=d) for c, d in zip(cols, self.dtypes)])
        self._held_rows += n
        self.rows += n
        if self._held_rows * self._row >= self.budget:
            self._spill()

    def _take_held(self) -> list[np.ndarray]:
        """The held rows as one array per column, unsorted; the held parts are dropped column by
        column as they are joined."""
        parts, self._held, self._held_rows = self._held, [], 0
        cols = []
        for i in range(len(self.dtypes)):
            cols.append(np.concatenate([p[i] for p in parts]) if len(parts) > 1 else parts[0][i])
            for p in parts:
                p[i] = None
        return cols

    def _spill(self) -> None:
        cols = self._take_held()
        order = _sort_order(cols, self.n_keys)
        path = self._scratch / f"{self._name}.run{len(self._runs)}"
        n = len(order)
        with open(path, "wb") as fh:
            for i in range(len(cols)):
                cols[i][order].tofile(fh)
                cols[i] = None
        self._runs.append((path, n))
        self.n_runs += 1

    def batches(self, rows: int | None = None) -> Iterator[list[np.ndarray]]:
        if not self._runs:
            if self._held_rows:
                cols = _sorted_in_place(self._take_held(), self.n_keys)
                rows = rows or BATCH_ROWS
                for at in range(0, len(cols[0]), rows):
                    yield [c[at:at + rows] for c in cols]
            return
        if self._held_rows:
            self._spill()
        while len(self._runs) > MERGE_FAN_IN:  # merge in passes: at most MERGE_FAN_IN runs open at once
            group, self._runs = self._runs[:MERGE_FAN_IN], self._runs[MERGE_FAN_IN:]
            self._runs.append(self._merge_to_run(group))
        yield from self._merge(self._runs)
        self.close()

    def _merge_to_run(self, group: list[tuple[Path, int]]) -> tuple[Path, int]:
        """Merge the runs ``group`` into one new run (its columns written to one file each, then
        joined); the group's files are removed."""
        path = self._scratch / f"{self._name}.run{len(self._runs) + self.n_runs}m"
        parts = [path.with_name(f"{path.name}.c{i}") for i in range(len(self.dtypes))]
        n = 0
        try:
            handles = [open(p, "wb") for p in parts]
            try:
                for cols in self._merge(group):
                    for h, c in zip(handles, cols):
                        c.tofile(h)
                    n += len(cols[0])
            finally:
                for h in handles:
                    h.close()
            with open(path, "wb") as out:
                for p in parts:
                    with open(p, "rb") as fh:
                        shutil.copyfileobj(fh, out, 1 << 20)
        finally:
            for p in parts:
                p.unlink(missing_ok=True)
        for p, _ in group:
            Path(p).unlink(missing_ok=True)
        return path, n

    def _merge(self, run_list: list[tuple[Path, int]]) -> Iterator[list[np.ndarray]]:
        nk = self.n_keys
        block = max(MIN_BLOCK_ROWS, self.budget // (2 * self._row * len(run_list)))  # blocks: half the budget
        runs = [dict(path=p, n=n, at=0, cols=None) for p, n in run_list]
        try:
            for r in runs:
                r["fh"] = open(r["path"], "rb")
            while True:
                for r in runs:
                    if (r["cols"] is None or not len(r["cols"][0])) and r["at"] < r["n"]:
                        r["cols"] = self._read_block(r, block)
                live = [r for r in runs if r["cols"] is not None and len(r["cols"][0])]
                if not live:
                    return
                waiting = [r for r in live if r["at"] < r["n"]]  # still rows on disk
                if waiting:
                    bound = min(tuple(c[-1].item() for c in r["cols"][:nk]) for r in waiting)
                    cuts = [_count_at_most(r["cols"][:nk], bound) for r in live]
                else:
                    cuts = [len(r["cols"][0]) for r in live]
                parts = []
                for r, k in zip(live, cuts):
                    if k:
                        parts.append([c[:k] for c in r["cols"]])
                        r["cols"] = [c[k:] for c in r["cols"]]
                cols = [np.concatenate([p[i] for p in parts]) for i in range(len(self.dtypes))]
                del parts
                yield _sorted_in_place(cols, nk) if len(live) > 1 else cols
        finally:
            for r in runs:
                if "fh" in r:
                    r["fh"].close()

    def _read_block(self, r: dict, block: int) -> list[np.ndarray]:
        k = min(block, r["n"] - r["at"])
        out = []
        off = 0
        fh = r["fh"]
        for d in self.dtypes:
            fh.seek(off + r["at"] * d.itemsize)
            out.append(np.fromfile(fh, dtype=d, count=k))
            off += r["n"] * d.itemsize
        r["at"] += k
        return out

    def close(self) -> None:
        self._held, self._held_rows = [], 0
        for p, _ in self._runs:
            Path(p).unlink(missing_ok=True)
        self._runs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PositionStore:
    """Values for positions 0, 1, 2, … put in any order and taken back in order, in about
    ``budget`` bytes.

    ``dtypes``: one numpy dtype per value column. ``put(pos, *cols)``: values for the positions
    ``pos`` (an int64 array); a later put of a position replaces an earlier one. ``take(k)``: the
    values of the next ``k`` positions as a list of arrays (zeros where nothing was put); puts
    for positions already taken are an error (ValueError). Memory: pending puts up to the budget
    (8 B a position more than the values), then one bucket of dense arrays (``bucket_rows``
    positions, a quarter of the budget by default) at a time. ``n_flushes``: how many times the
    pending puts went to files (0 when everything stayed in memory).
    """

    def __init__(self, dtypes: Sequence, budget: int, scratch: str | Path, name: str = "pos",
                 bucket_rows: int | None = None):
        self.dtypes = [np.dtype(d) for d in dtypes]
        row = _row_bytes(self.dtypes)
        self.bucket_rows = int(bucket_rows or max(256, int(budget) // (4 * max(row, 1))))
        self.budget = max(int(budget), 1)
        self._rec = row + 8
        self._scratch = Path(scratch)
        self._name = f"{name}.{os.getpid()}.{next(_COUNTER)}"
        self._pending: list[tuple[np.ndarray, list[np.ndarray]]] = []
        self._pending_bytes = 0
        self._files: dict[int, Path] = {}
        self._taken = 0  # positions handed out so far
        self._bucket = -1
        self._dense: list[np.ndarray] = []
        self.n_flushes = 0  # times the pending puts went to files (0: all in memory)

    def put(self, pos: np.ndarray, *cols) -> None:
        pos = np.asarray(pos, dtype=np.int64)
        if not len(pos):
            return
        if int(pos.min()) < self._taken:
            raise ValueError("PositionStore: a value put for a position already taken")
        if self._bucket >= 0:  # positions of the bucket being taken go straight into it
            base = self._bucket * self.bucket_rows
            here = pos < base + self.bucket_rows
            if here.any():
                for c, d, out in zip(cols, self.dtypes, self._dense):
                    out[pos[here] - base] = np.asarray(c, dtype=d)[here]
                if here.all():
                    return
                pos, cols = pos[~here], [np.asarray(c)[~here] for c in cols]
        self._pending.append((pos, [np.asarray(c, dtype=d) for c, d in zip(cols, self.dtypes)]))
        self._pending_bytes += len(pos) * self._rec
        if self._pending_bytes >= self.budget:
            self._flush()

    def _flush(self) -> None:
        """Append every pending put to its bucket's file (positions then columns, per put), one
        bucket file open at a time."""
        by_bucket: dict[int, list] = {}
        for pos, cols in self._pending:
            b = pos // self.bucket_rows
            for bucket in np.unique(b).tolist():
                m = b == bucket
                by_bucket.setdefault(bucket, []).append((pos[m], [c[m] for c in cols]))
        self._pending, self._pending_bytes = [], 0
        for bucket, puts in by_bucket.items():
            path = self._files.setdefault(bucket, self._scratch / f"{self._name}.b{bucket}")
            with open(path, "ab") as fh:
                for p, cols in puts:
                    np.array([len(p)], dtype=np.int64).tofile(fh)
                    p.tofile(fh)
                    for c in cols:
                        c.tofile(fh)
        self.n_flushes += 1

    def _load(self, bucket: int) -> None:
        base = bucket * self.bucket_rows
        dense = [np.zeros(self.bucket_rows, dtype=d) for d in self.dtypes]
        path = self._files.pop(bucket, None)
        if path is not None:
            with open(path, "rb") as fh:
                while True:
                    head = np.fromfile(fh, dtype=np.int64, count=1)
                    if not len(head):
                        break
                    n = int(head[0])
                    p = np.fromfile(fh, dtype=np.int64, count=n) - base
                    for d, out in zip(self.dtypes, dense):
                        out[p] = np.fromfile(fh, dtype=d, count=n)
            path.unlink(missing_ok=True)
        keep = []
        for pos, cols in self._pending:
            m = (pos >= base) & (pos < base + self.bucket_rows)
            if m.any():
                p = pos[m] - base
                for c, out in zip(cols, dense):
                    out[p] = c[m]
                if not m.all():
                    keep.append((pos[~m], [c[~m] for c in cols]))
            else:
                keep.append((pos, cols))
        self._pending = keep
        self._pending_bytes = sum(len(p) * self._rec for p, _ in keep)
        self._bucket, self._dense = bucket, dense

    def take(self, k: int) -> list[np.ndarray]:
        parts: list[list[np.ndarray]] = []
        while k > 0:
            bucket, off = divmod(self._taken, self.bucket_rows)
            if bucket != self._bucket:
                self._load(bucket)
            n = min(k, self.bucket_rows - off)
            parts.append([d[off:off + n] for d in self._dense])
            self._taken += n
            k -= n
        if not parts:
            return [np.empty(0, dtype=d) for d in self.dtypes]
        if len(parts) == 1:
            return [p.copy() for p in parts[0]]
        return [np.concatenate([p[i] for p in parts]) for i in range(len(self.dtypes))]

    def close(self) -> None:
        self._pending, self._dense = [], []
        for p in self._files.values():
            Path(p).unlink(missing_ok=True)
        self._files = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SortedColumns:
    """Rows keyed by an int64 key, appended in increasing key order, kept in a file (for tables
    that grow with the trace).

    ``dtypes``: the value columns' dtypes. ``append(keys, *cols, valid=None)``: rows with keys
    above every key so far (ValueError otherwise); ``valid`` (optional, per column a bool array or
    None) says which values are present. ``lookup(keys)`` → (found, values, valids): per key
    whether it is there, and per column its values (0 where not found) and presence (None when
    the column has no nulls). Keys may come in any order; lookups in increasing order read each
    stored block once. In memory: one index entry per appended block (first and last key, file
    offset, rows) and the blocks the last lookup read (at most ``cache_blocks``).
    """

    def __init__(self, dtypes: Sequence, scratch: str | Path, name: str = "keyed", cache_blocks: int = 2):
        self.dtypes = [np.dtype(d) for d in dtypes]
        self._path = Path(scratch) / f"{name}.{os.getpid()}.{next(_COUNTER)}"
        self._fh = None
        self._blocks: list[tuple[int, int, int, int]] = []  # (first key, last key, offset, rows)
        self._has_valid = [False] * len(self.dtypes)
        self._cache: dict[int, list] = {}
        self._cache_blocks = cache_blocks
        self._size = 0
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def append(self, keys: np.ndarray, *cols, valid=None) -> None:
        keys = np.asarray(keys, dtype=np.int64)
        n = len(keys)
        if not n:
            return
        if (n > 1 and not (keys[1:] > keys[:-1]).all()) or (self._blocks and keys[0] <= self._blocks[-1][1]):
            raise ValueError("SortedColumns: keys must increase")
        valid = list(valid) if valid is not None else [None] * len(self.dtypes)
        if self._fh is None:
            self._fh = open(self._path, "wb")
        off = self._size
        parts = [keys] + [np.asarray(c, dtype=d) for c, d in zip(cols, self.dtypes)]
        for i, v in enumerate(valid):
            if v is not None and not np.all(v):
                self._has_valid[i] = True
            parts.append(np.ones(n, dtype=bool) if v is None else np.asarray(v, dtype=bool))
        for p in parts:
            p.tofile(self._fh)
            self._size += p.nbytes
        self._blocks.append((int(keys[0]), int(keys[-1]), off, n))
        self.rows += n

    def _block(self, b: int) -> list[np.ndarray]:
        got = self._cache.get(b)
        if got is not None:
            return got
        if self._fh is not None:
            self._fh.flush()
        _first, _last, off, n = self._blocks[b]
        out = []
        with open(self._path, "rb") as fh:
            fh.seek(off)
            out.append(np.fromfile(fh, dtype=np.int64, count=n))
            for d in self.dtypes:
                out.append(np.fromfile(fh, dtype=d, count=n))
            for _ in self.dtypes:
                out.append(np.fromfile(fh, dtype=bool, count=n))
        while len(self._cache) >= self._cache_blocks:
            self._cache.pop(next(iter(self._cache)))
        self._cache[b] = out
        return out

    def lookup(self, keys: np.ndarray):
        keys = np.asarray(keys, dtype=np.int64)
        n, k = len(keys), len(self.dtypes)
        found = np.zeros(n, dtype=bool)
        values = [np.zeros(n, dtype=d) for d in self.dtypes]
        valids = [np.zeros(n, dtype=bool) if h else None for h in self._has_valid]
        if not self._blocks or not n:
            return found, values, valids
        lasts = np.array([b[1] for b in self._blocks], dtype=np.int64)
        which = np.searchsorted(lasts, keys)  # the only block that may hold each key
        for b in np.unique(which[which < len(self._blocks)]).tolist():
            m = which == b
            blk = self._block(b)
            i = np.minimum(np.searchsorted(blk[0], keys[m]), len(blk[0]) - 1)
            hit = blk[0][i] == keys[m]
            rows = np.flatnonzero(m)[hit]
            found[rows] = True
            for c in range(k):
                values[c][rows] = blk[1 + c][i[hit]]
                if valids[c] is not None:
                    valids[c][rows] = blk[1 + k + c][i[hit]]
        return found, values, valids

    def get(self, key: int):
        """The row of ``key`` as a tuple of Python values (None where not present), or None."""
        found, values, valids = self.lookup(np.array([key], dtype=np.int64))
        if not found[0]:
            return None
        return tuple(None if v is not None and not v[0] else c[0].item() for c, v in zip(values, valids))

    def to_dict(self) -> dict:
        """Every row as {key: tuple} (for tests and small tables)."""
        out = {}
        for b in range(len(self._blocks)):
            blk = self._block(b)
            k = len(self.dtypes)
            for j, key in enumerate(blk[0].tolist()):
                out[key] = tuple(None if self._has_valid[c] and not blk[1 + k + c][j] else blk[1 + c][j].item()
                                 for c in range(k))
        return out

    def close(self) -> None:
        """Remove the file (the object is empty afterwards)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._path.unlink(missing_ok=True)
        self._blocks, self._cache, self.rows, self._size = [], {}, 0, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
