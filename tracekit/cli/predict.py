"""`tracekit predict`: the α–β calculator for people planning a layout.

Thin: parses the options, calls :mod:`tracekit.model`, prints a rich table or
(``--json``) one JSON object with snake_case keys, times in seconds and sizes
in bytes. Bad values raise BadInputError, which the CLI boundary prints as one
line with exit code 2.

Forms:
  tracekit predict all_reduce --bytes 100MB --ranks 4 --link nvlink4 [--algo ring|...|all] [--json]
  (also all_gather, reduce_scatter, all_to_all, broadcast, send; --alpha/--beta override the preset)
  tracekit predict all_reduce --bytes 1GB --nodes 4 --gpus-per-node 8 --link-in nvlink4 --link-out ib_ndr \
      --algo hierarchical|all [--nics-per-node 8] [--machine dgx-h100|FILE.toml]
  tracekit predict all_reduce --bytes 8 --ranks 2048 --nodes 256 --machine dgx-h100 --algo nccl
  tracekit predict overlap --compute 1ms --comm 1ms --chunks 8|best --alpha-chunk 10us | --two-batch
  tracekit predict transfer --bytes 1.342GB --link ib_ndr --nics 8 [--layers 80]
  tracekit predict pp-decode --stages 8 --microbatches 8 --stage-time 1ms --transfer 0.1ms --tokens 100
  tracekit predict links
"""

import dataclasses
import json
import sys
from typing import Callable, Optional

import typer

from tracekit.errors import BadInputError
from tracekit import model
from tracekit.model import format_bandwidth as _fbw
from tracekit.model import format_bytes as _fb
from tracekit.model.units import parse_size
from tracekit.model import format_time as _ft
from tracekit.model.multinode import RING_OPS, flat_ring_across_nodes

app = typer.Typer(
    help="The α–β calculator: collective times per algorithm, hierarchical, overlap models.",
    no_args_is_help=True,
)

_COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")


def _emit_json(payload: dict) -> None:
    typer.echo(json.dumps(payload, indent=2))


def _console():
    """A rich console (tracekit.report.textfmt.output_console): piped, ``$COLUMNS`` or 140 columns."""
    from tracekit.report.textfmt import output_console

    return output_console(140)


def _print(table, console=None) -> None:
    """Print ``table`` fitted to the console (tracekit.report.textfmt.fit_table): cells wrap
    between words, and no number or name is cut."""
    from tracekit.report.textfmt import fit_table

    console = console or _console()
    fit_table(table, console.width)
    console.print(table)


def _table(title: str, columns: list[str], caption: Optional[str] = None):
    from rich import box
    from rich.table import Table

    # compact rules, no side borders (as the analyze report): 8 columns fit 100; a cell too narrow
    # folds inside a word rather than being cut
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    return table


def _int(value: Optional[str], option: str, minimum: int = 1) -> Optional[int]:
    """An integer option read here (not by typer) so a bad value is a one-line BadInputError."""
    if value is None:
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        raise BadInputError(f"bad {option} {value!r}: expected an integer >= {minimum}") from None
    return n


def _float(value: str, option: str) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise BadInputError(f"bad {option} {value!r}: expected a number") from None


def _resolve_link(
    link: Optional[str], alpha: Optional[str], beta: Optional[str], efficiency: float, option: str = "--link"
) -> model.Link:
    """A preset (with --alpha/--beta overriding either part), or a custom link from both."""
    a = model.parse_time(alpha) if alpha is not None else None
    b = model.parse_bandwidth(beta) if beta is not None else None
    if link is not None:
        return model.link_from_preset(link, efficiency=efficiency).with_overrides(alpha_s=a, beta_Bps=b)
    if a is not None and b is not None:
        return model.custom_link(a, b)
    raise BadInputError(
        f"no link: give {option} PRESET ({', '.join(model.LINK_PRESETS)}) or both --alpha and --beta"
    )


def _link_caption(link: model.Link) -> str:
    return (f"{link.name}: α {_ft(link.alpha_s)} per step, β {_fbw(link.beta_Bps)}, n½ {_fb(link.n_half_bytes)} "
            "(the link's; a collective's boundary is its D*)")


def _flat_assumption(link: model.Link, nics_per_node: int, gpus_per_node: int) -> str:
    """Words for the per-GPU NIC share that algorithms other than rings see across nodes."""
    return (
        f"every GPU sends across nodes at once: {gpus_per_node} GPUs per node share {nics_per_node} NIC(s), "
        f"β per GPU = NIC β × {min(nics_per_node, gpus_per_node)}/{gpus_per_node} = {_fbw(link.beta_Bps)}"
    )


def _prediction_rows(table, preds: list[model.Prediction], label: Callable[[model.Prediction], str]) -> None:
    for p in preds:
        table.add_row(
            label(p),
            _ft(p.time_s),
            _ft(p.alpha_term_s),
            _ft(p.beta_term_s),
            str(p.steps),
            _fb(p.bytes_per_rank_sent),
            "—" if p.crossover_bytes is None else _fb(p.crossover_bytes),
            p.verdict,
        )


def _run_collective(
    op: str,
    size: str,
    ranks: Optional[int],
    link: Optional[str],
    alpha: Optional[str],
    beta: Optional[str],
    efficiency: float,
    algo: Optional[str],
    nodes: Optional[int],
    gpus_per_node: Optional[int],
    link_in: Optional[str],
    link_out: Optional[str],
    as_json: bool,
    nics_per_node: Optional[int] = None,
    machine: Optional[str] = None,
) -> None:
    size_bytes = parse_size(size, whole=False)
    algo_key = None if algo is None else algo.strip().lower()
    if algo_key == "nccl" or (algo_key == "all" and (machine is not None or link_in is not None or link_out is not None)):
        the_machine, ranks, nodes = _machine_from_options(
            op, machine, ranks, nodes, gpus_per_node, link, link_in, link_out, nics_per_node, efficiency, alpha, beta
        )
        if algo_key == "nccl":
            _run_nccl(op, size_bytes, ranks, nodes, the_machine, as_json)
        else:
            _run_all_multi_node(op, size_bytes, ranks, nodes, the_machine, as_json)
        return
    if machine is not None:
        if algo_key != "hierarchical":
            raise BadInputError("--machine goes with --algo nccl, all or hierarchical")
        m = _machine_from_options(
            op, machine, ranks, nodes, gpus_per_node, None, link_in, link_out, nics_per_node, efficiency, None, None
        )[0]
        gpus_per_node, link_in, link_out, nics_per_node = m.gpus_per_node, m.link_in, m.nic, m.nics_per_node
    hierarchical = algo_key == "hierarchical"
    if hierarchical:
        _run_hierarchical(
            op, size_bytes, ranks, link, alpha, beta, efficiency, nodes, gpus_per_node, link_in, link_out, as_json,
            nics_per_node,
        )
        return
    flat_multi_node = nics_per_node is not None
    if flat_multi_node:
        # a flat collective across nodes on a network preset whose NICs the node's GPUs share
        if link is None or gpus_per_node is None:
            raise BadInputError("--nics-per-node needs --link NETWORK_PRESET and --gpus-per-node G (or --algo hierarchical)")
        if nodes is not None and ranks is not None and ranks != nodes * gpus_per_node:
            raise BadInputError(f"--ranks {ranks} disagrees with --nodes {nodes} × --gpus-per-node {gpus_per_node}")
        if ranks is None and nodes is not None:
            ranks = nodes * gpus_per_node
    elif nodes is not None or gpus_per_node is not None or link_in is not None or link_out is not None:
        raise BadInputError("--nodes, --gpus-per-node, --link-in and --link-out go with --algo hierarchical")
    if ranks is None:
        if op != "send":
            raise BadInputError(f"{op} needs --ranks K (the group size)")
        ranks = 2
    ring_words = None
    if flat_multi_node:
        the_link = model.network_link(link, nics_per_node, gpus_per_node, efficiency=efficiency).with_overrides(
            alpha_s=model.parse_time(alpha) if alpha is not None else None,
            beta_Bps=model.parse_bandwidth(beta) if beta is not None else None,
        )
    else:
        the_link = _resolve_link(link, alpha, beta, efficiency)
    result = model.predict_collective(op, size_bytes, ranks, the_link, algo=algo)
    preds = result if isinstance(result, list) else [result]
    if flat_multi_node and op in RING_OPS:
        # NCCL's rings leave each node through all of its NICs: the ring rows get the node's NICs
        nic = model.link_from_preset(link, efficiency=efficiency).with_overrides(
            alpha_s=model.parse_time(alpha) if alpha is not None else None,
            beta_Bps=model.parse_bandwidth(beta) if beta is not None else None,
        )
        nodes_n = ranks // gpus_per_node if ranks % gpus_per_node == 0 else None
        if nodes_n is None:
            raise BadInputError(f"--ranks {ranks} is not a multiple of --gpus-per-node {gpus_per_node}")
        ring, ring_words = flat_ring_across_nodes(op, size_bytes, nodes_n, gpus_per_node, nic, nics_per_node)
        preds = [ring if p.algo == "ring" else p for p in preds]
    skipped = []
    if algo is not None and algo.strip().lower() == "all":
        ran = {p.algo for p in preds}
        skipped = [
            {"algo": a, "reason": f"needs a power-of-two number of ranks, got {ranks}"}
            for a in model.ALGORITHMS[op]
            if a not in ran
        ]
    if as_json:
        _emit_json(
            {
                "op": op,
                "size_bytes": size_bytes,
                "ranks": ranks,
                "link": the_link.to_dict(),
                "predictions": [p.to_dict() for p in preds],
                "skipped": skipped,
                **({"assumption": _flat_assumption(the_link, nics_per_node, gpus_per_node)} if flat_multi_node else {}),
                **({"ring_assumption": ring_words} if ring_words else {}),
            }
        )
        return
    caption = _link_caption(the_link)
    if ring_words:
        caption += "; ring: " + ring_words
        if any(p.algo != "ring" for p in preds):
            caption += "; the others: " + _flat_assumption(the_link, nics_per_node, gpus_per_node)
    elif flat_multi_node:
        caption += "; " + _flat_assumption(the_link, nics_per_node, gpus_per_node)
    if skipped:
        caption += "; skipped: " + ", ".join(f"{s['algo']} ({s['reason']})" for s in skipped)
    table = _table(
        f"{op} of {_fb(size_bytes)} per rank on {ranks} ranks",
        ["algorithm", "time", "α term", "β term", "steps", "sent/rank", "D*", "verdict"],
        caption + "; α term = the collective's fixed latency (steps × α); D* = its latency/bandwidth boundary",
    )
    _prediction_rows(table, preds, lambda p: p.algo)
    _print(table)


def _run_hierarchical(
    op: str,
    size_bytes: float,
    ranks: Optional[int],
    link: Optional[str],
    alpha: Optional[str],
    beta: Optional[str],
    efficiency: float,
    nodes: Optional[int],
    gpus_per_node: Optional[int],
    link_in: Optional[str],
    link_out: Optional[str],
    as_json: bool,
    nics_per_node: Optional[int] = None,
) -> None:
    if op != "all_reduce":
        raise BadInputError(f"--algo hierarchical is an all_reduce algorithm, not one for {op}")
    if link is not None or alpha is not None or beta is not None:
        raise BadInputError("--algo hierarchical takes --link-in and --link-out presets, not --link/--alpha/--beta")
    missing = [
        name
        for name, value in (
            ("--nodes", nodes),
            ("--gpus-per-node", gpus_per_node),
            ("--link-in", link_in),
            ("--link-out", link_out),
        )
        if value is None
    ]
    if missing:
        raise BadInputError(f"--algo hierarchical needs {', '.join(missing)}")
    assert nodes is not None and gpus_per_node is not None and link_in is not None and link_out is not None
    if ranks is not None and ranks != nodes * gpus_per_node:
        raise BadInputError(f"--ranks {ranks} disagrees with --nodes {nodes} × --gpus-per-node {gpus_per_node}")
    lin = model.link_from_preset(link_in, efficiency=efficiency)
    lout = model.network_link(link_out, nics_per_node, gpus_per_node, efficiency=efficiency)
    h = model.hierarchical_all_reduce(size_bytes, nodes, gpus_per_node, lin, lout)
    # the flat comparator as NCCL runs it: its rings leave every node through all of its NICs
    flat, words = flat_ring_across_nodes(
        "all_reduce", size_bytes, nodes, gpus_per_node, model.link_from_preset(link_out, efficiency=efficiency),
        nics_per_node, lin,
    )
    h = dataclasses.replace(h, flat_ring=flat, speedup_vs_flat=flat.time_s / h.time_s if h.time_s > 0 else None,
                            flat_assumption=words)
    if as_json:
        payload = h.to_dict()
        payload["link_in"] = lin.to_dict()
        payload["link_out"] = lout.to_dict()
        _emit_json(payload)
        return
    table = _table(
        f"all_reduce of {_fb(size_bytes)} per rank on {nodes} nodes × {gpus_per_node} GPUs",
        ["phase", "ranks", "bytes", "link", "time", "α term", "β term", "verdict"],
        f"in: {_link_caption(lin)} | out: {_link_caption(lout)}; α term = the fixed latency (steps × α)",
    )
    def row(label: str, ranks: int, size: float, link_name: str, r) -> None:
        table.add_row(
            label, str(ranks), _fb(size), link_name, _ft(r.time_s), _ft(r.alpha_term_s), _ft(r.beta_term_s), r.verdict
        )

    for label, p in zip(("1 reduce-scatter (intra)", "2 all-reduce (inter)", "3 all-gather (intra)"), h.phases):
        row(label, p.ranks, p.size_bytes, p.link, p)
    row("hierarchical total", nodes * gpus_per_node, size_bytes, "", h)
    row("flat ring", h.flat_ring.ranks, h.flat_ring.size_bytes, h.flat_ring.link, h.flat_ring)
    console = _console()
    _print(table, console)
    if h.speedup_vs_flat is not None:
        console.print(f"hierarchical is {h.speedup_vs_flat:.3g}× the speed of the flat ring")
    from rich.text import Text

    console.print(Text(h.flat_assumption, style="dim"))


def _machine_from_options(op, machine, ranks, nodes, gpus_per_node, link, link_in, link_out, nics_per_node,
                          efficiency, alpha, beta):
    """(Machine, k, n) for --algo nccl / all across nodes: --machine (preset or TOML file) with the
    command line's facts over it, else a machine made of --gpus-per-node, --link-in (or --link),
    --link-out and --nics-per-node. NVLS is assumed on nvlink4/nvlink5 nodes (H100/B200 NVSwitch
    systems) unless --machine says otherwise. k defaults to n × G, n to 1."""
    from tracekit.model.machine import make_machine, resolve_machine

    if alpha is not None or beta is not None:
        raise BadInputError("--alpha/--beta do not apply to the NCCL model: it takes link presets or --machine")
    if link is not None and link_in is not None:
        raise BadInputError("give --link-in (or --link) for the intra-node link, not both")
    link_in = link_in if link_in is not None else link
    if machine is not None:
        m = resolve_machine(machine)
        over = {}
        for fact, value in (("gpus_per_node", gpus_per_node), ("link_in", link_in), ("nic", link_out),
                            ("nics_per_node", nics_per_node)):
            if value is not None:
                over[fact] = value
        if over:
            srcs = tuple((f, s) for f, s in m.sources if f not in over) + tuple((f, "command line") for f in over)
            m = dataclasses.replace(m, sources=srcs, **over)
    else:
        g = gpus_per_node
        if g is None and ranks is None and op == "send":
            ranks = 2  # a send has two ends
        if g is None:
            if ranks is None:
                raise BadInputError(f"{op} needs --ranks K or --gpus-per-node G (or --machine)")
            g = ranks if not nodes else max(1, ranks // nodes)
        if link_in is None:
            raise BadInputError("the NCCL model needs --link-in (or --link) for the intra-node link, or --machine")
        key = link_in.strip().lower().replace("-", "_")
        facts = {"nvls": key in ("nvlink4", "nvlink5"), "nvswitch": key.startswith("nvlink"),
                 "arch": {"nvlink2": "volta", "nvlink3": "ampere", "nvlink5": "blackwell"}.get(
                     key, "cdna" if key.startswith("xgmi") else "hopper")}
        m = make_machine(g, link_in, nic=link_out, nics_per_node=nics_per_node, source="command line",
                         name="command line", **facts)
        m = dataclasses.replace(m, sources=m.sources + (
            ("nvls", "assumed: NVLink SHARP on nvlink4/nvlink5 NVSwitch nodes" if facts["nvls"] else "assumed: none"),
            ("arch", f"assumed from {key}")))
    m = dataclasses.replace(m, efficiency=efficiency)
    n = 1 if nodes is None else nodes
    k = ranks if ranks is not None else n * m.gpus_per_node
    if ranks is not None and nodes is not None and ranks > nodes * m.gpus_per_node:
        raise BadInputError(f"--ranks {ranks} is more than --nodes {nodes} × {m.gpus_per_node} GPUs per node")
    if k < 2 and op != "send":
        raise BadInputError(f"bad rank count {k}: a collective needs at least 2 ranks")
    return m, k, n


def _machine_caption(machine) -> str:
    """The machine in one line, and that NCCL's model is an approximation on an AMD (RCCL) machine."""
    return machine.describe() + (" (RCCL runs here: NCCL's model is an approximation)" if machine.arch == "cdna" else "")


def _run_nccl(op: str, size_bytes: float, ranks: int, nodes: int, machine, as_json: bool) -> None:
    """--algo nccl: every algorithm × protocol of NCCL's tuning model, the fastest marked."""
    from tracekit.model.nccl_tuning import NCCL_SOURCE, nccl_choice, nccl_predictions

    rows = nccl_predictions(op, size_bytes, ranks, nodes, machine)
    best = nccl_choice(op, size_bytes, ranks, nodes, machine)
    if as_json:
        _emit_json({"op": op, "size_bytes": size_bytes, "ranks": ranks, "nodes": nodes,
                    "machine": machine.to_dict(), "source": NCCL_SOURCE, "nccl_pick": best.label,
                    "predictions": [r.to_dict() for r in rows]})
        return
    table = _table(
        f"{op} of {_fb(size_bytes)} per rank on {ranks} ranks over {nodes} node(s): NCCL's model",
        ["algorithm/protocol", "time", "latency", "β term", "algbw", "NCCL β rate", "D*", "verdict"],
        f"{_machine_caption(machine)}; {NCCL_SOURCE}; latency = NCCL's α term; algbw = size / time (nccl-tests' "
        "definition); NCCL β rate = size / β term, the algorithm's bandwidth without its latency (JSON algbw_Bps); "
        "D* = its latency/bandwidth boundary; "
        "* = what NCCL would pick; — = NCCL would not run it here"
        + ("; p2p: tracekit's composition from the table's ring latencies (NCCL's tuning table has no "
           "point-to-point row)" if any(r.algo == "p2p" for r in rows) else ""),
    )
    for r in rows:
        if not r.eligible:
            table.add_row(r.label, "—", "—", "—", "—", "—", "—", r.reason)
            continue
        table.add_row(("* " if r is best or r == best else "") + r.label, _ft(r.time_s), _ft(r.latency_s),
                      _ft(r.beta_term_s), _fbw(size_bytes / r.time_s) if r.time_s else "—", _fbw(r.algbw_Bps),
                      _fb(r.crossover_bytes), r.verdict)
    console = _console()
    _print(table, console)
    console.print(f"NCCL would pick {best.label}: {_ft(best.time_s)} (path: {best.assumption})")


def _run_all_multi_node(op: str, size_bytes: float, ranks: int, nodes: int, machine, as_json: bool) -> None:
    """--algo all across nodes: the α–β flat ring (NCCL's rings over every NIC) and hierarchical
    all-reduce, beside NCCL's ring, tree, NVLS / NVLS-tree and CollNet at their best protocol."""
    from tracekit.model.nccl_tuning import NCCL_SOURCE, nccl_choice, nccl_predictions

    g = machine.gpus_per_node
    rows = []  # (algorithm, model, time, α term, β term, D*, verdict, assumption)
    lin = machine.intra_link
    nic = machine.nic_link
    if nodes > 1 and nic is None:
        raise BadInputError(f"machine {machine.name!r} has no --link-out NIC preset for {nodes} nodes")
    ppn = max(1, ranks // nodes)
    if op in RING_OPS and nodes > 1:
        p, words = flat_ring_across_nodes(op, size_bytes, nodes, ppn, nic,
                                          max(1, -(-ppn * machine.nics_per_node // g)), lin)
        rows.append(("ring (flat)", "α–β", p.time_s, p.alpha_term_s, p.beta_term_s, p.crossover_bytes, p.verdict, words))
    if op == "all_reduce" and nodes > 1:
        lout = model.network_link(machine.nic, machine.nics_per_node, ppn, efficiency=machine.efficiency)
        h = model.hierarchical_all_reduce(size_bytes, nodes, ppn, lin, lout)
        rows.append(("hierarchical", "α–β", h.time_s, h.alpha_term_s, h.beta_term_s, None, h.verdict,
                     f"ring reduce-scatter and all-gather inside the node over {lin.name} "
                     f"({_fbw(lin.beta_Bps)}), ring all-reduce of D/{ppn} across {nodes} nodes with each GPU "
                     f"on its NIC share ({_fbw(lout.beta_Bps)})"))
    preds = nccl_predictions(op, size_bytes, ranks, nodes, machine)
    best = nccl_choice(op, size_bytes, ranks, nodes, machine)
    for algo in dict.fromkeys(r.algo for r in preds):
        eligible = [r for r in preds if r.algo == algo and r.eligible]
        if not eligible:
            reason = next(r.reason for r in preds if r.algo == algo)
            rows.append((algo, "NCCL", None, None, None, None, None, reason))
            continue
        r = min(eligible, key=lambda x: x.time_s)
        rows.append(((("* " if r.label == best.label else "") + r.label), "NCCL", r.time_s, r.latency_s, r.beta_term_s,
                     r.crossover_bytes, r.verdict, r.assumption))
    if as_json:
        keys = ("algo", "model", "time_s", "alpha_term_s", "beta_term_s", "crossover_bytes", "verdict", "assumption")
        _emit_json({"op": op, "size_bytes": size_bytes, "ranks": ranks, "nodes": nodes, "machine": machine.to_dict(),
                    "source": NCCL_SOURCE, "nccl_pick": best.label,
                    "predictions": [dict(zip(keys, (row[0].removeprefix("* "),) + row[1:])) for row in rows]})
        return
    table = _table(
        f"{op} of {_fb(size_bytes)} per rank on {ranks} ranks over {nodes} node(s)",
        ["algorithm", "model", "time", "α term", "β term", "D*", "verdict"],
        f"{_machine_caption(machine)}; NCCL rows: {NCCL_SOURCE}, each algorithm at its fastest protocol; "
        "* = what NCCL would pick; α term = fixed latency",
    )
    for name, mdl, t, a, b, dstar, v, _ in rows:
        if t is None:
            table.add_row(name, mdl, "—", "—", "—", "—", "not run here")
        else:
            table.add_row(name, mdl, _ft(t), _ft(a), _ft(b), "—" if dstar is None else _fb(dstar), v)
    console = _console()
    _print(table, console)
    from rich.text import Text

    for name, mdl, *_, words in rows:  # the console prints markup as text: style with Text
        console.print(Text(f"{name.removeprefix('* ')} ({mdl}): {words}", style="dim"))


def _make_collective_command(op: str):
    def command(
        size: str = typer.Option(..., "--bytes", help="Bytes per rank (nccl-tests S): 100MB = 1e8, 1G = 1GiB = 2**30, 1e9."),
        ranks: Optional[str] = typer.Option(None, "--ranks", help="Group size k."),
        link: Optional[str] = typer.Option(None, "--link", help=f"Link preset: {', '.join(model.LINK_PRESETS)}."),
        alpha: Optional[str] = typer.Option(None, "--alpha", help="Override α, e.g. 2us."),
        beta: Optional[str] = typer.Option(None, "--beta", help="Override effective β per direction, e.g. 360GB/s."),
        efficiency: str = typer.Option(
            str(model.DEFAULT_EFFICIENCY), "--efficiency", help="Effective/nominal bandwidth of presets."
        ),
        algo: Optional[str] = typer.Option(
            None,
            "--algo",
            help="nccl: NCCL 2.20's own model per algorithm/protocol; all: every algorithm (across nodes: ring, "
            "tree, NVLS" + (", hierarchical" if op == "all_reduce" else "") + "); or one of "
            + ", ".join(model.ALGORITHMS[op]) + (", hierarchical" if op == "all_reduce" else "") + ".",
        ),
        nodes: Optional[str] = typer.Option(None, "--nodes", help="Hierarchical: number of nodes N."),
        gpus_per_node: Optional[str] = typer.Option(None, "--gpus-per-node", help="Hierarchical: GPUs per node G."),
        link_in: Optional[str] = typer.Option(None, "--link-in", help="Hierarchical: intra-node link preset."),
        link_out: Optional[str] = typer.Option(None, "--link-out", help="Hierarchical: inter-node link preset."),
        nics_per_node: Optional[str] = typer.Option(
            None, "--nics-per-node",
            help="Multi-node: NICs per node. Rings use all of them (β = nics × NIC β); algorithms whose every "
                 "GPU sends at once get NIC β × nics/G each. Default one NIC per GPU.",
        ),
        machine: Optional[str] = typer.Option(
            None, "--machine",
            help="A machine preset (dgx-h100, dgx-a100, p5.48xlarge, gh200-slingshot, mi300x-oam) or a TOML "
                 "machine file; --gpus-per-node, --link-in, --link-out, --nics-per-node override its facts.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON (seconds, bytes)."),
    ) -> None:
        _run_collective(
            op,
            size,
            _int(ranks, "--ranks"),
            link,
            alpha,
            beta,
            _float(efficiency, "--efficiency"),
            algo,
            _int(nodes, "--nodes"),
            _int(gpus_per_node, "--gpus-per-node"),
            link_in,
            link_out,
            as_json,
            _int(nics_per_node, "--nics-per-node"),
            machine,
        )

    command.__doc__ = f"Predict {op} time per algorithm (time, α and β terms, steps, bytes sent, verdict)."
    command.__name__ = f"predict_{op}"
    return command


for _op in _COLLECTIVE_OPS:
    _cmd = _make_collective_command(_op)
    app.command(_op)(_cmd)
    if "_" in _op:  # the dashed alias (all-reduce); one named like the op itself would hide it from --help
        app.command(_op.replace("_", "-"), hidden=True)(_cmd)


@app.command("overlap")
def overlap(
    compute: str = typer.Option(..., "--compute", help="Compute time c, e.g. 1ms."),
    comm: str = typer.Option(..., "--comm", help="Communication time a of the same work, e.g. 1ms."),
    chunks: Optional[str] = typer.Option(None, "--chunks", help="Chunk count n, or 'best' to search 1..--max-chunks."),
    alpha_chunk: str = typer.Option("0s", "--alpha-chunk", help="Extra cost α_c of each chunk's message, e.g. 10us."),
    max_chunks: str = typer.Option("4096", "--max-chunks", help="Search limit for --chunks best."),
    two_batch: bool = typer.Option(False, "--two-batch", help="Two-batch overlap instead of chunking."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (seconds)."),
) -> None:
    """Chunked pipelining T(n) = c/n + (a/n + α_c) + (n−1)·max(c/n, a/n + α_c), or two-batch overlap."""
    c = model.parse_time(compute)
    a = model.parse_time(comm)
    if two_batch:
        if chunks is not None:
            raise BadInputError("choose --chunks (chunked pipelining) or --two-batch, not both")
        tb = model.two_batch_overlap(c, a)
        payload = {**tb.to_dict(), "no_overlap_s": model.no_overlap_time(c, a)}
        if as_json:
            _emit_json(payload)
            return
        table = _table("two-batch overlap: max(a, c) + min(a, c)/2", ["", "time"])
        table.add_row("no overlap (c + a)", _ft(tb.serial_time_s))
        table.add_row("two-batch overlap", _ft(tb.time_s))
        table.add_row("hidden", _ft(tb.hidden_comm_s))
        _print(table)
        return
    if chunks is None:
        raise BadInputError("give --chunks N (or 'best') with --alpha-chunk, or --two-batch")
    ac = model.parse_time(alpha_chunk)
    searched = chunks.strip().lower() == "best"
    if searched:
        if ac == 0:  # T(n) then falls with every n: "best" would be whatever limit the search stops at
            raise BadInputError("--chunks best needs --alpha-chunk > 0: with no per-chunk cost more chunks always "
                                "win and 'best' is only the search limit; give each chunk's message cost, e.g. "
                                "--alpha-chunk 10us (a link's α: tracekit predict links)")
        result = model.best_chunks(c, a, ac, max_chunks=_int(max_chunks, "--max-chunks"))
    else:
        try:
            n = int(chunks)
        except ValueError:
            raise BadInputError(f"bad --chunks {chunks!r}: expected an integer >= 1 or 'best'") from None
        result = model.chunked_overlap(c, a, n, ac)
    payload = {**result.to_dict(), "no_overlap_s": model.no_overlap_time(c, a), "searched": searched}
    if searched:
        payload["max_chunks"] = _int(max_chunks, "--max-chunks")
    if as_json:
        _emit_json(payload)
        return
    title = f"chunked pipelining, {'best n = ' if searched else 'n = '}{result.chunks}, α_c = {_ft(ac)}"
    table = _table(title, ["", "time"])
    table.add_row("no overlap (c + a)", _ft(result.serial_time_s))
    table.add_row(f"chunked, n = {result.chunks}", _ft(result.time_s))
    table.add_row("exposed beyond compute", _ft(result.exposed_comm_s))
    table.add_row("hidden", _ft(result.hidden_comm_s))
    _print(table)
    if searched and result.chunks == payload["max_chunks"]:
        print(f"note: the best n is the search limit (--max-chunks {result.chunks}): a larger n may be faster still",
              file=sys.stderr)


@app.command("transfer")
def transfer(
    size: str = typer.Option(..., "--bytes", help="Total bytes to ship: 1.342GB = 1.342e9, 1G = 1GiB = 2**30."),
    link: Optional[str] = typer.Option(None, "--link", help=f"Link preset: {', '.join(model.LINK_PRESETS)}."),
    alpha: Optional[str] = typer.Option(None, "--alpha", help="Override α, e.g. 5us."),
    beta: Optional[str] = typer.Option(None, "--beta", help="Override effective β per NIC, e.g. 40GB/s."),
    efficiency: str = typer.Option(
        str(model.DEFAULT_EFFICIENCY), "--efficiency", help="Effective/nominal bandwidth of presets."
    ),
    nics: str = typer.Option("1", "--nics", help="Parallel NICs (multiply β)."),
    layers: str = typer.Option("1", "--layers", help="Layers L shipped one by one as they are computed."),
    layer_compute: Optional[str] = typer.Option(
        None,
        "--layer-compute",
        help="Compute time of one layer; when shorter than a layer's transfer, transfers queue.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (seconds, bytes)."),
) -> None:
    """Exposed time of a bulk transfer (α + bytes/β') vs layer by layer (α + (bytes/L)/β'), β' = nics·β."""
    size_bytes = parse_size(size, whole=False)
    the_link = _resolve_link(link, alpha, beta, _float(efficiency, "--efficiency"))
    s_l = model.parse_time(layer_compute) if layer_compute is not None else None
    r = model.layer_transfer(
        size_bytes, the_link, layers=_int(layers, "--layers"), nics=_int(nics, "--nics"), layer_compute_s=s_l
    )
    if as_json:
        _emit_json({**r.to_dict(), "link": the_link.to_dict()})
        return
    table = _table(
        f"shipping {_fb(size_bytes)} over {r.nics} × {the_link.name} ({_fbw(r.effective_Bps)})",
        ["", "exposed time"],
        _link_caption(the_link),
    )
    table.add_row("bulk, after compute", _ft(r.bulk_s))
    table.add_row(f"layer by layer, L = {r.layers} ({_fb(r.per_layer_bytes)} each)", _ft(r.layered_exposed_s))
    table.add_row("saved", _ft(r.saved_s))
    _print(table)


@app.command("pp-decode")
def pp_decode(
    stages: str = typer.Option(..., "--stages", help="Pipeline stages p."),
    microbatches: str = typer.Option(..., "--microbatches", help="Micro-batches m in flight."),
    stage_time: str = typer.Option(..., "--stage-time", help="Time s of one stage for one micro-batch, e.g. 1ms."),
    transfer_time: str = typer.Option("0s", "--transfer", help="Time x of one inter-stage transfer, e.g. 0.1ms."),
    tokens: str = typer.Option(..., "--tokens", help="Tokens T decoded per sequence."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (seconds)."),
) -> None:
    """Pipeline-parallel decode: token interval, mean time per token (with the fill) and utilisation."""
    r = model.pp_decode(
        _int(stages, "--stages"),
        _int(microbatches, "--microbatches"),
        model.parse_time(stage_time),
        model.parse_time(transfer_time),
        _int(tokens, "--tokens"),
    )
    if as_json:
        _emit_json(r.to_dict())
        return
    table = _table(
        f"decode on {r.stages} stages, {r.microbatches} micro-batches, {r.tokens} tokens",
        ["", "value"],
        "round = max(m·s, p·s + (p−1)·x); total = (T−1)·round + (m−1)·s + p·s + (p−1)·x",
    )
    table.add_row("token interval lower bound p·s + (p−1)·x", _ft(r.token_latency_s))
    table.add_row("steady-state round (time between tokens)", _ft(r.round_s))
    table.add_row("total", _ft(r.total_s))
    table.add_row("mean time per token (incl. fill)", _ft(r.mean_time_per_token_s))
    table.add_row("utilisation", "n/a" if r.utilisation is None else f"{r.utilisation:.1%}")
    table.add_row("steady-state utilisation", "n/a" if r.steady_utilisation is None else f"{r.steady_utilisation:.1%}")
    fill = "n/a" if r.microbatches_to_fill is None else str(r.microbatches_to_fill)
    table.add_row("micro-batches to keep every stage busy", fill)
    _print(table)


@app.command("links")
def links(
    efficiency: str = typer.Option(str(model.DEFAULT_EFFICIENCY), "--efficiency", help="Effective/nominal bandwidth."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (seconds, bytes/s)."),
) -> None:
    """The link presets: nominal and effective β per direction, α, n½."""
    eff = _float(efficiency, "--efficiency")
    rows = [model.link_from_preset(name, efficiency=eff) for name in model.LINK_PRESETS]
    if as_json:
        _emit_json({"links": [l.to_dict() for l in rows]})
        return
    table = _table("link presets (β per GPU per direction)", ["preset", "what", "nominal", "effective β", "α", "n½"])
    for l in rows:
        table.add_row(l.name, l.description, _fbw(l.nominal_Bps), _fbw(l.beta_Bps), _ft(l.alpha_s), _fb(l.n_half_bytes))
    _print(table)
