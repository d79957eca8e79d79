"""Property (issue 17, item 7, Nsight part): whatever a mutated Nsight Systems SQLite export looks
like, ingest succeeds or raises tracekit's own one-line error; a failed ingest leaves the store
unchanged, and a successful one stores no negative time.

The base is the hand-made one-rank export of tests/ingest/test_nsys.py (NCCL all-reduce and all-gather in
their NVTX ranges, a GEMM overlapping the first, the launch calls): built with sqlite3 following
the schema tracekit/ingest/nsys.py reads. Mutations: a cell set to another value or type (NULL,
a huge or negative integer, a float, text, a blob), rows deleted, a column or a table dropped or
renamed, and the file truncated or one byte of it overwritten.
"""

from __future__ import annotations

import collections
import os
import shutil
import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import store_snapshot
from tests.ingest.test_nsys import _nccl_file
from tracekit.errors import TracekitError
from tracekit.ingest import ingest_paths
from tracekit.store import Store

TABLES = ["StringIds", "META_DATA_EXPORT", "TARGET_INFO_GPU", "CUPTI_ACTIVITY_KIND_KERNEL",
          "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"]
values = (st.none() | st.integers(-(2**63), 2**63 - 1) | st.integers(-5000, 10_000)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | st.binary(max_size=8)
          | st.sampled_from(['{"Message size [bytes]": -1}', '{"Rank": 9, "No. of ranks": 0}', "{", "[]",
                             '{"data": [{"Message size [bytes]": {"uint64": 1e30}}]}']))


def _mutate_db(path, data) -> None:
    db = sqlite3.connect(path)
    for _ in range(data.draw(st.integers(1, 5))):
        t = data.draw(st.sampled_from(TABLES))
        cols = [r[1] for r in db.execute(f"PRAGMA table_info({t})")]
        if not cols:
            continue  # dropped or renamed by an earlier mutation
        kind = data.draw(st.sampled_from(["cell", "cell", "cell", "delete", "dropcol", "droptable", "rename"]))
        rowids = [r[0] for r in db.execute(f"SELECT rowid FROM {t}")]
        if kind == "cell" and rowids:
            c = data.draw(st.sampled_from(cols))
            try:
                db.execute(f'UPDATE {t} SET "{c}" = ? WHERE rowid = ?', (data.draw(values), data.draw(st.sampled_from(rowids))))
            except sqlite3.IntegrityError:
                pass  # StringIds.id is an INTEGER PRIMARY KEY: SQLite refuses other types
        elif kind == "delete" and rowids:
            db.execute(f"DELETE FROM {t} WHERE rowid = ?", (data.draw(st.sampled_from(rowids)),))
        elif kind == "dropcol" and len(cols) > 1:
            try:
                db.execute(f'ALTER TABLE {t} DROP COLUMN "{data.draw(st.sampled_from(cols))}"')
            except sqlite3.OperationalError:
                pass  # a column SQLite will not drop (primary key)
        elif kind == "droptable":
            db.execute(f"DROP TABLE {t}")
        elif kind == "rename":
            db.execute(f"ALTER TABLE {t} RENAME TO {t}_old")
    db.commit()
    db.close()
    cut = data.draw(st.sampled_from(["none", "none", "truncate", "corrupt"]))
    raw = path.read_bytes()
    if cut == "truncate":
        path.write_bytes(raw[: data.draw(st.integers(0, len(raw)))])
    elif cut == "corrupt":
        i = data.draw(st.integers(0, len(raw) - 1))
        path.write_bytes(raw[:i] + bytes([data.draw(st.integers(0, 255))]) + raw[i + 1:])


EXAMPLES = int(os.environ.get("TRACEKIT_FUZZ_EXAMPLES", "25"))
"""Examples per run (the suite keeps it small; set more to fuzz longer)."""
OUTCOMES: collections.Counter = collections.Counter()
"""'error' (tracekit's one-line error) / 'read' (ingested) per example, printed with TRACEKIT_FUZZ_EXAMPLES."""


def _base_store(root):
    """A store holding one good run ("before"), built once per session and copied per example."""
    base = root / "base-store"
    if not base.exists():
        ingest_paths([str(_nccl_file(root / "other.sqlite"))], Store(base), run_id="before")
    return base


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_nsys_exports_ingest_or_raise_our_error(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("nsysprop")
    path = _nccl_file(tmp / "rank0.sqlite")
    _mutate_db(path, data)
    # a run already there: a failed ingest must leave it (and everything else) as it was
    shutil.copytree(_base_store(tmp_path_factory.getbasetemp()), tmp / "store", symlinks=True)
    store = Store(tmp / "store")
    before = store_snapshot(store.path)
    try:
        rid = ingest_paths([str(path)], store, run_id="fuzz")
    except TracekitError as exc:
        assert "\n" not in str(exc) and str(exc)
        assert store_snapshot(store.path) == before
        OUTCOMES["error"] += 1
        return
    OUTCOMES["read"] += 1
    con = store.connect(run_ids=[rid])
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)
    for table in ("events", "collectives"):
        assert con.execute(f"SELECT count(*) FROM {table} WHERE dur_ns < 0 OR ts_ns < 0").fetchone() == (0,), table
    con.close()


def teardown_module():
    if "TRACEKIT_FUZZ_EXAMPLES" in os.environ:
        print(f"\nnsys fuzz: {sum(OUTCOMES.values())} cases, {OUTCOMES['error']} clear errors, "
              f"{OUTCOMES['read']} read; 0 other exceptions, 0 negative times, 0 store changes (else failed)")
