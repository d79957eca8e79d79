"""alpha_beta_fit and collective_reference — Python analyses.

Reads: collective_samples, collective_instances, instance_locality, group_machine, runs, ranks, collectives

alpha_beta_fit: α, β and n½ fitted per (run, process group, op, group size) — scope ``group``: a
process group of a trace, or one benchmark run (one header and its rows) of a nccl-tests log, so two
runs in one log get two fits, never one over both — and, for traces, per (run, locality class, op,
group size) over the samples of every group of that class (instance_locality: intra_node /
inter_node / unknown) where the class holds two groups or more of that op and size — scope
``locality``, pg_name NULL; only group fits are a reference for verdicts. The fit itself lives in
:func:`tracekit.model.fit_alpha_beta` (a regression that weights relative error, with a robust
outlier rule; the reference's "Fitting α and β"), which also judges it (:func:`tracekit.model.fit.judge_fit`):
``ok`` needs >= 3 distinct sizes spanning the fit's crossover D* and a per-size residual spread
<= 15 %; otherwise ``insufficient`` or ``poor``, and such α/β are never a reference for verdicts.
Warm-up samples (the first call on each communicator) are excluded before fitting. A group with
fewer than two distinct sizes cannot separate α from β at all: NULL parameters.

run_id            VARCHAR  run
source            VARCHAR  'trace' or 'nccl_tests'
scope             VARCHAR  'group' (one process group / benchmark run) or 'locality' (a class's groups pooled)
pg_name           VARCHAR  the process group or benchmark run fitted (NULL for scope 'locality')
locality          VARCHAR  intra_node / inter_node / mixed / unknown (analyses/machine.py) of the group or class
groups            INTEGER  process groups whose samples were fitted (1 for scope 'group')
op                VARCHAR  canonical op
group_size        INTEGER  k
algo              VARCHAR  the algorithm whose coefficients turn (a, b) into (α, β)
n_samples         INTEGER  samples offered (warm-up excluded)
n_used            INTEGER  samples kept by the fit
n_dropped         INTEGER  samples the robust rule (or zero size) dropped
n_warmup          INTEGER  warm-up samples excluded before fitting
n_sizes           INTEGER  distinct sizes among the samples used (offered, when there is no fit)
alpha_s           DOUBLE   α, seconds per message/step (per ring step for ring algorithms)
alpha_se_s        DOUBLE   standard error of α, s
alpha_lo_s        DOUBLE   95 % interval of α, low end, s
alpha_hi_s        DOUBLE   95 % interval of α, high end, s
fixed_latency_s   DOUBLE   the collective's fixed latency A·α = a (steps × α), s
beta_Bps          DOUBLE   β, bytes/s per direction
beta_gbps         DOUBLE   β in GB/s (1e9)
beta_se_Bps       DOUBLE   standard error of β (delta method), bytes/s
beta_lo_Bps       DOUBLE   95 % interval of β, low end, bytes/s
beta_hi_Bps       DOUBLE   95 % interval of β, high end, bytes/s (NULL: unbounded)
n_half_bytes      DOUBLE   n½ = α·β, bytes: the link's half-bandwidth message size
crossover_bytes   DOUBLE   D* = A·α·β/B = a/b, bytes: this collective's latency/bandwidth boundary
a_s               DOUBLE   fitted intercept a of t = a + b·bytes, s
b_s_per_byte      DOUBLE   fitted slope b, s/byte
residual_spread   DOUBLE   RMS of the relative residuals (t − model)/t of the used samples
size_spread       DOUBLE   RMS of the relative residuals of the per-size medians (judged)
residual_max_abs  DOUBLE   largest |relative residual| among used samples
min_size_bytes    BIGINT   smallest size used (offered, when there is no fit)
max_size_bytes    BIGINT   largest size used (offered, when there is no fit)
status            VARCHAR  'ok', 'insufficient' or 'poor'
status_reason     VARCHAR  why not ok, in words (NULL when ok)
split             BOOLEAN  β fitted on the sizes >= 4·D* and α on those below (tracekit.model.fit), else one line
alpha_range_min_bytes BIGINT smallest size α was fitted on
alpha_range_max_bytes BIGINT largest size α was fitted on
beta_range_min_bytes  BIGINT smallest size β was fitted on
beta_range_max_bytes  BIGINT largest size β was fitted on

collective_reference: for each (run, process group, op, group size) of collective_instances,
the α–β reference its verdicts and efficiency use, chosen in this order (issues 15 and 18):

1. the user's: ``--link PRESET`` (DuckDB variable tk_link) or α/β given (variables tk_alpha,
   tk_beta, seconds and bytes/s) — ref_kind ``link`` / ``user``;
2. the ``ok`` fit of the instance's own process group (scope ``group``: >= 3 distinct sizes spanning
   its crossover, within the spread bound) — ref_kind ``own_fit``, or ``sweep`` / ``nccl_tests``
   when the run is a calibration run (its own benchmark run's fit);
3. the newest ``ok`` fit of a calibration run (a ``collect sweep`` run or a nccl-tests log) on the
   same machine: same backend and device name and, when both record hosts, the group's hosts
   among the calibration run's (a log's hosts: its "Using devices" lines, group_machine); a
   calibration run's own fit first for itself. Only a fit of a group of the same locality class
   and, where both are known, the same ranks per host and GPU model (:func:`machine_compatible`):
   a single-node NVLink fit is never the reference of a group that crosses the network. Same op
   and group size, else the same op at the nearest group size within that class (said in
   ref_note); never another op's fit (α per step depends on the algorithm and protocol NCCL picks
   for the op) — ref_kind ``sweep`` / ``nccl_tests``;
4. a preset from the device and topology: the group's ranks on one host → that device's intra-node
   link (tracekit.model.device_presets: NVLink, xGMI or PCIe; a CPU gloo run → loopback_gloo);
   across hosts (class inter_node or mixed) → the typical NIC preset of such systems, shared by the
   node's GPUs over ``tk_nics_per_node`` NICs when set, else the NICs per node the log's NCCL INFO
   NET lines name (tracekit.model.network_link); this preset stands for the machine model until
   tracekit.model has NCCL's per-algorithm one, and ref_note says so. Hosts not recorded: a group
   of <= 8 ranks is taken as one host (said in ref_note), a larger one has no preset —
   ref_kind ``preset``;
5. none: ref_kind NULL and no_model_reason says why.

A group's own fit (2) judges instances by a line fitted to them: its efficiency measures their
scatter about it, not the hardware (ref_note says so). Separately, the *link* for efficiency
against the hardware: the user's link (1), else the preset of (4) — whatever the verdict's
reference is — so a slow link still shows in ``efficiency_link``.

run_id           VARCHAR  run
pg_name          VARCHAR  process group
op               VARCHAR  canonical op
group_size       INTEGER  k
locality         VARCHAR  intra_node / inter_node / mixed / unknown: the group's class (instance_locality)
hosts            VARCHAR  distinct hosts of the ranks that recorded the group, comma-separated ('' unknown)
ref_kind         VARCHAR  link / user / sweep / nccl_tests / preset / own_fit, NULL for none
reference        VARCHAR  the reference in words (preset name, or "sweep <run>: all_reduce k=2 fit")
ref_run_id       VARCHAR  run whose fit is used (sweep / nccl_tests / own_fit)
ref_algo         VARCHAR  algorithm the fit's α, β were derived through (NULL for links: the
                          instance's modelled algorithm applies)
ref_alpha_s      DOUBLE   α, s
ref_beta_Bps     DOUBLE   β, bytes/s per direction
ref_note         VARCHAR  fallbacks and assumptions made in choosing it
no_model_reason  VARCHAR  why there is no reference (NULL when there is one)
link             VARCHAR  link for efficiency against the hardware (user's or preset), or NULL
link_alpha_s     DOUBLE   its α, s
link_beta_Bps    DOUBLE   its effective β, bytes/s
link_note        VARCHAR  how it was chosen
"""

from __future__ import annotations

import json
from collections import defaultdict

import pyarrow as pa

from tracekit.errors import TracekitError


SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("source", pa.string()), ("scope", pa.string()), ("pg_name", pa.string()),
        ("locality", pa.string()), ("groups", pa.int32()), ("op", pa.string()), ("group_size", pa.int32()),
        ("algo", pa.string()), ("n_samples", pa.int32()), ("n_used", pa.int32()), ("n_dropped", pa.int32()),
        ("n_warmup", pa.int32()), ("n_sizes", pa.int32()), ("alpha_s", pa.float64()), ("alpha_se_s", pa.float64()),
        ("alpha_lo_s", pa.float64()), ("alpha_hi_s", pa.float64()), ("fixed_latency_s", pa.float64()),
        ("beta_Bps", pa.float64()), ("beta_gbps", pa.float64()), ("beta_se_Bps", pa.float64()),
        ("beta_lo_Bps", pa.float64()), ("beta_hi_Bps", pa.float64()),
        ("n_half_bytes", pa.float64()), ("crossover_bytes", pa.float64()), ("a_s", pa.float64()),
        ("b_s_per_byte", pa.float64()), ("residual_spread", pa.float64()), ("size_spread", pa.float64()),
        ("residual_max_abs", pa.float64()), ("min_size_bytes", pa.int64()), ("max_size_bytes", pa.int64()),
        ("status", pa.string()), ("status_reason", pa.string()),
        ("split", pa.bool_()), ("alpha_range_min_bytes", pa.int64()), ("alpha_range_max_bytes", pa.int64()),
        ("beta_range_min_bytes", pa.int64()), ("beta_range_max_bytes", pa.int64()),
    ]
)

REFERENCE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("pg_name", pa.string()), ("op", pa.string()), ("group_size", pa.int32()),
        ("locality", pa.string()), ("hosts", pa.string()), ("ref_kind", pa.string()), ("reference", pa.string()), ("ref_run_id", pa.string()),
        ("ref_algo", pa.string()), ("ref_alpha_s", pa.float64()), ("ref_beta_Bps", pa.float64()),
        ("ref_note", pa.string()), ("no_model_reason", pa.string()), ("link", pa.string()),
        ("link_alpha_s", pa.float64()), ("link_beta_Bps", pa.float64()), ("link_note", pa.string()),
    ]
)

ASSUMED_ONE_HOST_MAX = 8
"""A group of at most this many ranks whose hosts are not recorded is taken as one host (8 GPUs per node)."""


def fit_rows(samples: list[tuple], localities: dict | None = None) -> list[dict]:
    """samples: (run_id, source, pg_name, op, group_size, algo, size_bytes, time_ns, warmup, seq);
    localities: (run_id, pg_name) → locality class (default unknown) → the table rows: one fit per
    (run, group, op, k), then per (run, class, op, k) over a trace's groups where a class has >= 2."""
    loc = localities or {}
    groups: dict = defaultdict(list)
    classes: dict = defaultdict(list)
    for s in samples:
        c = loc.get((s[0], s[2]), "unknown")
        groups[(s[0], s[1], s[2], s[3], s[4])].append(s)
        if s[1] == "trace":
            classes[(s[0], s[1], c, s[3], s[4])].append(s)
    order = lambda kv: tuple(str(x) for x in kv[0])  # noqa: E731
    todo = [(lst, op, k, dict(run_id=rid, source=src, scope="group", pg_name=pg,
                              locality=loc.get((rid, pg), "unknown"), groups=1))
            for (rid, src, pg, op, k), lst in sorted(groups.items(), key=order)]
    for (rid, src, c, op, k), lst in sorted(classes.items(), key=order):
        n = len({s[2] for s in lst})
        if n >= 2:
            todo.append((lst, op, k, dict(run_id=rid, source=src, scope="locality", pg_name=None, locality=c, groups=n)))
    return _fit_all(todo)


def _fit_all(todo: list) -> list[dict]:
    """The rows of alpha_beta_fit: each ``(samples, op, k, row)`` of ``todo``, ``row`` (its keys)
    completed with the fit of the samples; the fits in one :func:`tracekit.model.fit_alpha_beta_many`
    (the same fits as one by one)."""
    from tracekit.model import ALGORITHMS
    from tracekit.model import fit_alpha_beta_many

    rows, problems, fitted = [], [], []
    for lst, op, k, row in todo:
        # a total order (group, seq, then size and time): the regression's float sums must not depend on row order
        lst = sorted(lst, key=lambda s: (str(s[2]), s[9] if s[9] is not None else 0, s[6] if s[6] is not None else 0,
                                         s[7] or 0))
        use = [s for s in lst if not s[8]]
        algos = ALGORITHMS.get(op)
        algo = algos[0] if algos else None
        sizes = [s[6] for s in use]
        row.update(op=op, group_size=k, algo=algo, n_samples=len(use), n_used=0, n_dropped=0,
                   n_warmup=len(lst) - len(use), n_sizes=len(set(sizes)), min_size_bytes=min(sizes, default=None),
                   max_size_bytes=max(sizes, default=None))
        rows.append(row)
        if algo is None:
            row.update(status="insufficient", status_reason=f"no model for {op}")
        elif k == 1:
            row.update(status="insufficient", status_reason="1 rank: the collective moves no data between ranks")
        else:
            problems.append(([float(x) for x in sizes], [s[7] * 1e-9 for s in use], op, int(k), algo))
            fitted.append(row)
    for row, f in zip(fitted, fit_alpha_beta_many(problems, warmup_first=False)):
        if isinstance(f, TracekitError):
            row.update(status="insufficient", status_reason=str(f))
            continue
        row.update(n_used=f.n_used, n_dropped=f.n_dropped, n_sizes=f.n_sizes, alpha_s=f.alpha_s,
                   alpha_se_s=f.alpha_se_s, alpha_lo_s=f.alpha_ci_s[0], alpha_hi_s=f.alpha_ci_s[1],
                   fixed_latency_s=f.a_s, beta_Bps=f.beta_Bps, beta_gbps=f.beta_Bps / 1e9,
                   beta_se_Bps=f.beta_se_Bps, beta_lo_Bps=f.beta_ci_Bps[0], beta_hi_Bps=f.beta_ci_Bps[1],
                   n_half_bytes=f.n_half_bytes, crossover_bytes=f.crossover_bytes, a_s=f.a_s,
                   b_s_per_byte=f.b_s_per_byte, residual_spread=f.residual_spread,
                   size_spread=f.size_spread, residual_max_abs=f.residual_max_abs,
                   min_size_bytes=f.min_size_bytes, max_size_bytes=f.max_size_bytes,
                   status=f.status, status_reason=f.status_reason or None, split=f.split,
                   alpha_range_min_bytes=f.alpha_range_bytes[0], alpha_range_max_bytes=f.alpha_range_bytes[1],
                   beta_range_min_bytes=f.beta_range_bytes[0], beta_range_max_bytes=f.beta_range_bytes[1])
    return rows


def _var(con, name: str):
    try:
        return con.execute(f"SELECT getvariable('{name}')").fetchone()[0]
    except Exception:  # noqa: BLE001 - an unset variable reads as NULL; anything else: treat as unset
        return None


def bench_groups(con) -> dict:
    """(run_id, pg_name) → {device, hosts} of each benchmark run of a nccl-tests log, from the run
    config's ``groups`` (tracekit.ingest.nccl_tests): its one device name (None when the header
    names several or none) and its host names. Empty for trace runs."""
    out = {}
    for rid, config in con.execute("SELECT run_id, config FROM runs WHERE source = 'nccl_tests'").fetchall():
        try:
            groups = json.loads(config or "{}").get("groups") or []
        except (ValueError, AttributeError):
            continue
        for g in groups:
            if not isinstance(g, dict) or not g.get("pg_name"):
                continue
            devices = sorted(set(g.get("devices") or []))
            out[(rid, g["pg_name"])] = dict(device=devices[0] if len(devices) == 1 else None,
                                            hosts=sorted(set(g.get("hosts") or [])))
    return out


def reference_rows(con, localities: dict | None = None) -> list[dict]:
    """The rows of ``collective_reference`` (columns and the order of choice in the module docstring);
    ``localities``: :func:`group_localities` when the caller has it already."""
    from tracekit.model import custom_link, device_presets, link_from_preset, network_link
    from tracekit.model.multinode import RING_OPS, ring_bandwidth_across_nodes

    user_link = _var(con, "tk_link")
    user_alpha, user_beta = _var(con, "tk_alpha"), _var(con, "tk_beta")
    nics = _var(con, "tk_nics_per_node")
    runs = {
        r[0]: dict(created=r[1], source=r[2], workload=r[3], backend=r[4], device=r[5])
        for r in con.execute("SELECT run_id, created_at, source, workload, backend, device_name FROM runs").fetchall()
    }
    run_hosts: dict = defaultdict(set)
    for rid, host in con.execute("SELECT DISTINCT run_id, host FROM ranks WHERE host IS NOT NULL").fetchall():
        run_hosts[rid].add(host)
    for rid, hs in con.execute("SELECT run_id, hosts FROM group_machine WHERE hosts <> ''").fetchall():
        run_hosts[rid].update(hs.split(","))  # nccl-tests logs: the hosts of their rank lines
    bench = bench_groups(con)  # nccl-tests logs: each benchmark run's own device and hosts
    fits: dict = defaultdict(dict)  # run_id → {(pg, op, k): (α, β, algo, locality, n_used)}
    for rid, pg, op, k, a, b, algo, c, n in con.execute(
        "SELECT run_id, pg_name, op, group_size, alpha_s, beta_Bps, algo, locality, n_used FROM alpha_beta_fit "
        "WHERE status = 'ok' AND scope = 'group'"
    ).fetchall():
        fits[rid][(pg, op, k)] = (a, b, algo, c, n)
    if localities is None:
        localities = group_localities(con)
    machine = group_shapes(con)
    # the groups to judge, with the hosts and rank count of the ranks that recorded them
    groups = con.execute(
        """
        WITH g AS (SELECT DISTINCT run_id, pg_name, op, group_size FROM collective_instances WHERE op IS NOT NULL),
        h AS (
            SELECT c.run_id, c.pg_name, count(DISTINCT c.rank) AS ranks_seen,
                   count(DISTINCT k.host) AS n_hosts, count(*) FILTER (WHERE k.host IS NULL) AS no_host,
                   string_agg(DISTINCT k.host, ',' ORDER BY k.host) AS hosts,
                   max(per_host.n) AS ranks_per_host
            FROM collectives c LEFT JOIN ranks k USING (run_id, rank)
            LEFT JOIN (SELECT run_id, host, count(*) AS n FROM ranks GROUP BY ALL) per_host
                   ON per_host.run_id = c.run_id AND per_host.host = k.host
            GROUP BY ALL
        )
        SELECT g.run_id, g.pg_name, g.op, g.group_size, h.ranks_seen, h.n_hosts, h.no_host, h.hosts, h.ranks_per_host
        FROM g LEFT JOIN h USING (run_id, pg_name) ORDER BY ALL
        """
    ).fetchall()

    calib = sorted(
        (rid for rid, r in runs.items() if r["workload"] == "sweep" or r["source"] == "nccl_tests"),
        key=lambda rid: str(runs[rid]["created"]), reverse=True,
    )

    def pick_fit(rid, op, k, locality, shape):
        """(α, β, algo, note) from run rid's ok group fits for (op, k), with the fallbacks of the docstring."""
        # same op only: α per step is what the fit's algorithm and protocol make of the link (the
        # superbench A100 log: 12.4 µs per pairwise all_to_all step, ~2.5 µs per ring all_reduce step),
        # so another op's fit would misjudge this one; without one the preset comes next.
        # Same locality class and ranks per host only (machine_compatible): a single-node NVLink fit
        # says nothing of a group that crosses the network, nor 1 rank per node of 8.
        # ref_algo (the fit's algorithm) only where the fit is of this very k: at another k the α, β
        # are used as the link's, through the instance's own modelled algorithm (NULL)
        fs = fits.get(rid) or {}
        mop = "send" if op == "recv" else op
        cands = sorted(((abs(kk - k), -(f[4] or 0), str(g)), (g, kk))
                       for (g, o, kk), f in fs.items()
                       if o == mop and machine_compatible(shape, machine.get((rid, g)), locality, f[3]))
        if not cands:
            return None
        g, kk = cands[0][1]
        a, b, algo, c, _ = fs[(g, mop, kk)]
        notes = []
        if kk != k:
            notes.insert(0, f"no ok {op} k={k} fit there: nearest group size of the same class, k={kk}")
            algo = None
        return a, b, algo, "; ".join(notes)

    from tracekit.model import ALGORITHMS

    out = []
    for rid, pg, op, k, ranks_seen, n_hosts, no_host, hosts, per_host in groups:
        group_nics = None  # NICs per node the group's own log reports (NCCL INFO NET lines)
        run = runs.get(rid, {})
        g = bench.get((rid, pg))
        if g is not None:  # a benchmark run of a log: its header's device and hosts, not the log's first
            run = dict(run, device=g["device"] or run.get("device"))
            if g["hosts"]:
                n_hosts, no_host, ranks_seen, hosts = len(g["hosts"]), 0, k, ",".join(g["hosts"])
                per_host = -(-(k or 1) // len(g["hosts"]))
        locality = localities.get((rid, pg), "unknown")
        shape = machine.get((rid, pg))
        if shape and shape["hosts"]:  # the machine the group ran on (group_machine): its hosts
            n_hosts, hosts = len(shape["hosts"]), ",".join(sorted(shape["hosts"]))
            if nics is None and shape["nics_per_node"]:
                group_nics = shape["nics_per_node"]
        row = dict(run_id=rid, pg_name=pg, op=op, group_size=k, locality=locality, hosts=hosts or "")
        if ("send" if op == "recv" else op) not in ALGORITHMS:
            row["no_model_reason"] = f"the model has no algorithm for {op}"
            out.append(row)
            continue
        if k == 1:  # nothing crosses a link: no α, no β to judge it by
            row["no_model_reason"] = "1 rank: the collective moves no data between ranks"
            out.append(row)
            continue
        # topology of the group: its locality class, else the hosts of the ranks that recorded it
        if locality in ("inter_node", "mixed"):
            topo, topo_note = "multi", ""
            n_hosts = max(n_hosts or 0, 2)
        elif locality == "intra_node":
            topo, topo_note = "one", ""
        elif n_hosts and (n_hosts > 1):
            topo, topo_note = "multi", ""
        elif n_hosts == 1 and not no_host and (ranks_seen or 0) >= (k or 0):
            topo, topo_note = "one", ""
        elif n_hosts == 1 and (k or 0) <= ASSUMED_ONE_HOST_MAX:
            topo, topo_note = "one", f"hosts of only {ranks_seen} of {k} ranks recorded; taken as one host"
        elif (k or 0) <= ASSUMED_ONE_HOST_MAX:
            topo, topo_note = "one", f"hosts not recorded; a group of {k} <= {ASSUMED_ONE_HOST_MAX} ranks taken as one host"
        else:
            topo, topo_note = None, f"hosts not recorded and the group has {k} > {ASSUMED_ONE_HOST_MAX} ranks"
        # the hardware link: user's, else the preset of device and topology
        link = link_note = None
        if user_link:
            link = link_from_preset(user_link)
            link_note = f"--link {user_link}"
        elif user_alpha is not None and user_beta is not None:
            link = custom_link(float(user_alpha), float(user_beta), name="user α/β")
            link_note = "α/β given by the user"
        else:
            dev = device_presets(run.get("device"))
            if dev is None and run.get("backend") == "gloo" and topo == "one":
                link, link_note = link_from_preset("loopback_gloo"), "CPU gloo run on one host"
            elif dev is not None and topo == "one":
                link = link_from_preset(dev[0])
                link_note = f"{run.get('device')}: intra-node {dev[0]}" + (f" ({topo_note})" if topo_note else "")
            elif dev is not None and topo == "multi":
                gpn = int(per_host or 1)
                use_nics = nics if nics is not None else group_nics
                link = network_link(dev[1], int(use_nics) if use_nics is not None else None, gpn)
                link_note = (f"group across {n_hosts} hosts: {dev[1]} assumed (typical NIC of {run.get('device')} "
                             f"systems; --link to set)" + ("" if use_nics is None else
                                                          f", {int(use_nics)} NICs per node" +
                                                          (" (NCCL INFO NET lines)" if nics is None else "")))
                g_grp = (shape or {}).get("ranks_per_host") or 0  # the group's own ranks on each host
                if op in RING_OPS and locality == "mixed" and g_grp > 1:
                    # a group with several ranks on each node runs a ring op as rings over the nodes, one per
                    # NIC local to its GPUs, each through the intra-node link (tracekit.model.multinode,
                    # NCCL's rings): β = its NICs × β_NIC capped by the intra-node link, not one GPU's share
                    # of the node's NICs (which an all-to-all, a send, or a one-rank-per-node group gets)
                    grp_nics = None if use_nics is None else max(1, round(int(use_nics) * g_grp / max(gpn, g_grp)))
                    beta, words = ring_bandwidth_across_nodes(g_grp, link_from_preset(dev[1]), grp_nics,
                                                              link_from_preset(dev[0]))
                    link = custom_link(link.alpha_s, beta, name=dev[1])
                    link_note += f"; {op} as rings over the nodes: {words}"
            else:
                why = []
                if dev is None:
                    why.append(f"no preset for device {run.get('device')!r}" if run.get("device") else
                               f"no device recorded (backend {run.get('backend')})")
                if topo is None:
                    why.append(topo_note)
                elif topo == "multi" and dev is None:
                    why.append(f"group across {n_hosts} hosts")
                link_note = "; ".join(why)
        if link is not None:
            row.update(link=link.name, link_alpha_s=link.alpha_s, link_beta_Bps=link.beta_Bps, link_note=link_note)
        # the verdicts' reference
        if user_link or (user_alpha is not None and user_beta is not None):
            row.update(ref_kind="link" if user_link else "user", reference=link.name, ref_alpha_s=link.alpha_s,
                       ref_beta_Bps=link.beta_Bps, ref_note=link_note)
            out.append(row)
            continue
        chosen = None
        own = fits.get(rid, {}).get((pg, "send" if op == "recv" else op, k))
        if own is not None:
            kind = ("nccl_tests" if run.get("source") == "nccl_tests" else "sweep") if rid in calib else "own_fit"
            note = (f"this calibration run's own fit (group {pg})" if rid in calib else
                    "this group's own ok fit: efficiency measures scatter about it, not the hardware (vs link does)")
            chosen = dict(ref_kind=kind, reference=f"{kind} run {rid}" if rid in calib else f"own fit of group {pg}",
                          ref_run_id=rid, ref_algo=own[2], ref_alpha_s=own[0], ref_beta_Bps=own[1], ref_note=note)
        mine = runs.get(rid, {})
        my_hosts = set((hosts or "").split(",")) - {""}
        # a calibration run's own fits first for itself (another of its benchmark runs), then the
        # newest other calibration run of the same machine
        order = ([rid] if rid in calib else []) + [c for c in calib if c != rid]
        for c in ([] if chosen else order):
            cr = runs[c]
            if c != rid:
                if cr["backend"] != mine.get("backend") or cr["device"] != mine.get("device"):
                    continue
                if my_hosts and run_hosts.get(c) and not my_hosts <= run_hosts[c]:
                    continue
            got = pick_fit(c, op, k, locality, shape)
            if got:
                kind = "nccl_tests" if cr["source"] == "nccl_tests" else "sweep"
                notes = [got[3]] if got[3] else []
                if c == rid:
                    notes.append("this calibration run's fit of another of its groups")
                elif not (my_hosts and run_hosts.get(c)):
                    notes.append("hosts not recorded: matched on backend and device only")
                chosen = dict(ref_kind=kind, reference=f"{kind} run {c}", ref_run_id=c, ref_algo=got[2],
                              ref_alpha_s=got[0], ref_beta_Bps=got[1], ref_note="; ".join(notes) or None)
                break
        if chosen is None and link is not None:
            # the machine model: until tracekit.model has NCCL's own per-algorithm model, the
            # device/topology preset (its note says which and why)
            chosen = dict(ref_kind="preset", reference=link.name, ref_alpha_s=link.alpha_s,
                          ref_beta_Bps=link.beta_Bps,
                          ref_note="; ".join(x for x in (
                              f"no ok {op} fit of the same class on this machine ({locality}, "
                              + (f"{shape['ranks_per_host']} rank(s) per host" if shape['ranks_per_host']
                                 else "ranks per host unknown" if not shape["hosts"]
                                 else "uneven ranks per host")
                              + "): preset of the machine model" if shape else None, link_note) if x))
        if chosen is None:
            reasons = ["no --link", "no ok sweep/nccl-tests fit from this machine"]
            if link_note:
                reasons.append(link_note)
            reasons.append("no ok fit of its own group")
            chosen = dict(no_model_reason="; ".join(reasons))
        row.update(chosen)
        out.append(row)
    return out


def create_reference(con, localities: dict | None = None) -> None:
    """(Re)create the table ``collective_reference`` on ``con`` (after changing tk_alpha/tk_beta/tk_nics_per_node)."""
    from tracekit.analyses import create_table_from_rows

    create_table_from_rows(con, "collective_reference", REFERENCE_SCHEMA, reference_rows(con, localities))


def group_shapes(con) -> dict:
    """(run_id, pg_name) → {hosts, ranks_per_host, max_ranks_per_host, nics_per_node, gpu, locality}
    of each group (the analysis group_machine)."""
    return {(r[0], r[1]): dict(hosts=set((r[2] or "").split(",")) - {""}, ranks_per_host=r[3],
                               max_ranks_per_host=r[4], nics_per_node=r[5], gpu=r[6], locality=r[7])
            for r in con.execute("SELECT run_id, pg_name, hosts, ranks_per_host, max_ranks_per_host, nics_per_node, "
                                 "gpu, locality FROM group_machine").fetchall()}


def machine_compatible(shape: dict | None, fit_shape: dict | None, locality: str, fit_locality: str) -> bool:
    """Whether a fit of a group shaped ``fit_shape`` may be the reference of a group shaped ``shape``
    (both :func:`group_shapes` values, None when unknown) of class ``locality``: the same locality
    class, and, where both are known, the same ranks per host and the same GPU model. k may differ
    (the caller takes the nearest), but only within these."""
    if fit_locality != locality:
        return False
    if shape is None or fit_shape is None:
        return True
    for key in ("ranks_per_host", "gpu"):
        if shape.get(key) is not None and fit_shape.get(key) is not None and shape[key] != fit_shape[key]:
            return False
    return True


def group_localities(con) -> dict:
    """(run_id, pg_name) → the group's locality class (the most frequent over its instances)."""
    return {(r, g): c for r, g, c in con.execute(
        "SELECT run_id, pg_name, mode(locality) FROM instance_locality GROUP BY ALL").fetchall()}


def create(con) -> None:
    """Create the tables ``alpha_beta_fit`` and ``collective_reference`` on ``con``."""
    samples = con.execute(
        "SELECT run_id, source, pg_name, op, group_size, algo, size_bytes, time_ns, warmup, seq FROM collective_samples"
    ).fetchall()
    from tracekit.analyses import create_table_from_rows

    localities = group_localities(con)
    create_table_from_rows(con, "alpha_beta_fit", SCHEMA, fit_rows(samples, localities))
    create_reference(con, localities)
