"""measured_vs_model: per run and rank, the measured overlap against what the α–β model predicts.

Reads: overlap_by_step, collectives, collective_steps, runs, alpha_beta_fit, collective_reference,
collective_waits, process_groups, collective_overlap, group_machine

For every rank of every run, over the profiler steps that hold communication:
measured compute, communication, overlap and exposed communication (means per
step, from overlap_by_step), next to the model's prediction for the same
layout. The model gets the measured compute time c of the step and predicts
the communication time a of the step from the step's own collectives (op,
size, group size as recorded) under α and β (T = A·α + B·D/β per call, from
tracekit.model), then applies the run's overlap model
(../shared/reference/alpha-beta.md, "Overlap models"). The model is the run config's
``overlap_model`` = ``{"kind": ..., "params": {...}}``, recorded by the collector that ran the
job (:func:`overlap_model` maps run configs written before that key existed); by kind:

- ``chunked`` (params ``chunks`` = n > 1; tp ``--overlap-chunks``) — chunked pipelining per
  all-reduce piece: T(n) = c/n + (a/n + α_c) + (n−1)·max(c/n, a/n + α_c), with a the
  piece's β term, α_c one message's α term; exposed = T(n) − c per piece;
- ``two_batch`` (params ``layers``; ep ``--two-batch-overlap``) — T = max(a, c) + min(a, c)/2
  per layer; exposed = T − c;
- ``layerwise`` (params ``layers`` = L; disagg-kv ``--mode layerwise``) — each layer's transfer
  overlapping the next layer's compute: exposed = a/L + (L−1)·max(0, a/L − c/L)
  (the reference's "only the last layer's transfer is exposed" when compute is
  the longer; the max term covers the other case);
- ``pipeline`` (params ``stages`` = p, ``microbatches`` = m; pp training) — no overlap of the
  stage sends: exposed = a; the row also carries the GPipe bubble fraction (p−1)/(m+p−1);
- ``pp_decode`` (params ``stages`` = p, ``stage_compute_s`` = s, ``message_bytes``) — no overlap
  (exposed = a); the note gives the token interval the model allows, p·s + (p−1)·x, with s the
  measured per-token stage compute and x one activation message's α–β time;
- ``no_overlap`` (everything else: tp unchunked, ep without two-batch overlap, disagg-kv bulk,
  sweeps, external jobs) — exposed = a. An unknown kind gets no prediction, and a note.

α and β (per process group, op and group size) are the verdicts' reference
(collective_reference: the ``--link`` preset or the user's α/β; else the group's own
ok fit; else the newest ok sweep / nccl-tests fit of this machine; else the preset of
the group's device and locality class; the order: analyses/fit.py). Where that last one, a
preset, applies and the device is known, a call's time is NCCL's own model instead, as in
collective_verdicts: the fastest algorithm/protocol for its op, size, k and node count
(tracekit.analyses._nccl_udfs). A call whose
group has none takes the first group's of its (op, k); a missing (op, k) falls back to the reference of another op of that k, then any op (α and
β are link properties in the model; the algorithm coefficients carry the op).
send/recv are modelled as point-to-point messages (T = α + D/β).

The gap (measured exposed − predicted exposed, per step) is split into three
parts that add up to it, so that the report says which one to fix:

- ``gap_skew_ns`` = W, the rank's waiting for the last rank to arrive
  (Σ collective_waits.wait_ns of its calls in the steps, per step; capped at
  its comm time): time inside its communication spans spent on stragglers;
- ``gap_transfer_ns`` = (comm − W) − predicted_comm: transfer beyond the model
  (the rest of its communication time against the α–β prediction);
- ``gap_exposure_ns`` = (predicted_comm − predicted_exposed) − overlap: what the
  overlap model says could be hidden behind compute, minus what the trace hid.

W + (comm − W − A) + (A − P − overlap) = comm − overlap − P = exposed − P.

Per dimension (multi-dimensional runs: tp/pp/dp/ep groups at once). A run config may also hold
``overlap_models`` = {dimension: {"kind", "params"}}, one model per parallel dimension (the 3d
and ep × dp collectors record it; :func:`dimension_models` maps 3d configs written before). Each
dimension's calls (a call's dimension: its group's in ``process_groups``) are predicted on their
own, T per call as above, and their exposed part by the dimension's model:

- ``no_overlap`` (TP's all-reduces on the critical path, EP's all-to-alls) — exposed = a;
- ``pipeline`` (PP's sends, params ``stages``, ``microbatches``) — exposed = a, and the row
  carries the bubble fraction (p−1)/(m+p−1);
- ``bucket_overlap`` (DP, params ``buckets`` = B per step, an int or a list per rank) — DDP
  launches each gradient bucket during the backward as soon as it is full (Li et al., "PyTorch
  Distributed", VLDB 2020), so all but the last can hide behind the backward still to run:
  exposed = the α–β time of the dimension's calls of a step after its first B − 1 (the last
  bucket; with ZeRO/FSDP also the all-gathers after the step). It assumes the backward left
  after each launch is longer than that bucket's transfer: a lower bound on what is exposed.

Measured per dimension: Σ over its calls in the steps of their span (dur_ns) and of their part
covered by compute (collective_overlap.overlap_ns), per step; sums over calls, not unions (two
calls of a dimension in flight at once count twice).

measured_vs_model:
run_id               VARCHAR  run
workload             VARCHAR  workload label
rank                 INTEGER  global rank
steps                INTEGER  profiler steps averaged
compute_ns           DOUBLE   measured |∪ compute| per step, ns
comm_ns              DOUBLE   measured |∪ comm| per step, ns
overlap_ns           DOUBLE   measured |comm ∩ compute| per step, ns
exposed_ns           DOUBLE   measured comm − overlap per step, ns
model                VARCHAR  overlap model applied (no_overlap, chunked, two_batch, layerwise, pp_decode)
predicted_comm_ns    DOUBLE   α–β time of the step's collectives, ns (per step)
predicted_exposed_ns DOUBLE   exposed communication the overlap model predicts, ns (per step)
alpha_s              DOUBLE   α used (of the step's first modelled op), s
beta_Bps             DOUBLE   β used, bytes/s
ab_source            VARCHAR  where α, β came from: <kind>:<run or preset> (link:nvlink4, sweep:<run>,
                              nccl_tests:<run>, preset:nvlink2, own_fit:<run>, user:user α/β)
gap_ratio            DOUBLE   measured exposed / predicted exposed (NULL if predicted is 0)
larger               VARCHAR  'measured' or 'model': which side is larger
bubble_fraction      DOUBLE   pp only: (p−1)/(m+p−1)
note                 VARCHAR  what the prediction assumed, in words
wait_ns              DOUBLE   the rank's waiting for stragglers per step, ns (inside comm_ns); NULL when
                              a step's calls were recorded by fewer than two ranks of their group
gap_ns               DOUBLE   exposed_ns − predicted_exposed_ns, ns per step
gap_skew_ns          DOUBLE   part of the gap spent waiting for stragglers, ns per step
gap_transfer_ns      DOUBLE   part of the gap that is transfer beyond the α–β model, ns per step
gap_exposure_ns      DOUBLE   part of the gap that is communication the overlap model would have hidden, ns

measured_vs_model_by_dimension:
run_id               VARCHAR  run
rank                 INTEGER  global rank
dimension            VARCHAR  tp / pp / dp / ep / cp / other (process_groups.dimension)
groups               VARCHAR  the rank's process groups of the dimension, comma-separated
steps                INTEGER  profiler steps averaged (the rank's steps with communication)
calls                DOUBLE   the dimension's calls per step
comm_ns              DOUBLE   Σ dur_ns of those calls per step, ns
overlap_ns           DOUBLE   Σ of their part covered by compute per step, ns
exposed_ns           DOUBLE   comm_ns − overlap_ns, ns
model                VARCHAR  the dimension's overlap model (no_overlap, pipeline, bucket_overlap)
predicted_comm_ns    DOUBLE   α–β time of the dimension's calls per step, ns
predicted_exposed_ns DOUBLE   exposed communication the model predicts per step, ns
gap_ns               DOUBLE   exposed_ns − predicted_exposed_ns, ns
bubble_fraction      DOUBLE   pipeline only: (p−1)/(m+p−1)
note                 VARCHAR  what the prediction assumed, in words
"""

from __future__ import annotations

import json
from collections import defaultdict

import pyarrow as pa


SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("workload", pa.string()), ("rank", pa.int32()), ("steps", pa.int32()),
        ("compute_ns", pa.float64()), ("comm_ns", pa.float64()), ("overlap_ns", pa.float64()),
        ("exposed_ns", pa.float64()), ("model", pa.string()), ("predicted_comm_ns", pa.float64()),
        ("predicted_exposed_ns", pa.float64()), ("alpha_s", pa.float64()), ("beta_Bps", pa.float64()),
        ("ab_source", pa.string()), ("gap_ratio", pa.float64()), ("larger", pa.string()),
        ("bubble_fraction", pa.float64()), ("note", pa.string()),
        ("wait_ns", pa.float64()), ("gap_ns", pa.float64()), ("gap_skew_ns", pa.float64()),
        ("gap_transfer_ns", pa.float64()), ("gap_exposure_ns", pa.float64()),
    ]
)

P2P = {"send", "recv"}


class _AlphaBeta:
    """(process group, op, k) → (α, β, source) from the verdicts' reference (module docstring):
    each group's own reference (its ok fit, its locality class's preset...); a call whose group
    has none takes the first group's of the same (op, k), by pg_name."""

    def __init__(self, con, link: str | None):
        self.link = link
        self.refs: dict[str, dict] = defaultdict(dict)  # run_id → {(op, k): (α, β, source)}
        self.by_group: dict = {}  # (run_id, pg_name, op, k) → (α, β, source)
        # a preset reference carries (device, nodes, NICs per node) for NCCL's model (_call_terms)
        # NICs per node: the user's (tk_nics_per_node), else the group's own log's (group_machine)
        for run_id, pg, op, k, a, b, kind, ref, dev, nodes, nics in con.execute(
            "SELECT c.run_id, c.pg_name, op, c.group_size, ref_alpha_s, ref_beta_Bps, ref_kind, "
            "coalesce(ref_run_id, reference), r.device_name, "
            "CASE WHEN coalesce(c.hosts, '') <> '' THEN len(string_split(c.hosts, ',')) "
            "WHEN c.locality NOT IN ('inter_node', 'mixed') THEN 1 END, "
            "coalesce(TRY_CAST(getvariable('tk_nics_per_node') AS INTEGER), gm.nics_per_node) "
            "FROM collective_reference c LEFT JOIN runs r USING (run_id) "
            "LEFT JOIN group_machine gm ON gm.run_id = c.run_id AND gm.pg_name = c.pg_name "
            "WHERE ref_alpha_s IS NOT NULL AND ref_beta_Bps IS NOT NULL "
            "ORDER BY c.run_id, op, c.group_size, c.pg_name"
        ).fetchall():
            key = ("send" if op in P2P else op, k)
            v = (a, b, f"{kind}:{ref}") + (((dev, nodes, nics),) if kind == "preset" and dev and nodes else ())
            self.refs[run_id].setdefault(key, v)
            self.by_group.setdefault((run_id, pg) + key, v)

    def _pick(self, fits: dict, op: str, k: int):
        key = ("send" if op in P2P else op, k)
        if key in fits:
            return fits[key]
        same_k = [v for (o, kk), v in sorted(fits.items()) if kk == k]
        if same_k:
            return same_k[0]
        return next(iter(sorted(fits.items())))[1] if fits else None

    def get(self, run_id: str, op: str, k: int, pg: str | None = None):
        if self.link:
            from tracekit.model import link_from_preset

            lk = link_from_preset(self.link)
            return lk.alpha_s, lk.beta_Bps, f"link:{self.link}"
        own = self.by_group.get((run_id, pg, "send" if op in P2P else op, k))
        if own is not None:
            return own
        if self.refs.get(run_id):
            return self._pick(self.refs[run_id], op, k)
        return None


def _call_terms(op: str, size: int, k: int, got: tuple) -> tuple[float, float] | None:
    """(α term, β term) in seconds of one call under the reference ``got`` of _AlphaBeta.get: a
    preset reference (4th item: device, nodes, NICs) is NCCL's fastest algorithm/protocol
    (tracekit.analyses._nccl_udfs: latency, size / algbw), as in collective_verdicts; the
    others, and a call NCCL's model has no answer for, the α–β line of :func:`_terms`."""
    if len(got) > 3 and size is not None:
        from tracekit.analyses._nccl_udfs import nccl_reference

        dev, nodes, nics = got[3]
        p = nccl_reference(op, size, k, nodes, dev, nics)
        if p is not None:
            return p.latency_s, p.beta_term_s
    return _terms(op, size, k, got[0], got[1])


def _terms(op: str, size: int, k: int, alpha: float, beta: float) -> tuple[float, float] | None:
    """(α term, β term) in seconds for one call, from tracekit.model's coefficients."""
    from tracekit.errors import TracekitError
    from tracekit.model import ALGORITHMS, algorithm_coefficients

    mop = "send" if op in P2P else op
    algos = ALGORITHMS.get(mop)
    if not algos or size is None:
        return None
    try:
        co = algorithm_coefficients(mop, algos[0], max(int(k or 2), 2 if mop != "send" else 1))
    except TracekitError:
        return None
    return co.alpha_coeff * alpha, co.beta_coeff * size / beta


def overlap_model(workload: str | None, cfg: dict) -> dict:
    """The run's overlap model ``{"kind": str, "params": dict}`` (module docstring).

    ``cfg["overlap_model"]`` when the collector recorded one. Run configs written before that key
    existed (the stored fixtures) are mapped here, and only here, from their layout: tp with
    ``overlap_chunks`` > 1 → chunked; ep with ``two_batch_overlap`` → two_batch; disagg_kv with
    ``mode`` layerwise → layerwise; pp in decode → pp_decode (s: the median over stages of
    ``timing.stage_compute_s[].decode_per_microbatch_s``, the upper one of two; the bytes of the
    first decode activation in ``expected.messages``); other pp → pipeline; else no_overlap.
    """
    m = cfg.get("overlap_model")
    if isinstance(m, dict) and isinstance(m.get("kind"), str):
        return {"kind": m["kind"], "params": m.get("params") if isinstance(m.get("params"), dict) else {}}
    chunks = int(cfg.get("overlap_chunks") or 1)
    layers = max(1, int(cfg.get("layers") or 1))
    stages = int(cfg.get("stages") or cfg.get("ranks") or 1)
    if workload == "tp" and chunks > 1:
        return {"kind": "chunked", "params": {"chunks": chunks}}
    if workload == "ep" and cfg.get("two_batch_overlap"):
        return {"kind": "two_batch", "params": {"layers": layers}}
    if workload in ("disagg_kv", "disagg-kv") and str(cfg.get("mode")) == "layerwise":
        return {"kind": "layerwise", "params": {"layers": layers}}
    if workload == "pp" and str(cfg.get("mode")) == "decode":
        vals = [st.get("decode_per_microbatch_s") for st in (cfg.get("timing") or {}).get("stage_compute_s") or []
                if isinstance(st, dict)]
        vals = sorted(v for v in vals if isinstance(v, (int, float)) and v > 0)
        msg = next((m.get("bytes") for m in (cfg.get("expected") or {}).get("messages") or []
                    if isinstance(m, dict) and m.get("kind") == "activation" and m.get("phase") == "decode"), None)
        return {"kind": "pp_decode", "params": {"stages": stages, "stage_compute_s": vals[len(vals) // 2] if vals else None,
                                                "message_bytes": msg}}
    if workload == "pp":
        return {"kind": "pipeline", "params": {"stages": stages, "microbatches": int(cfg.get("microbatches") or 1)}}
    return {"kind": "no_overlap", "params": {}}


def rows_for(con, link: str | None) -> list[dict]:
    """The rows of ``measured_vs_model`` (columns and units in the module docstring) for every run
    on ``con`` that has profiler steps with communication; sweeps are the reference, not rows.

    ``link``: a preset name, which then supplies α and β for every prediction.
    """
    from tracekit.model import chunked_overlap, layered_exposed_time, pipeline_bubble_fraction, two_batch_overlap

    ab = _AlphaBeta(con, link)
    runs = {r[0]: (r[1], json.loads(r[2] or "{}")) for r in con.execute("SELECT run_id, workload, config FROM runs").fetchall()}
    waits: dict = defaultdict(float)  # (run_id, rank, step) → Σ wait_ns
    for run_id, rank, step, w in con.execute(
        f"SELECT w.run_id, w.rank, e.step, sum(w.wait_ns) FROM collective_waits w "
        f"JOIN {CALL_STEPS} e USING (run_id, rank, event_id) GROUP BY ALL"
    ).fetchall():
        waits[(run_id, rank, step)] = None if w is None else float(w)  # None: fewer than two ranks recorded
    measured = defaultdict(list)
    for run_id, rank, step, comp, comm, ov, exp in con.execute(
        "SELECT run_id, rank, step, compute_ns, comm_ns, overlap_ns, exposed_comm_ns FROM overlap_by_step "
        "WHERE comm_ns > 0 ORDER BY run_id, rank, step"
    ).fetchall():
        measured[(run_id, rank)].append((step, comp, comm, ov, exp))
    # the model's terms per (run, rank), summed over its measured steps' calls in time order (the
    # order fixes the float sums and which α/β source is reported); rows are streamed, not kept
    want = {(run_id, rank, s[0]) for (run_id, rank), steps in measured.items() for s in steps}
    sums: dict = {}  # (run_id, rank) → [α term, β term, calls modelled, first α/β used, all modelled]
    # the same (op, size, k) recur in every step of every rank: look α, β and the terms up once,
    # one dict lookup per call: (run, group, op, size, k) → (α/β used, terms)
    ab_memo: dict = {}
    terms_memo: dict = {}
    memo: dict = {}
    cur = con.execute(
        f"SELECT c.run_id, c.rank, e.step, c.op, c.size_bytes, c.group_size, c.pg_name FROM collectives c "
        f"JOIN {CALL_STEPS} e USING (run_id, rank, event_id) WHERE e.comm AND c.op IS NOT NULL "
        "ORDER BY c.run_id, c.rank, e.step, c.ts_ns, c.event_id"
    )
    at = (object(), object(), object())  # the (run, rank, step) of the rows before: sorted, so in runs
    keep, acc = False, None
    while rows := cur.fetchmany(8192):  # nothing in this loop may run SQL on con: the result is streamed
        for run_id, rank, step, op, size, k, pg in rows:
            if step != at[2] or rank != at[1] or run_id != at[0]:
                if rank != at[1] or run_id != at[0]:
                    acc = None
                at = (run_id, rank, step)
                keep = at in want
            if not keep:
                continue
            if acc is None:
                acc = sums.get((run_id, rank))
                if acc is None:
                    acc = sums[(run_id, rank)] = [0.0, 0.0, 0, None, True]
            key = (run_id, pg, op, size, k)
            m = memo.get(key)
            if m is None:
                akey = (run_id, pg, op, k)
                got = ab_memo[akey] if akey in ab_memo else ab_memo.setdefault(akey, ab.get(run_id, op, k, pg))
                if got:
                    tkey = (op, size, k, got)
                    t = terms_memo[tkey] if tkey in terms_memo else terms_memo.setdefault(tkey, _call_terms(*tkey))
                else:
                    t = None
                m = memo[key] = (got, t)
            got, t = m
            if t is None:
                acc[4] = False
                continue
            acc[3] = acc[3] or got
            acc[0] += t[0]
            acc[1] += t[1]
            acc[2] += 1
    out = []
    for (run_id, rank), steps in sorted(measured.items()):
        if run_id not in runs or runs[run_id][0] == "sweep":
            continue
        workload, cfg = runs[run_id]
        n = len(steps)
        c = sum(s[1] for s in steps) / n * 1e-9
        row = dict(run_id=run_id, workload=workload, rank=rank, steps=n, compute_ns=c * 1e9,
                   comm_ns=sum(s[2] for s in steps) / n, overlap_ns=sum(s[3] for s in steps) / n,
                   exposed_ns=sum(s[4] for s in steps) / n, model="no_overlap")
        got = [waits.get((run_id, rank, s[0]), 0.0) for s in steps]
        row["wait_ns"] = None if None in got else min(sum(got) / n, row["comm_ns"])  # None: not measurable
        a_alpha, a_beta, n_calls, used, modelled = sums.get((run_id, rank)) or (0.0, 0.0, 0, None, True)
        if used is None or not modelled:
            # a call with no size (a trace without Input Dims) or no model stops the prediction whatever
            # the reference: say that first, not "no α/β" (which --link would not fix)
            row.update(note="some collectives have no size or no model: not predicted" if not modelled
                       else "no α/β for this run's collectives (run a sweep, or pass --link)")
            out.append(row)
            continue
        a_alpha /= n
        a_beta /= n
        n_calls /= n
        a = a_alpha + a_beta
        row.update(alpha_s=used[0], beta_Bps=used[1], ab_source=used[2], predicted_comm_ns=a * 1e9)
        exposed = a
        note = "model: no overlap assumed, so predicted exposed = predicted comm (measured overlap is in its own column)"
        om = overlap_model(workload, cfg)
        kind, prm = om["kind"], om["params"]
        if kind == "chunked" and int(prm.get("chunks") or 1) > 1 and n_calls:
            chunks = int(prm["chunks"])
            pieces = max(1.0, n_calls / chunks)
            cp, ap, ac = c / pieces, a_beta / pieces, a_alpha / n_calls
            exposed = pieces * (chunked_overlap(cp, ap, chunks, ac).time_s - cp)
            row["model"] = "chunked"
            note = f"chunked pipelining, n = {chunks}, over {pieces:g} all-reduce pieces per step"
        elif kind == "two_batch":
            layers = max(1, int(prm.get("layers") or 1))
            cp, ap = c / layers, a / layers
            exposed = layers * (two_batch_overlap(cp, ap).time_s - cp)
            row["model"] = "two_batch"
            note = f"two-batch overlap per MoE layer ({layers} layers)"
        elif kind == "layerwise":
            layers = max(1, int(prm.get("layers") or 1))
            exposed = layered_exposed_time(a / layers, c / layers, layers)
            row["model"] = "layerwise"
            note = f"layer-by-layer transfer over {layers} layers"
        elif kind == "pp_decode":
            p = max(1, int(prm.get("stages") or 1))
            row["model"] = "pp_decode"
            note = "decode: every token crosses all stages, its sends are on the critical path (no overlap)"
            s_tok, msg = prm.get("stage_compute_s"), prm.get("message_bytes")
            if s_tok is not None and msg is not None:
                x_t = _terms("send", msg, 2, used[0], used[1])
                x = x_t[0] + x_t[1] if x_t else None
                if x is not None:
                    from tracekit.model import pp_decode

                    r = pp_decode(p, 1, s_tok, x, 1).token_latency_s
                    note += f"; token interval ≥ p·s + (p−1)·x = {r * 1e3:.3f} ms (s = {s_tok * 1e3:.3f} ms, x = {x * 1e6:.1f} µs)"
        elif kind == "pipeline":
            p = int(prm.get("stages") or 1)
            m = int(prm.get("microbatches") or 1)
            row["bubble_fraction"] = pipeline_bubble_fraction(max(1, p), max(1, m))
            note = f"no overlap of the stage sends; GPipe bubble (p−1)/(m+p−1) with p = {p}, m = {m}"
        elif kind not in ("no_overlap", "chunked"):
            row["note"] = f"unknown overlap model {kind!r} in the run config: not predicted"
            out.append(row)
            continue
        row["predicted_exposed_ns"] = exposed * 1e9
        if exposed > 0:
            row["gap_ratio"] = row["exposed_ns"] / (exposed * 1e9)
        row["larger"] = "measured" if row["exposed_ns"] >= exposed * 1e9 else "model"
        row["note"] = note
        row["gap_ns"] = row["exposed_ns"] - row["predicted_exposed_ns"]
        row["gap_skew_ns"] = row["wait_ns"]
        row["gap_transfer_ns"] = (None if row["wait_ns"] is None
                                  else row["comm_ns"] - row["wait_ns"] - row["predicted_comm_ns"])
        row["gap_exposure_ns"] = row["predicted_comm_ns"] - row["predicted_exposed_ns"] - row["overlap_ns"]
        out.append(row)
    return out


DIM_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("rank", pa.int32()), ("dimension", pa.string()), ("groups", pa.string()),
        ("steps", pa.int32()), ("calls", pa.float64()), ("comm_ns", pa.float64()), ("overlap_ns", pa.float64()),
        ("exposed_ns", pa.float64()), ("model", pa.string()), ("predicted_comm_ns", pa.float64()),
        ("predicted_exposed_ns", pa.float64()), ("gap_ns", pa.float64()), ("bubble_fraction", pa.float64()),
        ("note", pa.string()),
    ]
)


def dimension_models(workload: str | None, cfg: dict) -> dict[str, dict]:
    """dimension → overlap model ``{"kind", "params"}`` of a multi-dimensional run (module
    docstring); {} for a run with none. ``cfg["overlap_models"]`` when the collector recorded it;
    a 3d config written before that key: tp no_overlap, pp pipeline (pp stages, microbatches), dp
    bucket_overlap with each rank's ``expected.per_rank_per_step[r].dp_buckets``."""
    m = cfg.get("overlap_models")
    if isinstance(m, dict):
        return {d: {"kind": v["kind"], "params": v.get("params") if isinstance(v.get("params"), dict) else {}}
                for d, v in m.items() if isinstance(v, dict) and isinstance(v.get("kind"), str)}
    if workload == "3d" and isinstance(cfg.get("expected"), dict):
        per_rank = cfg["expected"].get("per_rank_per_step") or []
        return {"tp": {"kind": "no_overlap", "params": {}},
                "pp": {"kind": "pipeline", "params": {"stages": int(cfg.get("pp") or 1),
                                                      "microbatches": int(cfg.get("microbatches") or 1)}},
                "dp": {"kind": "bucket_overlap", "params": {"buckets": [int(r.get("dp_buckets") or 0) for r in per_rank]}}}
    return {}


def _buckets_of(prm: dict, rank: int) -> int | None:
    b = prm.get("buckets")
    if isinstance(b, list):
        b = b[rank] if 0 <= rank < len(b) else None
    return int(b) if isinstance(b, (int, float)) and b >= 1 else None


def dimension_rows(con, link: str | None) -> list[dict]:
    """The rows of ``measured_vs_model_by_dimension`` (module docstring) for the runs whose
    config gives per-dimension overlap models (:func:`dimension_models`)."""
    from tracekit.model import pipeline_bubble_fraction

    models = {}
    for run_id, workload, config in con.execute("SELECT run_id, workload, config FROM runs").fetchall():
        dm = dimension_models(workload, json.loads(config or "{}"))
        if dm:
            models[run_id] = dm
    if not models:
        return []
    ab = _AlphaBeta(con, link)
    steps = defaultdict(set)  # (run, rank) → the steps measured_vs_model averages over
    for run_id, rank, step in con.execute(
            "SELECT run_id, rank, step FROM overlap_by_step WHERE comm_ns > 0").fetchall():
        steps[(run_id, rank)].add(step)
    # per (run, rank, dimension, step): [(α–β time or None, dur, overlap)] in time order
    calls: dict = defaultdict(lambda: defaultdict(list))
    groups: dict = defaultdict(set)
    for run_id, rank, step, dim, pg, op, size, k, dur, ov in con.execute(
        "SELECT c.run_id, c.rank, e.step, coalesce(g.dimension, 'other'), c.pg_name, c.op, c.size_bytes, c.group_size, "
        f"c.dur_ns, coalesce(o.overlap_ns, 0) FROM collectives c JOIN {CALL_STEPS} e USING (run_id, rank, event_id) "
        "LEFT JOIN process_groups g USING (run_id, pg_name) LEFT JOIN collective_overlap o USING (run_id, rank, event_id) "
        "WHERE e.comm AND c.op IS NOT NULL AND c.pg_name IS NOT NULL "
        "ORDER BY c.run_id, c.rank, e.step, c.ts_ns, c.event_id"
    ).fetchall():
        if run_id not in models or step not in steps.get((run_id, rank), ()):
            continue
        got = ab.get(run_id, op, k, pg)
        t = _call_terms(op, size, k, got) if got else None
        calls[(run_id, rank, dim)][step].append((sum(t) if t else None, dur, ov))
        groups[(run_id, rank, dim)].add(pg)
    out = []
    for (run_id, rank, dim), per_step in sorted(calls.items()):
        n = len(steps[(run_id, rank)])
        every = [c for cs in per_step.values() for c in cs]
        comm, ov = sum(c[1] for c in every) / n, sum(c[2] for c in every) / n
        row = dict(run_id=run_id, rank=rank, dimension=dim, groups=",".join(sorted(groups[(run_id, rank, dim)], key=str)),
                   steps=n, calls=len(every) / n, comm_ns=comm, overlap_ns=ov, exposed_ns=comm - ov)
        om = models[run_id].get(dim)
        if om is None:
            row["note"] = f"the run config gives no overlap model for {dim}: not predicted"
            out.append(row)
            continue
        kind, prm = om["kind"], om["params"]
        row["model"] = kind
        if any(c[0] is None for c in every):
            row["note"] = "no α/β or no size for some of its calls: not predicted"
            out.append(row)
            continue
        a = sum(c[0] for c in every) / n
        if kind in ("no_overlap", "pipeline"):
            exposed = a
            note = "no overlap: every call on the critical path"
            if kind == "pipeline":
                p, m = int(prm.get("stages") or 1), int(prm.get("microbatches") or 1)
                row["bubble_fraction"] = pipeline_bubble_fraction(max(1, p), max(1, m))
                note = f"no overlap of the stage sends; GPipe bubble (p−1)/(m+p−1) with p = {p}, m = {m}"
        elif kind == "bucket_overlap" and (b := _buckets_of(prm, rank)) is not None:
            exposed = sum(c[0] for cs in per_step.values() for c in cs[b - 1:]) / n
            note = f"DDP buckets: the first {b - 1} of {b} per step hidden by the backward, the rest exposed"
        else:
            row["note"] = f"unknown overlap model {kind!r} for {dim} (or no bucket count): not predicted"
            out.append(row)
            continue
        row.update(predicted_comm_ns=a * 1e9, predicted_exposed_ns=exposed * 1e9,
                   gap_ns=row["exposed_ns"] - exposed * 1e9, note=note)
        out.append(row)
    return out


CALL_STEPS = "collective_steps"
"""The stored per-rank table (tracekit.store.COLLECTIVE_STEPS_SCHEMA, written at ingest): (run_id,
rank, event_id, step, comm) of each collectives row's event that has a profiler step; comm: the
event's class is 'comm'. The waits, the calls and the per-dimension calls join it; no events are
read (at 1,024 ranks a scan of them opens 1,024 Parquet files)."""


def create(con) -> None:
    """Create the tables ``measured_vs_model`` and ``measured_vs_model_by_dimension`` on ``con``.
    Raises StoreError (one line, "ingest it again with --replace") for a run stored without
    collective_steps or with it damaged (:meth:`tracekit.store.AnalysisConnection.require_stored`)."""
    con.require_stored((CALL_STEPS,))
    link = con.execute("SELECT getvariable('tk_link')").fetchone()[0]
    from tracekit.analyses import create_table_from_rows

    create_table_from_rows(con, "measured_vs_model", SCHEMA, rows_for(con, link))
    create_table_from_rows(con, "measured_vs_model_by_dimension", DIM_SCHEMA, dimension_rows(con, link))
