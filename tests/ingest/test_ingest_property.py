"""Property: whatever a mutated trace looks like, ingest succeeds or raises tracekit's own error.

Mutations of real small traces (the hand-made and TP fixtures): fields dropped,
values replaced by other JSON types, phases turned into B/E or removed, the text truncated or corrupted at a random
byte. Never another exception, and a failed ingest leaves the store unchanged.
"""

from __future__ import annotations

from tracekit import analyses
import gzip
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, store_snapshot
from tracekit.errors import TracekitError
from tracekit.ingest import ingest_paths
from tracekit.store import Store

BASES = [
    json.loads((FIXTURES / "handmade" / "two_rank" / "rank0.json").read_text()),
    json.loads((FIXTURES / "defects" / "alltoall_splits.json").read_text()),
    json.loads(gzip.decompress((FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz").read_bytes()))
    | {"traceEvents": json.loads(gzip.decompress((FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz").read_bytes()))["traceEvents"][:300]},
]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARG_FIELDS = ["correlation", "External id", "device", "stream", "Collective name", "In msg nelems",
              "Out msg nelems", "dtype", "Group size", "Process Group Ranks", "In split size", "Input Dims", "Seq"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _mutate(doc, data):
    doc = json.loads(json.dumps(doc))
    evs = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 6))):
        if not evs:
            break
        e = evs[data.draw(st.integers(0, len(evs) - 1))]
        if not isinstance(e, dict):
            continue
        kind = data.draw(st.sampled_from(["drop", "retype", "argdrop", "argretype", "top", "phase"]))
        if kind == "phase":  # Chrome duration events (paired per thread) and events with no phase
            ph = data.draw(st.sampled_from(["B", "E", None]))
            if ph is None:
                e.pop("ph", None)
            else:
                e["ph"] = ph
        elif kind == "drop":
            e.pop(data.draw(st.sampled_from(FIELDS)), None)
        elif kind == "retype":
            e[data.draw(st.sampled_from(FIELDS))] = data.draw(json_values)
        elif kind in ("argdrop", "argretype") and isinstance(e.get("args"), dict):
            k = data.draw(st.sampled_from(ARG_FIELDS))
            if kind == "argdrop":
                e["args"].pop(k, None)
            else:
                e["args"][k] = data.draw(json_values)
        elif kind == "top":
            doc[data.draw(st.sampled_from(["distributedInfo", "deviceProperties", "traceEvents"]))] = data.draw(json_values)
            if not isinstance(doc.get("traceEvents"), list):
                break
            evs = doc["traceEvents"]
    text = json.dumps(doc).encode()
    cut = data.draw(st.sampled_from(["none", "truncate", "corrupt"]))
    if cut == "truncate":
        text = text[: data.draw(st.integers(0, len(text)))]
    elif cut == "corrupt" and text:
        i = data.draw(st.integers(0, len(text) - 1))
        text = text[:i] + bytes([data.draw(st.integers(0, 255))]) + text[i + 1 :]
    return text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), base=st.sampled_from(range(len(BASES))), gz=st.booleans())
def test_mutated_traces_ingest_or_raise_our_error(tmp_path_factory, data, base, gz):
    tmp = tmp_path_factory.mktemp("prop")
    text = _mutate(BASES[base], data)
    path = tmp / ("rank0.json.gz" if gz else "rank0.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    store = Store(tmp / "store")
    before = store_snapshot(store.path)
    try:
        rid = ingest_paths([path], store)
    except TracekitError as exc:
        assert "\n" not in str(exc)
        assert store_snapshot(store.path) == before
        return
    con = analyses.connect(store)
    assert con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [rid]).fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM events WHERE dur_ns < 0 OR ts_ns <= 0").fetchone() == (0,)
    con.execute("SELECT * FROM overlap_by_rank").fetchall()
    con.execute("SELECT * FROM collective_verdicts").fetchall()
