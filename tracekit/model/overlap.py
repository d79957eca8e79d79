"""What hiding communication behind compute can buy: the reference's overlap models.

All times are seconds; c = compute time and a = communication time of the
same piece of work (../shared/reference/alpha-beta.md, "Overlap models").
Every function is pure and raises BadInputError for negative, non-finite or
otherwise impossible inputs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tracekit.errors import BadInputError
from tracekit.model.links import Link, _check_size

__all__ = [
    "no_overlap_time",
    "ChunkedOverlap",
    "chunked_overlap",
    "best_chunks",
    "TwoBatchOverlap",
    "two_batch_overlap",
    "LayerTransfer",
    "layer_transfer",
    "PipelineDecode",
    "pp_decode",
]


def _seconds(value: float, what: str) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise BadInputError(f"bad {what} {value!r}: expected a number of seconds") from None
    if not math.isfinite(t) or t < 0:
        raise BadInputError(f"bad {what} {value!r}: expected a finite number of seconds >= 0")
    return t


def _count(value: int, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool):
        raise BadInputError(f"bad {what} {value!r}: expected an integer >= {minimum}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise BadInputError(f"bad {what} {value!r}: expected an integer >= {minimum}") from None
    if not math.isfinite(f) or f != int(f) or f < minimum:
        raise BadInputError(f"bad {what} {value!r}: expected an integer >= {minimum}")
    return int(f)


def no_overlap_time(compute_s: float, comm_s: float) -> float:
    """No overlap: T = c + a (seconds). Raises BadInputError for negative times."""
    return _seconds(compute_s, "compute time") + _seconds(comm_s, "communication time")


@dataclass(frozen=True)
class ChunkedOverlap:
    """Chunked pipelining of c and a into ``chunks`` pieces.

    time_s: T(n); serial_time_s: c + a; hidden_comm_s: serial − T (negative
    when per-chunk α costs more than overlap saves); exposed_comm_s: T − c,
    the time the work takes beyond its compute; speedup: serial / T.
    """

    compute_s: float
    comm_s: float
    chunks: int
    alpha_chunk_s: float
    time_s: float
    serial_time_s: float
    hidden_comm_s: float
    exposed_comm_s: float
    speedup: float | None

    def to_dict(self) -> dict:
        """Snake-case dict, seconds."""
        return {"model": "chunked", **asdict(self)}


def _chunked_time(c: float, a: float, n: int, alpha_c: float) -> float:
    comm_chunk = a / n + alpha_c
    return c / n + comm_chunk + (n - 1) * max(c / n, comm_chunk)


def chunked_overlap(compute_s: float, comm_s: float, chunks: int, alpha_chunk_s: float) -> ChunkedOverlap:
    """Split compute c and its communication a into n chunks, each chunk's send after its compute.

    T(n) = c/n + (a/n + α_c) + (n−1) · max(c/n, a/n + α_c)

    The first chunk's compute, then the last chunk's communication, with n−1
    stages of the slower of the two in between; every chunk's message pays
    α_c (one more message). T(1) = c + a + α_c. If a > c no chunking hides
    more than c. (Reference, "Chunked pipelining"; the classic two-stage
    pipeline bound.) Returns seconds.
    Raises BadInputError for n < 1 or negative times.
    """
    c = _seconds(compute_s, "compute time")
    a = _seconds(comm_s, "communication time")
    ac = _seconds(alpha_chunk_s, "per-chunk α")
    n = _count(chunks, "chunk count")
    t = _chunked_time(c, a, n, ac)
    serial = c + a
    return ChunkedOverlap(
        compute_s=c,
        comm_s=a,
        chunks=n,
        alpha_chunk_s=ac,
        time_s=t,
        serial_time_s=serial,
        hidden_comm_s=serial - t,
        exposed_comm_s=t - c,
        speedup=serial / t if t > 0 else None,
    )


MAX_CHUNK_SEARCH = 1_000_000
"""best_chunks searches 1..max_chunks exhaustively; beyond this it refuses (BadInputError)."""


def best_chunks(compute_s: float, comm_s: float, alpha_chunk_s: float, max_chunks: int = 4096) -> ChunkedOverlap:
    """The chunk count n in 1..max_chunks that minimises T(n) of :func:`chunked_overlap`.

    Exhaustive search (ties go to the smaller n). For c = a = 1 ms and
    α_c = 10 µs: T(n) = c/n + a + n·α_c, least at n = √(c/α_c) = 10,
    T = 1.2 ms. Returns the ChunkedOverlap at the optimum.
    Raises BadInputError for max_chunks < 1 or negative times.
    """
    c = _seconds(compute_s, "compute time")
    a = _seconds(comm_s, "communication time")
    ac = _seconds(alpha_chunk_s, "per-chunk α")
    top = _count(max_chunks, "max chunk count")
    if top > MAX_CHUNK_SEARCH:
        raise BadInputError(f"max chunk count {top:,} is too large: at most {MAX_CHUNK_SEARCH:,} are searched")
    best_n, best_t = 1, _chunked_time(c, a, 1, ac)
    for n in range(2, top + 1):
        t = _chunked_time(c, a, n, ac)
        if t < best_t:
            best_n, best_t = n, t
    return chunked_overlap(c, a, best_n, ac)


def layered_exposed_time(transfer_per_layer_s: float, compute_per_layer_s: float, layers: int) -> float:
    """Exposed transfer time when each of L layers ships its t_l while the next layer computes s_l.

    exposed = t_l + (L−1)·max(0, t_l − s_l): only the last layer's transfer when compute is the
    longer (reference, "Layer-by-layer transfer"), else the transfers queue up behind each other.
    Seconds in, seconds out. Raises BadInputError for negative times or L < 1.
    """
    t = _seconds(transfer_per_layer_s, "per-layer transfer time")
    c = _seconds(compute_per_layer_s, "per-layer compute time")
    n = _count(layers, "layer count")
    return t + (n - 1) * max(0.0, t - c)


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction of a GPipe/1F1B pipeline step: (p−1)/(m+p−1) for p stages and m micro-batches.

    Each stage is busy m of the m + p − 1 slots of a step (fill and drain take p − 1;
    Huang et al., GPipe, NeurIPS 2019). Raises BadInputError for p < 1 or m < 1.
    """
    p = _count(stages, "stage count")
    m = _count(microbatches, "micro-batch count")
    return (p - 1) / (m + p - 1)


@dataclass(frozen=True)
class TwoBatchOverlap:
    """Two-batch overlap: time_s = max(a, c) + min(a, c)/2 versus serial_time_s = a + c."""

    compute_s: float
    comm_s: float
    time_s: float
    serial_time_s: float
    hidden_comm_s: float
    speedup: float | None

    def to_dict(self) -> dict:
        """Snake-case dict, seconds."""
        return {"model": "two_batch", **asdict(self)}


def two_batch_overlap(compute_s: float, comm_s: float) -> TwoBatchOverlap:
    """Split a batch in two halves so one half's communication runs during the other's compute.

    T = max(a, c) + min(a, c)/2, versus a + c serial (reference, "Two-batch
    overlap"): the longer of
    the two runs back to back over both halves, and half of the shorter one
    (the first half's, or the last's) cannot be hidden. Returns seconds.
    Raises BadInputError for negative times.
    """
    c = _seconds(compute_s, "compute time")
    a = _seconds(comm_s, "communication time")
    t = max(a, c) + min(a, c) / 2
    serial = a + c
    return TwoBatchOverlap(
        compute_s=c,
        comm_s=a,
        time_s=t,
        serial_time_s=serial,
        hidden_comm_s=serial - t,
        speedup=serial / t if t > 0 else None,
    )


@dataclass(frozen=True)
class LayerTransfer:
    """Shipping ``size_bytes`` in one bulk message vs one message per layer.

    bulk_s = α + bytes/(nics·β); layered_exposed_s: exposed time of the
    layer-by-layer transfer (see :func:`layer_transfer`); per_layer_bytes,
    per_layer_transfer_s = α + (bytes/L)/(nics·β); saved_s = bulk − layered.
    """

    size_bytes: float
    link: str
    nics: int
    layers: int
    effective_Bps: float
    bulk_s: float
    per_layer_bytes: float
    per_layer_transfer_s: float
    layered_exposed_s: float
    layer_compute_s: float | None
    saved_s: float

    def to_dict(self) -> dict:
        """Snake-case dict: seconds, bytes, bytes/s."""
        return asdict(self)


def layer_transfer(
    size_bytes: float, link: Link, layers: int = 1, nics: int = 1, layer_compute_s: float | None = None
) -> LayerTransfer:
    """Bulk vs layer-by-layer transfer of ``size_bytes`` (e.g. prefill KV to a decode node).

    ``nics`` parallel NICs multiply β (α is paid once, they send at once):
    β' = nics·β.

    bulk (after all compute): exposed = α + bytes/β'.
    layer by layer, L layers, each shipped while the next computes: when
    each layer's compute is at least its transfer, only the last layer's
    transfer is exposed, exposed = α + (bytes/L)/β' (reference, "Layer-by-layer
    transfer"). That is what is returned when ``layer_compute_s`` (s, the
    compute of one layer) is not given. When it is given and a layer's
    transfer t_l exceeds it, the transfers queue behind each other and
    exposed = t_l + (L−1)·(t_l − s_l) (the transfer stream ends at
    s_l + L·t_l, the compute at L·s_l); with t_l <= s_l this is t_l again.
    Returns seconds. Raises BadInputError for bytes < 0, L < 1, nics < 1 or a
    negative compute time.
    """
    d = _check_size(size_bytes)
    n_layers = _count(layers, "layer count")
    n_nics = _count(nics, "NIC count")
    beta = link.beta_Bps * n_nics
    bulk = link.alpha_s + d / beta
    per_layer = d / n_layers
    t_l = link.alpha_s + per_layer / beta
    s_l = None if layer_compute_s is None else _seconds(layer_compute_s, "per-layer compute time")
    exposed = t_l if s_l is None else layered_exposed_time(t_l, s_l, n_layers)
    return LayerTransfer(
        size_bytes=d,
        link=link.name,
        nics=n_nics,
        layers=n_layers,
        effective_Bps=beta,
        bulk_s=bulk,
        per_layer_bytes=per_layer,
        per_layer_transfer_s=t_l,
        layered_exposed_s=exposed,
        layer_compute_s=s_l,
        saved_s=bulk - exposed,
    )


@dataclass(frozen=True)
class PipelineDecode:
    """Pipeline-parallel decode: p stages of s seconds, x seconds between stages, m micro-batches, T tokens.

    token_latency_s: R = p·s + (p−1)·x, the least time between two tokens of
    one sequence; round_s: P = max(m·s, R), the steady-state time between
    tokens; total_s: (T−1)·P + (m−1)·s + R, until every micro-batch has its
    T-th token; mean_time_per_token_s: total_s / T (includes the pipeline
    fill); tokens_per_s: m·T / total_s (one token per micro-batch per round);
    utilisation: m·T·s / total_s, the busy fraction of each stage;
    steady_utilisation: m·s / P; microbatches_to_fill: ⌈R/s⌉, the least m
    with m·s >= R (p when x = 0).
    """

    stages: int
    microbatches: int
    stage_time_s: float
    transfer_s: float
    tokens: int
    token_latency_s: float
    round_s: float
    total_s: float
    mean_time_per_token_s: float
    tokens_per_s: float | None
    utilisation: float | None
    steady_utilisation: float | None
    microbatches_to_fill: int | None

    def to_dict(self) -> dict:
        """Snake-case dict, seconds."""
        return asdict(self)


def pp_decode(stages: int, microbatches: int, stage_time_s: float, transfer_s: float, tokens: int) -> PipelineDecode:
    """Decode T tokens for m micro-batches on a p-stage pipeline (stage time s, transfer x).

    Model (reference, "Pipeline-parallel decode"): each stage works on one
    micro-batch at a time, round-robin; a micro-batch's next token can enter
    stage 1 only after its previous token has left stage p (decode is
    autoregressive); sending a token id back from the last stage to the first
    is free (a few bytes).

    - One token of one micro-batch takes R = p·s + (p−1)·x end to end, so the
      interval between two tokens of a sequence is at least R, however many
      micro-batches there are.
    - Stage 1 takes m·s to see every micro-batch once, so a round (every
      micro-batch one token further) takes P = max(m·s, R). Micro-batch j
      (0-based) starts its first token at j·s and the pattern then repeats
      every P, so its t-th token (0-based) is done at t·P + j·s + R, exactly
      (no stage is ever asked for two things at once).
    - total = (T−1)·P + (m−1)·s + R; mean time per token = total / T
      (including the fill, i.e. the first round's wait); utilisation =
      m·T·s / total (each stage does m·T units of s seconds' work);
      m >= ⌈R/s⌉ micro-batches keep every stage busy in steady state (p of
      them when x = 0, as the reference says).

    Worked example: p = 8, m = 8, s = 1 ms, x = 0.1 ms, T = 100: R = 8.7 ms,
    P = max(8, 8.7) = 8.7 ms, total = 99·8.7 + 7·1 + 8.7 = 877.0 ms, mean
    8.770 ms/token, utilisation 800/877 = 0.912.
    Returns seconds. Raises BadInputError for p, m, T < 1 or negative times.
    """
    p = _count(stages, "stage count")
    m = _count(microbatches, "micro-batch count")
    s = _seconds(stage_time_s, "stage time")
    x = _seconds(transfer_s, "inter-stage transfer time")
    t = _count(tokens, "token count")
    r = p * s + (p - 1) * x
    period = max(m * s, r)
    total = (t - 1) * period + (m - 1) * s + r
    return PipelineDecode(
        stages=p,
        microbatches=m,
        stage_time_s=s,
        transfer_s=x,
        tokens=t,
        token_latency_s=r,
        round_s=period,
        total_s=total,
        mean_time_per_token_s=total / t,
        tokens_per_s=m * t / total if total > 0 else None,
        utilisation=m * t * s / total if total > 0 else None,
        steady_utilisation=m * s / period if period > 0 else None,
        microbatches_to_fill=math.ceil(r / s - 1e-12) if s > 0 else None,
    )
