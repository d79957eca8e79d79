"""tracekit.model.ops.canonical_op: one function for user/nccl-tests names and trace names."""

from __future__ import annotations

import pytest

from tracekit.errors import BadInputError
from tracekit.model.ops import canonical_op


@pytest.mark.parametrize("name, op", [
    ("nccl:_all_gather_base", "all_gather"),
    ("allgather_into_tensor_coalesced", "all_gather"),
    ("c10d::alltoall_base_", "all_to_all"),
    ("c10d::_reduce_scatter_base", "reduce_scatter"),
    ("gloo:all_reduce", "all_reduce"),
    ("c10d::recv_any_source_", "recv"),
    ("record_param_comms", None),
    ("SendRecv", None),  # a SendRecv kernel implements other collectives: the launching op decides
    ("p2p", None),
    ("Generic", None),
    ("", None),
    (None, None),
    (["allreduce"], "all_reduce"),  # unhashable: not cached, still read
])
def test_trace_names(name, op):
    assert canonical_op(name, trace=True) == op


def test_user_names_keep_their_contract():
    assert canonical_op("all_reduce_perf") == "all_reduce"
    assert canonical_op("sendrecv") == "send"  # nccl-tests: each rank sends S
    assert canonical_op("AllGather") == "all_gather"
    with pytest.raises(BadInputError, match="unknown collective 'record_param_comms'"):
        canonical_op("record_param_comms")
