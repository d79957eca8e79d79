"""Collective times under the α–β model, per algorithm.

Every algorithm here costs ``T = A·α + B·D/β`` on k ranks that each hold D
bytes (D is the nccl-tests S: the all-reduce buffer, the all-gather output,
the reduce-scatter input). A is the number of sequential steps (messages on
the critical path), and B·D is the number of bytes one rank's link carries on
the critical path, reported as ``bytes_per_rank_sent``. The coefficients come
from one table, :func:`algorithm_coefficients`, which the fitter also uses to
turn a fitted line back into α and β.

Sources: Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 19(1), 2005 (recursive doubling,
Rabenseifner's halving/doubling, binomial trees, scatter + all-gather
broadcast, pairwise exchange); Patarasuk & Yuan, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009 (ring
all-reduce and its lower bound); Patarasuk, Faraj & Yuan, "Pipelined
broadcast on Ethernet switched clusters", IPDPS 2006 (pipelined chain
broadcast); ../shared/reference/alpha-beta.md (the table tracekit implements
exactly; broadcast is not in it and is defined here).

Units: sizes in bytes, times in seconds, β in bytes/s per direction.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from tracekit.errors import BadInputError
from tracekit.model.links import Link, _check_size
from tracekit.model.ops import canonical_op

__all__ = [
    "ALGORITHMS",
    "Coefficients",
    "Prediction",
    "HierarchicalPrediction",
    "algorithm_coefficients",
    "applicable_algorithms",
    "predict_collective",
    "ring_all_reduce_time",
    "ring_reduce_scatter_time",
    "ring_all_gather_time",
    "recursive_doubling_all_reduce_time",
    "rabenseifner_all_reduce_time",
    "tree_all_reduce_time",
    "double_binary_tree_all_reduce_time",
    "crossover_size",
    "fixed_latency",
    "nvls_all_reduce_time",
    "pairwise_all_to_all_time",
    "p2p_time",
    "tree_broadcast_time",
    "ring_broadcast_time",
    "scatter_allgather_broadcast_time",
    "hierarchical_all_reduce",
    "verdict",
]

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "recursive_doubling", "rabenseifner", "tree", "double_binary_tree", "nvls"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("pairwise",),
    "broadcast": ("ring", "tree", "scatter_allgather"),
    "send": ("p2p",),
}
"""The algorithms the model has for each op; the first is the op's default."""

POWER_OF_TWO_ALGORITHMS = frozenset({("all_reduce", "recursive_doubling"), ("all_reduce", "rabenseifner")})

LATENCY_BOUND = "latency-bound"
BANDWIDTH_BOUND = "bandwidth-bound"


def verdict(alpha_term_s: float, beta_term_s: float) -> str:
    """``'latency-bound'`` when the α term >= the β term, else ``'bandwidth-bound'`` (DESIGN.md)."""
    return LATENCY_BOUND if alpha_term_s >= beta_term_s else BANDWIDTH_BOUND


@dataclass(frozen=True)
class Coefficients:
    """T = alpha_coeff·α + beta_coeff·D/β, with ``steps`` sequential messages (= alpha_coeff)."""

    steps: int
    alpha_coeff: float
    beta_coeff: float


@dataclass(frozen=True)
class Prediction:
    """One predicted collective.

    time_s = alpha_term_s + beta_term_s (seconds); steps: sequential messages;
    bytes_per_rank_sent: bytes one rank's link carries on the critical path
    (β term × β); verdict: latency-bound when alpha_term_s >= beta_term_s;
    n_half_bytes: the link's n½ = α·β (a property of the link: one message);
    crossover_bytes: the collective's crossover size D* at which this
    algorithm's α and β terms are equal (below it: latency-bound; the
    latency/bandwidth boundary of this op, algorithm and k), None when the β
    term does not grow with D; fixed_latency_s: the collective's fixed cost,
    its α term at D → 0 (steps × α = alpha_term_s), seconds.
    """

    op: str
    algo: str
    ranks: int
    size_bytes: float
    link: str
    time_s: float
    alpha_term_s: float
    beta_term_s: float
    steps: int
    bytes_per_rank_sent: float
    verdict: str
    n_half_bytes: float
    crossover_bytes: float | None
    fixed_latency_s: float = 0.0

    def to_dict(self) -> dict:
        """Snake-case dict: seconds, bytes, plain numbers and strings (JSON-ready)."""
        return asdict(self)


def _check_ranks(ranks: int, minimum: int = 2) -> int:
    if isinstance(ranks, bool):
        raise BadInputError(f"bad rank count {ranks!r}: expected an integer >= {minimum}")
    try:
        f = float(ranks)
    except (TypeError, ValueError):
        raise BadInputError(f"bad rank count {ranks!r}: expected an integer >= {minimum}") from None
    if not math.isfinite(f) or f != int(f):
        raise BadInputError(f"bad rank count {ranks!r}: expected an integer >= {minimum}")
    k = int(f)
    if k < minimum:
        what = "a collective needs at least 2 ranks" if minimum == 2 else f"expected an integer >= {minimum}"
        raise BadInputError(f"bad rank count {k}: {what}")
    return k


def _is_power_of_two(k: int) -> bool:
    return k >= 1 and k & (k - 1) == 0


def _ceil_log2(k: int) -> int:
    """⌈log₂k⌉ for k >= 1 (exactly log₂k when k is a power of two)."""
    return (k - 1).bit_length()


def _check_algo(op: str, algo: str) -> str:
    a = str(algo).strip().lower().replace("-", "_")
    a = {"rd": "recursive_doubling", "in_switch": "nvls", "dbt": "double_binary_tree", "sharp": "nvls", "point_to_point": "p2p"}.get(a, a)
    if a not in ALGORITHMS[op]:
        raise BadInputError(f"no algorithm {algo!r} for {op}: expected one of {', '.join(ALGORITHMS[op])}")
    return a


def _check_model_op(op: str) -> str:
    canon = canonical_op(op)
    if canon == "recv":
        canon = "send"
    if canon not in ALGORITHMS:
        raise BadInputError(f"the model has no algorithm for {canon}: expected one of {', '.join(ALGORITHMS)}")
    return canon


def algorithm_coefficients(op: str, algo: str, ranks: int) -> Coefficients:
    """The (A, B) of T = A·α + B·D/β for ``algo`` running ``op`` on k = ``ranks`` ranks.

    op / algo                     A (steps)      B           source
    ----------------------------  -------------  ----------  ----------------------------------
    all_reduce ring               2(k−1)         2(k−1)/k    Patarasuk & Yuan 2009
    all_reduce recursive_doubling log₂k          log₂k       Thakur et al. 2005
    all_reduce rabenseifner       2·log₂k        2(k−1)/k    Thakur et al. 2005
    all_reduce tree               2·⌈log₂k⌉      2·⌈log₂k⌉   binomial reduce + broadcast, not
                                                             pipelined (Thakur et al. 2005)
    all_reduce double_binary_tree 2·⌈log₂k⌉      2           NCCL's pipelined double binary tree
                                                             (Sanders, Speck & Träff 2009)
    all_reduce nvls               2              1           in-switch (NVLS / SHARP)
    all_gather ring               k−1            (k−1)/k     Thakur et al. 2005; P&Y 2009
    reduce_scatter ring           k−1            (k−1)/k     Thakur et al. 2005; P&Y 2009
    all_to_all pairwise           k−1            (k−1)/k     pairwise exchange (Thakur 2005)
    broadcast ring                k−1            1           pipelined chain, many-chunk limit
                                                             (NCCL; Patarasuk et al. 2006)
    broadcast tree                ⌈log₂k⌉        ⌈log₂k⌉     binomial tree (Thakur et al. 2005)
    broadcast scatter_allgather   ⌈log₂k⌉ + k−1  2(k−1)/k    binomial scatter + ring all-gather
                                                             (van de Geijn; Thakur et al. 2005)
    send p2p                      1              1           one message

    The tree uses ⌈log₂k⌉ levels, which is the reference's log₂k when k is a
    power of two. ``ranks`` is ignored for send (any k >= 1 is accepted).
    Raises BadInputError for an unknown op/algo, k < 2 (k < 1 for send), or a
    non-power-of-two k for recursive doubling and Rabenseifner.
    """
    canon = _check_model_op(op)
    a = _check_algo(canon, algo)
    if canon == "send":
        _check_ranks(ranks, minimum=1)
        return Coefficients(1, 1.0, 1.0)
    k = _check_ranks(ranks)
    if (canon, a) in POWER_OF_TWO_ALGORITHMS and not _is_power_of_two(k):
        raise BadInputError(
            f"{a} {canon} needs a power-of-two number of ranks, got {k}: use ring, tree or nvls, "
            f"or {1 << (k.bit_length() - 1)} or {1 << k.bit_length()} ranks"
        )
    return _coefficients(canon, a, k)


def _coefficients(op: str, algo: str, k: int) -> Coefficients:
    """The table of :func:`algorithm_coefficients`, unchecked; k = 1 gives a free (zero) collective."""
    lg = _ceil_log2(k)
    if op == "all_reduce":
        if algo == "ring":
            return Coefficients(2 * (k - 1), 2.0 * (k - 1), 2.0 * (k - 1) / k)
        if algo == "recursive_doubling":
            return Coefficients(lg, float(lg), float(lg))
        if algo == "rabenseifner":
            return Coefficients(2 * lg, 2.0 * lg, 2.0 * (k - 1) / k)
        if algo == "tree":
            return Coefficients(2 * lg, 2.0 * lg, 2.0 * lg)
        if algo == "double_binary_tree":
            return Coefficients(2 * lg, 2.0 * lg, 2.0) if k > 1 else Coefficients(0, 0.0, 0.0)
        if algo == "nvls":
            return Coefficients(2, 2.0, 1.0) if k > 1 else Coefficients(0, 0.0, 0.0)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return Coefficients(k - 1, float(k - 1), (k - 1) / k)
    if op == "broadcast":
        if algo == "ring":
            return Coefficients(k - 1, float(k - 1), 1.0 if k > 1 else 0.0)
        if algo == "tree":
            return Coefficients(lg, float(lg), float(lg))
        if algo == "scatter_allgather":
            return Coefficients(lg + k - 1, float(lg + k - 1), 2.0 * (k - 1) / k)
    if op == "send":
        return Coefficients(1, 1.0, 1.0)
    raise AssertionError(f"no coefficients for {op}/{algo}")  # pragma: no cover - guarded by ALGORITHMS


def _build(op: str, algo: str, size_bytes: float, k: int, link: Link, coeffs: Coefficients) -> Prediction:
    d = float(size_bytes)
    alpha_term = coeffs.alpha_coeff * link.alpha_s
    sent = coeffs.beta_coeff * d
    beta_term = sent / link.beta_Bps
    crossover = (
        coeffs.alpha_coeff * link.alpha_s * link.beta_Bps / coeffs.beta_coeff if coeffs.beta_coeff > 0 else None
    )
    return Prediction(
        op=op,
        algo=algo,
        ranks=k,
        size_bytes=d,
        link=link.name,
        time_s=alpha_term + beta_term,
        alpha_term_s=alpha_term,
        beta_term_s=beta_term,
        steps=coeffs.steps,
        bytes_per_rank_sent=sent,
        verdict=verdict(alpha_term, beta_term),
        n_half_bytes=link.n_half_bytes,
        crossover_bytes=crossover,
        fixed_latency_s=alpha_term,
    )


def _predict_one(op: str, algo: str, size_bytes: float, ranks: int, link: Link) -> Prediction:
    d = _check_size(size_bytes)
    coeffs = algorithm_coefficients(op, algo, ranks)
    canon = _check_model_op(op)
    return _build(canon, _check_algo(canon, algo), d, int(ranks), link, coeffs)


def ring_all_reduce_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Ring all-reduce (reduce-scatter ring, then all-gather ring) on k ranks holding D bytes each.

    T = 2(k−1)·α + 2(k−1)/k · D/β, in 2(k−1) steps; each rank sends
    2(k−1)/k·D bytes, the all-reduce lower bound (Patarasuk & Yuan, JPDC 2009).
    Latency-bound exactly when D/k < n½.
    Returns a Prediction (seconds, bytes). Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("all_reduce", "ring", size_bytes, ranks, link)


def ring_reduce_scatter_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Ring reduce-scatter, D = each rank's input: T = (k−1)·α + (k−1)/k · D/β in k−1 steps.

    Each rank sends (k−1)/k·D bytes, the lower bound (Patarasuk & Yuan, JPDC
    2009; Thakur et al., IJHPCA 2005). Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("reduce_scatter", "ring", size_bytes, ranks, link)


def ring_all_gather_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Ring all-gather, D = each rank's output: T = (k−1)·α + (k−1)/k · D/β in k−1 steps.

    Each rank sends (k−1)/k·D bytes (Thakur et al., IJHPCA 2005).
    Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("all_gather", "ring", size_bytes, ranks, link)


def recursive_doubling_all_reduce_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Recursive-doubling all-reduce: T = log₂k · (α + D/β) in log₂k steps.

    Every step exchanges the whole buffer with a partner at distance 2^i, so
    each rank sends log₂k·D bytes (Thakur, Rabenseifner & Gropp, IJHPCA 2005).
    Raises BadInputError if k is not a power of two, k < 2 or D < 0.
    """
    return _predict_one("all_reduce", "recursive_doubling", size_bytes, ranks, link)


def rabenseifner_all_reduce_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Rabenseifner all-reduce (recursive-halving reduce-scatter + recursive-doubling all-gather).

    T = 2·log₂k·α + 2(k−1)/k · D/β in 2·log₂k steps; each rank sends
    2(k−1)/k·D bytes (Thakur, Rabenseifner & Gropp, IJHPCA 2005).
    Raises BadInputError if k is not a power of two, k < 2 or D < 0.
    """
    return _predict_one("all_reduce", "rabenseifner", size_bytes, ranks, link)


def tree_all_reduce_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Binary-tree all-reduce, a reduce to the root then a broadcast, not pipelined.

    T = 2·⌈log₂k⌉ · (α + D/β): the whole buffer crosses every level of the
    tree twice (Thakur et al., IJHPCA 2005, binomial trees; ⌈log₂k⌉ = log₂k
    for powers of two, as in the reference). bytes_per_rank_sent is the
    critical path's 2·⌈log₂k⌉·D. Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("all_reduce", "tree", size_bytes, ranks, link)


def double_binary_tree_all_reduce_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """NCCL's pipelined double binary tree all-reduce ("TREE" in NCCL's kernel names).

    T = 2·⌈log₂k⌉·α + 2·D/β, in 2·⌈log₂k⌉ steps: two binary trees each carry
    half of the buffer (D/2), every rank is an inner node of at most one of
    them, and the reduce-then-broadcast is pipelined in chunks, so the tree's
    depth costs α per level but not D/β per level (Sanders, Speck & Träff,
    "Two-tree algorithms for full bandwidth broadcast, reduction and scan",
    Parallel Computing 35(12), 2009; ../shared/reference/alpha-beta.md). An
    inner node receives D/2 from each of two children and sends D/2 up, then
    the same down, in each tree it is inner in: 2·D bytes on the critical path
    (bytes_per_rank_sent). Like the other formulas it is the many-chunk limit
    (the α of each further pipeline chunk is left out).
    k = 8, D = 1 GB on nvlink4: 2·3·2 µs + 2·1e9/3.6e11 s = 12 µs + 5.5556 ms.
    Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("all_reduce", "double_binary_tree", size_bytes, ranks, link)


def crossover_size(op: str, ranks: int, link: Link, algo: str | None = None) -> float | None:
    """The collective's crossover size D*, bytes: where its α term equals its β term.

    With T = A·α + B·D/β (:func:`algorithm_coefficients`), A·α = B·D*/β gives
    D* = A·α·β / B (../shared/reference/alpha-beta.md, "The boundary is the
    collective's, not the link's"). Below D* the collective is latency-bound,
    above it bandwidth-bound. Ring all-reduce: A = 2(k−1), B = 2(k−1)/k, so
    D* = k·α·β (its busbw reaches β/2 there); ring all-gather / reduce-scatter
    and pairwise all-to-all: (k−1)/((k−1)/k) = k, D* = k·α·β too; recursive
    doubling D* = α·β; in-switch (nvls) D* = 2·α·β; binary tree D* = α·β;
    double binary tree D* = ⌈log₂k⌉·α·β; send D* = α·β = n½.
    n½ = α·β stays the link's (one message): D* = n½ · A/B.
    ``algo`` None: the op's default algorithm. Returns None when B = 0 (a
    free 1-rank collective). Raises BadInputError as algorithm_coefficients does.
    """
    canon = _check_model_op(op)
    co = algorithm_coefficients(canon, ALGORITHMS[canon][0] if algo is None else algo, ranks)
    if co.beta_coeff <= 0:
        return None
    return co.alpha_coeff * link.alpha_s * link.beta_Bps / co.beta_coeff


def fixed_latency(op: str, ranks: int, link: Link, algo: str | None = None) -> float:
    """The collective's fixed latency, seconds: its α term at D → 0, A·α = steps × per-step α.

    Ring all-reduce on k ranks: 2(k−1)·α (2,048 ranks at α = 0.04 µs: 163.8 µs),
    ring all-gather / reduce-scatter / pairwise all-to-all (k−1)·α, double
    binary tree 2·⌈log₂k⌉·α (reference, "Fixed latency"). ``algo`` None: the
    op's default. Raises BadInputError as algorithm_coefficients does.
    """
    canon = _check_model_op(op)
    co = algorithm_coefficients(canon, ALGORITHMS[canon][0] if algo is None else algo, ranks)
    return co.alpha_coeff * link.alpha_s


def nvls_all_reduce_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """In-switch all-reduce (NVLink SHARP / NVLS, InfiniBand SHARP): T = 2α + D/β.

    Each rank sends its D bytes to the switch, which reduces them and
    multicasts the result back: two steps, D bytes per rank, independent of k
    (reference table). busbw can exceed β here. Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("all_reduce", "nvls", size_bytes, ranks, link)


def pairwise_all_to_all_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Pairwise-exchange all-to-all, D = each rank's send buffer: T = (k−1)·α + (k−1)/k · D/β.

    In step i rank r exchanges its D/k block with rank r xor i (or r ± i):
    k−1 steps, (k−1)/k·D bytes sent (Thakur et al., IJHPCA 2005).
    Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("all_to_all", "pairwise", size_bytes, ranks, link)


def p2p_time(size_bytes: float, link: Link, ranks: int = 2) -> Prediction:
    """Point-to-point send of D bytes: T = α + D/β (one message).

    ``ranks`` is informational. Raises BadInputError if D < 0.
    """
    return _predict_one("send", "p2p", size_bytes, ranks, link)


def tree_broadcast_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Binomial-tree broadcast of D bytes: T = ⌈log₂k⌉ · (α + D/β).

    The root's buffer doubles its holders each step (Thakur et al., IJHPCA
    2005, short-message broadcast). Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("broadcast", "tree", size_bytes, ranks, link)


def ring_broadcast_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Pipelined ring (chain) broadcast of D bytes, as NCCL runs it: T = (k−1)·α + D/β.

    The root cuts the buffer into many chunks and each rank forwards every
    chunk to the next: the first chunk needs k−1 hops, after which the whole
    buffer streams through every link once (Patarasuk, Faraj & Yuan, IPDPS
    2006, pipelined broadcast). This is the many-chunk limit: it leaves out
    the α each further chunk costs, so it is a lower bound at mid sizes. Each
    rank sends D bytes, which is why nccl-tests' broadcast busbw factor is 1.
    Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("broadcast", "ring", size_bytes, ranks, link)


def scatter_allgather_broadcast_time(size_bytes: float, ranks: int, link: Link) -> Prediction:
    """Broadcast as a binomial scatter then a ring all-gather (van de Geijn), D bytes.

    T = (⌈log₂k⌉ + k − 1)·α + 2(k−1)/k · D/β: the scatter sends (k−1)/k·D
    from the root in ⌈log₂k⌉ steps, the ring all-gather another (k−1)/k·D in
    k−1 steps (Thakur, Rabenseifner & Gropp, IJHPCA 2005, long-message
    broadcast in MPICH). Raises BadInputError if k < 2 or D < 0.
    """
    return _predict_one("broadcast", "scatter_allgather", size_bytes, ranks, link)


def applicable_algorithms(op: str, ranks: int) -> list[str]:
    """The algorithms of ``op`` that can run on k ranks (power-of-two ones dropped otherwise).

    Raises BadInputError for an unknown op or a bad k.
    """
    canon = _check_model_op(op)
    k = _check_ranks(ranks, minimum=1 if canon == "send" else 2)
    return [a for a in ALGORITHMS[canon] if (canon, a) not in POWER_OF_TWO_ALGORITHMS or _is_power_of_two(k)]


def predict_collective(
    op: str, size_bytes: float, ranks: int, link: Link, algo: str | None = None
) -> Prediction | list[Prediction]:
    """Predict ``op`` on k = ``ranks`` ranks holding D = ``size_bytes`` each, over ``link``.

    ``algo``: one of ``ALGORITHMS[op]`` (all_reduce: ring, recursive_doubling,
    rabenseifner, tree, double_binary_tree, nvls; all_gather / reduce_scatter: ring; all_to_all:
    pairwise; broadcast: ring, tree, scatter_allgather; send: p2p), None for the op's default
    (the first), or ``'all'`` for a list over every algorithm that can run on
    k ranks (power-of-two-only algorithms are left out for other k).
    Returns one Prediction, or a list for ``'all'``.
    Raises BadInputError for an unknown op or algo, k < 2 (except send),
    D < 0, or a power-of-two algorithm asked for on another k.
    """
    canon = _check_model_op(op)
    _check_size(size_bytes)
    if algo is not None and str(algo).strip().lower() == "all":
        return [_predict_one(canon, a, size_bytes, ranks, link) for a in applicable_algorithms(canon, ranks)]
    return _predict_one(canon, ALGORITHMS[canon][0] if algo is None else algo, size_bytes, ranks, link)


@dataclass(frozen=True)
class HierarchicalPrediction:
    """Hierarchical all-reduce on N nodes × G GPUs, beside the flat ring it replaces.

    phases: (intra-node reduce-scatter of D over G ranks on link_in,
    inter-node ring all-reduce of D/G over N ranks on link_out,
    intra-node all-gather of D over G ranks on link_in);
    time_s / alpha_term_s / beta_term_s: their sums (seconds);
    flat_ring: ring all-reduce of D over N·G ranks on link_out;
    speedup_vs_flat: flat_ring.time_s / time_s;
    flat_assumption: what the flat comparator assumes, in words.
    """

    size_bytes: float
    nodes: int
    gpus_per_node: int
    link_in: str
    link_out: str
    phases: tuple[Prediction, Prediction, Prediction]
    time_s: float
    alpha_term_s: float
    beta_term_s: float
    verdict: str
    flat_ring: Prediction
    speedup_vs_flat: float | None
    flat_assumption: str = ""

    PHASE_NAMES = ("intra_node_reduce_scatter", "inter_node_all_reduce", "intra_node_all_gather")

    def to_dict(self) -> dict:
        """Snake-case dict; each phase carries a ``phase`` name."""
        return {
            "op": "all_reduce",
            "algo": "hierarchical",
            "size_bytes": self.size_bytes,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "link_in": self.link_in,
            "link_out": self.link_out,
            "time_s": self.time_s,
            "alpha_term_s": self.alpha_term_s,
            "beta_term_s": self.beta_term_s,
            "verdict": self.verdict,
            "phases": [{"phase": name, **p.to_dict()} for name, p in zip(self.PHASE_NAMES, self.phases)],
            "flat_ring": self.flat_ring.to_dict(),
            "speedup_vs_flat": self.speedup_vs_flat,
            "flat_assumption": self.flat_assumption,
        }


def hierarchical_all_reduce(
    size_bytes: float, nodes: int, gpus_per_node: int, link_in: Link, link_out: Link
) -> HierarchicalPrediction:
    """Hierarchical all-reduce of D bytes on N nodes × G GPUs (reference, "Hierarchical all-reduce").

    1. reduce-scatter inside each node: (G−1)·α_in + (G−1)/G · D/β_in
    2. ring all-reduce of the remaining D/G bytes across the N nodes, all G
       NICs busy at once: 2(N−1)·α_out + 2(N−1)/N · (D/G)/β_out
    3. all-gather inside each node: same as 1.

    Compared with the flat ring over N·G ranks, every step at the slow link:
    2(NG−1)·α_out + 2(NG−1)/(NG) · D/β_out.
    β_out is per GPU: with fewer NICs than GPUs per node pass
    ``links.network_link(preset, nics_per_node, G)`` (β_NIC × nics/G).
    N = 1 or G = 1 is allowed (the matching phases cost 0); N·G must be >= 2.
    Returns seconds. Raises BadInputError for N < 1, G < 1, N·G < 2 or D < 0.
    """
    d = _check_size(size_bytes)
    n = _check_ranks(nodes, minimum=1)
    g = _check_ranks(gpus_per_node, minimum=1)
    if n * g < 2:
        raise BadInputError("bad layout 1 node × 1 GPU: a collective needs at least 2 ranks")
    p1 = _build("reduce_scatter", "ring", d, g, link_in, _coefficients("reduce_scatter", "ring", g))
    p2 = _build("all_reduce", "ring", d / g, n, link_out, _coefficients("all_reduce", "ring", n))
    p3 = _build("all_gather", "ring", d, g, link_in, _coefficients("all_gather", "ring", g))
    alpha = p1.alpha_term_s + p2.alpha_term_s + p3.alpha_term_s
    beta = p1.beta_term_s + p2.beta_term_s + p3.beta_term_s
    total = alpha + beta
    flat = _build("all_reduce", "ring", d, n * g, link_out, _coefficients("all_reduce", "ring", n * g))
    return HierarchicalPrediction(
        size_bytes=d,
        nodes=n,
        gpus_per_node=g,
        link_in=link_in.name,
        link_out=link_out.name,
        phases=(p1, p2, p3),
        time_s=total,
        alpha_term_s=alpha,
        beta_term_s=beta,
        verdict=verdict(alpha, beta),
        flat_ring=flat,
        speedup_vs_flat=flat.time_s / total if total > 0 else None,
        flat_assumption=(
            f"flat ring over {n * g} ranks: all {2 * (n * g - 1)} steps at the inter-node link "
            f"(α {link_out.alpha_s * 1e6:.3g} µs, β {link_out.beta_Bps / 1e9:.4g} GB/s per GPU), "
            "none at the faster intra-node link (the reference's comparator: a ring is as slow as its "
            "slowest hop)"
        ),
    )
