"""The α–β model: the single implementation of every predicted number in tracekit.

Pure Python (numpy only for the fit), no I/O. Implements
../shared/reference/alpha-beta.md exactly:

- :mod:`~tracekit.model.units`: parse/format bytes (decimal KB/MB/GB, binary
  KiB/MiB/GiB), per-direction bandwidths (bits → bytes, ``bidirectional``
  halved) and times;
- :mod:`~tracekit.model.links`: :class:`Link`, ``LINK_PRESETS``, T(n) = α + n/β,
  n½ = α·β, achieved fraction n/(n + α·β);
- :mod:`~tracekit.model.collectives`: per-algorithm collective times
  (:class:`Prediction`), :func:`predict_collective`, hierarchical all-reduce;
- :mod:`~tracekit.model.bandwidth`: nccl-tests algbw / busbw and the bus factor
  (plain scalar functions, usable as DuckDB UDFs);
- :mod:`~tracekit.model.overlap`: no overlap, chunked pipelining, layer-by-layer
  transfer, two-batch overlap, pipeline-parallel decode;
- :mod:`~tracekit.model.fit`: α and β fitted from measurements (relative-error
  weighted, robust);
- :mod:`~tracekit.model.machine`: :class:`Machine` (nodes, GPUs, links, NICs), named presets and
  the TOML machine file;
- :mod:`~tracekit.model.nccl_tuning`: NCCL's own cost model (its tuning table, NCCL 2.20.3) per
  algorithm × protocol, and the pair NCCL would pick;
- :mod:`~tracekit.model.multinode`: flat rings across nodes using every NIC of the node.

Units everywhere: bytes, seconds, bytes/second per direction. Bad values
raise :class:`tracekit.errors.BadInputError`.
"""

from tracekit.model.bandwidth import SIZE_BUCKET_SQL, algbw, algbw_array, busbw, busbw_factor, size_bucket, size_bucket_label
from tracekit.model.collectives import (
    ALGORITHMS,
    Coefficients,
    HierarchicalPrediction,
    Prediction,
    algorithm_coefficients,
    applicable_algorithms,
    crossover_size,
    double_binary_tree_all_reduce_time,
    fixed_latency,
    hierarchical_all_reduce,
    nvls_all_reduce_time,
    p2p_time,
    pairwise_all_to_all_time,
    predict_collective,
    rabenseifner_all_reduce_time,
    recursive_doubling_all_reduce_time,
    ring_all_gather_time,
    ring_all_reduce_time,
    ring_broadcast_time,
    ring_reduce_scatter_time,
    scatter_allgather_broadcast_time,
    tree_all_reduce_time,
    tree_broadcast_time,
    verdict,
)
from tracekit.model.fit import AlphaBetaFit, fit_alpha_beta, fit_alpha_beta_many, fit_unweighted
from tracekit.model.links import (
    DEFAULT_EFFICIENCY,
    DEVICE_PRESETS,
    presets_for_device,
    LINK_PRESETS,
    Link,
    LinkPreset,
    achieved_fraction,
    custom_link,
    device_presets,
    link_from_preset,
    message_time,
    n_half,
    network_link,
)
from tracekit.model.machine import MACHINE_PRESETS, Machine, load_machine_file, machine_preset, make_machine
from tracekit.model.nccl_tuning import NCCL_TABLE, NcclPrediction, nccl_choice, nccl_predictions
from tracekit.model.ops import CANONICAL_OPS, canonical_op
from tracekit.model.overlap import (
    ChunkedOverlap,
    LayerTransfer,
    PipelineDecode,
    TwoBatchOverlap,
    best_chunks,
    chunked_overlap,
    layer_transfer,
    layered_exposed_time,
    no_overlap_time,
    pipeline_bubble_fraction,
    pp_decode,
    two_batch_overlap,
)
from tracekit.model.units import (
    format_bandwidth,
    format_bytes,
    format_time,
    parse_bandwidth,
    parse_bytes,
    parse_time,
)

__all__ = [
    "ALGORITHMS",
    "AlphaBetaFit",
    "CANONICAL_OPS",
    "ChunkedOverlap",
    "Coefficients",
    "DEFAULT_EFFICIENCY",
    "DEVICE_PRESETS",
    "presets_for_device",
    "device_presets",
    "network_link",
    "HierarchicalPrediction",
    "LINK_PRESETS",
    "LayerTransfer",
    "Link",
    "LinkPreset",
    "PipelineDecode",
    "Prediction",
    "TwoBatchOverlap",
    "achieved_fraction",
    "algbw",
    "algorithm_coefficients",
    "applicable_algorithms",
    "best_chunks",
    "busbw",
    "busbw_factor",
    "canonical_op",
    "chunked_overlap",
    "custom_link",
    "crossover_size",
    "double_binary_tree_all_reduce_time",
    "fixed_latency",
    "fit_alpha_beta",
    "fit_alpha_beta_many",
    "fit_unweighted",
    "format_bandwidth",
    "format_bytes",
    "format_time",
    "hierarchical_all_reduce",
    "layer_transfer",
    "link_from_preset",
    "message_time",
    "n_half",
    "no_overlap_time",
    "nvls_all_reduce_time",
    "p2p_time",
    "pairwise_all_to_all_time",
    "parse_bandwidth",
    "parse_bytes",
    "parse_time",
    "pp_decode",
    "predict_collective",
    "rabenseifner_all_reduce_time",
    "recursive_doubling_all_reduce_time",
    "ring_all_gather_time",
    "ring_all_reduce_time",
    "ring_broadcast_time",
    "ring_reduce_scatter_time",
    "scatter_allgather_broadcast_time",
    "tree_all_reduce_time",
    "tree_broadcast_time",
    "two_batch_overlap",
    "layered_exposed_time",
    "pipeline_bubble_fraction",
    "verdict",
    "MACHINE_PRESETS",
    "Machine",
    "load_machine_file",
    "machine_preset",
    "make_machine",
    "NCCL_TABLE",
    "NcclPrediction",
    "nccl_choice",
    "nccl_predictions",
]
