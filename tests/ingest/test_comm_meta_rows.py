"""The comm-metadata rows of the Kineto reader, built column-wise (kineto._meta_rest,
staging.rest_column / columns_meta_batch / RankFile.add_meta): their values by hand, on both
decoders, with quarantined events, the older ``Input dims`` spelling and the readers' dict rows."""

from __future__ import annotations

import json

import pytest

from tracekit.ingest import kineto, staging
from tracekit.ingest.comm_families import BUILTIN_COMM_PATTERNS, compile_comm_patterns
from tracekit.ingest.kineto import read_rank_file


def _rest(raws: list[bytes], category: list, correlation: list) -> list[bytes]:
    decoded = kineto._decode_many(raws, kineto._KARGS_LIST, kineto._KARGS, kineto._EMPTY_ARGS)
    return kineto._meta_rest(decoded, category, correlation)


def test_rest_json_keeps_present_fields_in_order_then_category_and_correlation():
    raws = [
        b'{"Collective name": "allgather", "In msg nelems": 0, "Seq": false, "dtype": "", '
        b'"Process Group Name": null, "Out msg nelems": 12345678901234567890123, "External id": 4}',
        b"null",
        b'{"Input dims": [[9]], "Input Dims": [[1, 2]], "Global rank stride": 1}',
        # only the older spelling: read from it, written in the field's own place
        b'{"Input dims": [[9]], "Global rank stride": 1, "Collective name": "broadcast"}',
    ]
    got = _rest(raws, ["kernel", "cpu_op", "x", "x"], [5, None, None, 3])
    assert got == [
        b'{"collective":"allgather","in_nelems":0,"out_nelems":12345678901234567890123,"dtype":"","seq":false,'
        b'"category":"kernel","correlation":5}',
        b'{"category":"cpu_op","correlation":null}',
        b'{"input_dims":[[1,2]],"gstride":1,"category":"x","correlation":null}',
        b'{"collective":"broadcast","input_dims":[[9]],"gstride":1,"category":"x","correlation":3}',
    ]


def test_rest_json_of_an_args_list_with_an_odd_item():
    # one item that is not an object: the batch decode fails, each item is decoded alone, and
    # the odd one gives no fields
    got = _rest([b'{"Seq": 7}', b"[1, 2]", b'{"dtype": "Half"}'], ["c", "c", "c"], [1, 2, 3])
    assert got == [b'{"seq":7,"category":"c","correlation":1}', b'{"category":"c","correlation":2}',
                   b'{"dtype":"Half","category":"c","correlation":3}']


_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
_KARGS = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 2,
          "dtype": "Float", "device": 0, "stream": 7}
_TRACE = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 2, "ts": 9, "dur": 2,
     "args": {"Input dims": [[1024]], "Collective name": "allreduce", "Seq": 3, "External id": 4}},
    {"ph": "X", "cat": "kernel", "name": _NCCL, "pid": 0, "tid": 7, "ts": 10, "dur": 5,
     "args": dict(_KARGS, correlation=7)},
    {"ph": "X", "cat": "kernel", "name": _NCCL, "pid": 0, "tid": 7, "ts": 16, "dur": -1,  # quarantined
     "args": dict(_KARGS, correlation=8)},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 20, "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 2, "dur": 1},  # no ts
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 2, "ts": 30, "dur": -2},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 2, "ts": 40, "dur": 10},
]}


@pytest.mark.parametrize("no_scanner", ["0", "1"])
def test_metadata_rows_of_a_file_by_value(tmp_path, monkeypatch, no_scanner):
    monkeypatch.setenv("TRACEKIT_NO_KSCAN", no_scanner)
    src = tmp_path / "rank0.json"
    src.write_text(json.dumps(_TRACE))
    rf = read_rank_file(src, tmp_path / "r0.stage", compile_comm_patterns(list(BUILTIN_COMM_PATTERNS)), sha256="x")
    assert (rf.events, rf.quarantined) == (4, 3)
    assert rf.steps == [(2, 6, 40_000, 50_000)]  # event ids in file order; step 1 was quarantined
    t = rf.meta_table()
    assert t.schema == staging.META_SCHEMA
    assert t.drop_columns(["rest"]).to_pylist() == [
        dict(event_id=0, name="record_param_comms", gpu=False, device=1, track=2, ts_ns=9_000, dur_ns=2_000),
        dict(event_id=1, name=_NCCL, gpu=True, device=0, track=7, ts_ns=10_000, dur_ns=5_000),
    ]
    assert t.column("rest").to_pylist() == [
        b'{"collective":"allreduce","seq":3,"input_dims":[[1024]],"category":"cpu_op","correlation":null}',
        b'{"collective":"allreduce","in_nelems":1024,"out_nelems":1024,"group_size":2,"dtype":"Float",'
        b'"category":"kernel","correlation":7}',
    ]
    assert rf.meta_rows().row(0) == dict(collective="allreduce", seq=3, input_dims=[[1024]], category="cpu_op",
                                         correlation=None, event_id=0, name="record_param_comms", gpu=False,
                                         device=1, track=2, ts_ns=9_000, dur_ns=2_000)


def test_dict_rows_and_batches_are_kept_in_the_order_they_came(tmp_path):
    rf = staging.RankFile(path=tmp_path / "x", sha256="", meta={})

    def row(eid):
        return dict(event_id=eid, name=f"op{eid}", gpu=False, device=1, track=eid, ts_ns=10 * eid, dur_ns=1,
                    seq=eid, category="cpu_op", correlation=None)

    def batch(eids):
        k = staging.META_FIELDS.index("seq")
        fields = [(None,) * k + (e,) + (None,) * (len(staging.META_FIELDS) - k - 1) for e in eids]
        rest = staging.rest_column(fields, ["cpu_op"] * len(eids), [None] * len(eids))
        return staging.columns_meta_batch(eids, [f"op{e}" for e in eids], [False] * len(eids), [1] * len(eids),
                                          eids, [10 * e for e in eids], [1] * len(eids), rest)

    rf.comm_meta.append(row(0))
    rf.add_meta(batch([1, 2]))
    rf.comm_meta.append(row(3))
    assert rf.meta_pending == 4
    assert rf.meta_table().column("event_id").to_pylist() == [0, 1, 2, 3]
    rf.flush_meta(tmp_path / "x.meta")
    assert rf.meta_pending == 0
    rf.add_meta(batch([4]))
    rf.add_meta(batch([]))
    rf.comm_meta.append(row(5))
    m = rf.meta_rows()
    assert [m.row(i) for i in range(len(m))] == [row(e) for e in range(6)]
    rf.close_meta()
    assert rf.meta_pending == 0 and rf.meta_table().column("event_id").to_pylist() == list(range(6))
    rf.remove_meta()
