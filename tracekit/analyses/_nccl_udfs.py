"""The NCCL-model reference of collective_verdicts, as DuckDB functions.

Where a verdict's reference is a link preset (collective_reference ref_kind ``preset``: no user
link and no fit of this machine), collective_verdicts compares each instance with what NCCL would
run there: the fastest algorithm × protocol of :func:`tracekit.model.nccl_tuning.nccl_choice` for
its op, size, group size k and node count, on the machine its device implies
(:func:`tracekit.model.machine.machine_for_device`: the device's intra-node link and the typical
NIC of such systems, ``tk_nics_per_node`` NICs per node when set, else the group's own log's
(group_machine.nics_per_node), else one per GPU; G = the
group's ranks per node). Its latency is the verdict's α term, D / algbw its β term, and its
crossover (latency × algbw) the latency/bandwidth boundary — so an 8-byte all-reduce on thousands
of ranks is judged against tree latency, not ring's.

Functions (NULL where the model has no answer: unknown device or op, nodes unknown, k < 2):

    tk_nccl_algo(op, S, k, nodes, device, nics) → VARCHAR   NCCL's pick, e.g. 'tree/LL'
    tk_nccl_latency(op, S, k, nodes, device, nics) → DOUBLE its latency, s
    tk_nccl_beta_term(op, S, k, nodes, device, nics) → DOUBLE S / its algbw, s
    tk_nccl_crossover(op, S, k, nodes, device, nics) → DOUBLE latency × algbw, bytes

``nics`` may be NULL (one NIC per GPU).
"""

from __future__ import annotations

import functools

from tracekit.errors import TracekitError


@functools.lru_cache(maxsize=1 << 14)
def nccl_reference(op, size_bytes, ranks, nodes, device, nics):
    """NCCL's pick (a NcclPrediction) for one instance, or None where the model has no answer."""
    from tracekit.model.machine import machine_for_device
    from tracekit.model.nccl_tuning import nccl_choice

    if None in (op, size_bytes, ranks, nodes, device):
        return None
    try:
        k, n = int(ranks), int(nodes)
        if k < 2 or n < 1 or n > k:
            return None
        m = machine_for_device(device, -(-k // n), None if nics is None else int(nics))
        if m is None:
            return None
        return nccl_choice("send" if op == "recv" else op, float(size_bytes), k, n, m)
    except (TracekitError, ValueError, ZeroDivisionError):
        return None


def register(con) -> None:
    """Register the tk_nccl_* functions (module docstring) on ``con``."""
    args = ["VARCHAR", "BIGINT", "INTEGER", "INTEGER", "VARCHAR", "INTEGER"]

    def reg(name, attr, ret):
        def fn(op, s, k, n, dev, nics):
            p = nccl_reference(op, s, k, n, dev, nics)
            return None if p is None else getattr(p, attr)

        con.create_function(name, fn, args, ret, null_handling="special", side_effects=False)

    reg("tk_nccl_algo", "label", "VARCHAR")
    reg("tk_nccl_latency", "latency_s", "DOUBLE")
    reg("tk_nccl_beta_term", "beta_term_s", "DOUBLE")
    reg("tk_nccl_crossover", "crossover_bytes", "DOUBLE")
