"""Run folders: where a collector or ``tracekit.profile`` writes one run's traces and run_config.json.

A run folder is ``<out>/<workload>-YYYYmmdd-HHMMSS-xxxx`` (default out: ./tracekit-runs); its name
becomes the run id in the store. A multi-node ``tracekit profile`` shares one run folder between its
nodes: :func:`detect_launcher`, :func:`join_run_dir`, :func:`wait_for_ranks` (below).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import BadInputError, TracekitError
from tracekit.store import RUN_ID_RE


def new_run_id(workload: str, now: _dt.datetime | None = None) -> str:
    """``<workload>-YYYYmmdd-HHMMSS-xxxx`` (local time, 4 random hex digits)."""
    now = now or _dt.datetime.now()
    return f"{workload}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def new_run_dir(out: str | os.PathLike | None, workload: str) -> Path:
    """Create and return a fresh run folder ``<out>/<run_id>`` (default out: ./tracekit-runs)."""
    base = Path(out) if out is not None else Path("tracekit-runs")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"{base}: cannot create the output folder ({exc.strerror or exc})") from None
    for _ in range(100):
        d = base / new_run_id(workload)
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
        except OSError as exc:
            raise BadInputError(f"{d}: cannot create the run folder ({exc.strerror or exc})") from None
    raise TracekitError(f"{base}: could not find a free run folder name")


# --------------------------------------------------------------------------- multi-node jobs
#
# A multi-node job runs one `tracekit profile` per node (torchrun --nnodes N --node-rank R on every
# node) or per task (srun tracekit profile -- python train.py): a *launcher*. Every launcher writes
# into one shared run folder, <out>/<run_id>, on a filesystem all nodes see: the rank traces
# (rank{r}.pt.trace.json.gz, global rank: one writer each, claimed in logs/rank{r}.claim), the agents'
# status files (logs/agent.<host>.<pid>.json), and at its end logs/node{i}.json (i: the launcher's
# index). Launcher 0 waits until every expected rank has finished (or every launcher has ended, or a
# timeout), then ingests; the others only write. All writes are a temporary name and a rename.

_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--module", "-m", "--run-path", "--run_path"}


@dataclass(frozen=True)
class Launcher:
    """One ``tracekit profile`` of a multi-node job.

    ``index``: torchrun's ``--node-rank`` (or ``$PET_NODE_RANK``), else ``$SLURM_PROCID``;
    ``count``: torchrun's ``--nnodes`` (None for an elastic range ``MIN:MAX``), else ``$SLURM_NTASKS``;
    ``source``: where they came from; ``job_key``: the same string on every launcher of one job
    (rendezvous endpoint and id, or the SLURM job and step); ``default_run_id``: the run id every
    launcher derives alike when ``--run-id`` is not given; ``slurm_ranks``: the command is no
    launcher (srun runs it once per rank), so its rank and world size are the task's.
    """

    index: int
    count: int | None
    source: str
    job_key: str
    default_run_id: str
    slurm_ranks: bool = False


def _torchrun_args(command: list[str]) -> tuple[list[str], list[str]] | None:
    """(torchrun's own arguments, the script and its arguments) when `command` runs torchrun, else None."""
    if not command:
        return None
    name = os.path.basename(command[0])
    if name in ("torchrun", "torchrun.exe"):
        rest = command[1:]
    else:
        for i in range(len(command) - 1):
            if command[i] == "-m" and command[i + 1] in ("torch.distributed.run", "torch.distributed.launch"):
                rest = command[i + 2 :]
                break
        else:
            return None
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        i += 1 if "=" in rest[i] or rest[i] in _TORCHRUN_FLAGS else 2
    return rest[:i], rest[i:]


def _opt(args: list[str], *names: str) -> str | None:
    val = None
    for i, tok in enumerate(args):
        key, eq, v = tok.partition("=")
        if key in names:
            val = v if eq else (args[i + 1] if i + 1 < len(args) else None)
    return val


def _int(text, what: str) -> int:
    try:
        v = int(str(text))
    except ValueError:
        raise BadInputError(f"{what} must be an integer, got {text!r}") from None
    if v < 0:
        raise BadInputError(f"{what} must be >= 0, got {v}")
    return v


def detect_launcher(command: list[str], env: dict | None = None) -> Launcher | None:
    """The multi-node launcher this ``tracekit profile`` is (see :class:`Launcher`), or None for a
    single-node job (torchrun without ``--nnodes`` > 1 and no ``SLURM_NTASKS`` > 1).

    Raises BadInputError for a node rank outside 0..nnodes−1 or a non-integer value.
    """
    env = os.environ if env is None else env
    parts = _torchrun_args(command)
    if parts is not None:
        targs, script = parts
        if "--standalone" in targs:
            return None
        nnodes = _opt(targs, "--nnodes") or env.get("PET_NNODES")
        if not nnodes:
            return None
        lo, _, hi = str(nnodes).partition(":")
        most = _int(hi or lo, "torchrun --nnodes")
        if most <= 1:
            return None
        count = None if hi and hi != lo else most
        rank_text = _opt(targs, "--node-rank", "--node_rank") or env.get("PET_NODE_RANK")
        if rank_text is None:
            raise BadInputError("torchrun --nnodes > 1 under tracekit profile: give each node its --node-rank "
                                "(node 0 ingests the run)")
        index = _int(rank_text, "torchrun --node-rank")
        if count is not None and index >= count:
            raise BadInputError(f"torchrun --node-rank {index} is not below --nnodes {count}")
        endpoint = (_opt(targs, "--rdzv-endpoint", "--rdzv_endpoint") or env.get("PET_RDZV_ENDPOINT")
                    or ":".join(filter(None, [_opt(targs, "--master-addr", "--master_addr"),
                                              _opt(targs, "--master-port", "--master_port")])) or "(default endpoint)")
        rdzv_id = _opt(targs, "--rdzv-id", "--rdzv_id") or env.get("PET_RDZV_ID") or "none"
        key = f"torchrun {endpoint} id={rdzv_id} nnodes={nnodes}"
        if rdzv_id != "none" and RUN_ID_RE.fullmatch(f"external-{rdzv_id}"):
            rid = f"external-{rdzv_id}"
        else:  # the same on every node: the rendezvous and the script's command line
            digest = hashlib.sha1("\0".join([key, *script]).encode()).hexdigest()[:8]
            rid = f"external-torchrun-{digest}"
        return Launcher(index, count, "torchrun --node-rank", key, rid)
    ntasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    procid = env.get("SLURM_PROCID")
    if ntasks is None or procid is None or _int(ntasks, "SLURM_NTASKS") <= 1:
        return None
    count, index = _int(ntasks, "SLURM_NTASKS"), _int(procid, "SLURM_PROCID")
    if index >= count:
        raise BadInputError(f"SLURM_PROCID {index} is not below SLURM_NTASKS {count}")
    job, step = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0", env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    tag = f"{job}.{step}" if step else job
    return Launcher(index, count, "SLURM_PROCID", f"slurm job {tag}", f"external-slurm{tag}", slurm_ranks=True)


def slurm_rank_env(env: dict) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK (and LOCAL_WORLD_SIZE) from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
    (SLURM_NTASKS_PER_NODE), for those the environment does not set already: what ``init_process_group``'s
    env:// and most training scripts read, under srun, which sets only the SLURM_* names."""
    pairs = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID",
             "LOCAL_WORLD_SIZE": "SLURM_NTASKS_PER_NODE"}
    return {k: env[s] for k, s in pairs.items() if k not in env and env.get(s, "").isdigit()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{secrets.token_hex(2)}")
    tmp.write_text(text)
    os.replace(tmp, path)


def join_run_dir(out: str | os.PathLike | None, run_id: str, launcher: Launcher) -> Path:
    """Create or join the shared run folder ``<out>/<run_id>`` of a multi-node job and claim this
    launcher's index in it.

    The first launcher to arrive writes logs/job.json (the job key; written under a temporary name
    and hard-linked into place, so exactly one wins); the others check it. Raises BadInputError when
    the folder belongs to another job, or this launcher's index already ran there (an earlier run of
    the same job: give every node the same new ``--run-id``).
    """
    import json

    from tracekit.store import check_run_id

    check_run_id(run_id)
    d = (Path(out) if out is not None else Path("tracekit-runs")) / run_id
    logs = d / "logs"
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInputError(f"{d}: cannot create the run folder ({exc.strerror or exc})") from None
    job = logs / "job.json"
    tmp = logs / f"job.json.tmp{os.getpid()}.{secrets.token_hex(2)}"
    tmp.write_text(json.dumps({"job_key": launcher.job_key, "launchers": launcher.count}) + "\n")
    try:
        os.link(tmp, job)
    except FileExistsError:
        try:
            theirs = json.loads(job.read_text()).get("job_key")
        except (OSError, ValueError, AttributeError):
            theirs = None
        if theirs != launcher.job_key:
            raise BadInputError(
                f"{d}: holds the run of another job ({theirs or 'unreadable logs/job.json'}, not {launcher.job_key}); "
                "give every node the same new --run-id"
            ) from None
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(logs / f"node{launcher.index}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        raise BadInputError(
            f"{d}: node {launcher.index} already ran in this folder (an earlier run of the same job?); "
            "give every node the same new --run-id"
        ) from None
    os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
    os.close(fd)
    return d


def write_node_status(run_dir: Path, launcher: Launcher, info: dict) -> Path:
    """logs/node{index}.json: this launcher has ended (``info``: exit_code, host, ranks, ...)."""
    import json

    path = Path(run_dir) / "logs" / f"node{launcher.index}.json"
    _write_atomic(path, json.dumps({"index": launcher.index, "host": socket.gethostname(), **info}, indent=1) + "\n")
    return path


def read_statuses(run_dir: Path, pattern: str) -> list[dict]:
    """The JSON files ``logs/<pattern>`` of a run folder that can be read (one being replaced is skipped)."""
    import json

    out = []
    for f in sorted((Path(run_dir) / "logs").glob(pattern)):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return out


@dataclass
class WaitResult:
    """What :func:`wait_for_ranks` saw: ``world_size`` (None: unknown), ``missing`` ranks without a
    trace, ``nodes_done`` (launcher indices that ended), ``timed_out``, ``waited_s``."""

    world_size: int | None
    missing: list[int]
    nodes_done: list[int]
    timed_out: bool
    waited_s: float


def wait_for_ranks(
    run_dir: Path,
    launcher: Launcher,
    *,
    expect_ranks: int | None = None,
    timeout_s: float = 300.0,
    poll_s: float = 0.5,
    grace_s: float = 15.0,
    on_progress=None,
) -> WaitResult:
    """Wait until the multi-node run in ``run_dir`` is complete, for at most ``timeout_s`` seconds.

    Complete: every launcher (``launcher.count``) has written logs/node{i}.json, or every expected
    rank (the largest world size an agent's torch.distributed reported — the job's own count, which
    wins over ``expect_ranks`` — else ``expect_ranks``) has an agent status saying
    it finished and ``grace_s`` more seconds have passed (a launcher writes its node file a moment
    after its ranks end), or the launcher count is unknown. The ranks without a trace at the end are
    ``missing``.
    """
    import time

    t0 = time.monotonic()
    said = None
    ranks_done_at = None
    while True:
        nodes = sorted({s.get("index") for s in read_statuses(run_dir, "node*.json") if isinstance(s.get("index"), int)})
        agents = [s for s in read_statuses(run_dir, "agent.*.json") if isinstance(s.get("rank"), int)]
        worlds = [s["world_size"] for s in agents if s.get("dist") and isinstance(s.get("world_size"), int)]
        world = max(worlds) if worlds else expect_ranks
        finished = {s["rank"] for s in agents if s.get("finished")}
        waited = time.monotonic() - t0
        all_nodes = launcher.count is not None and len(nodes) >= launcher.count
        all_ranks = world is not None and all(r in finished for r in range(world))
        if all_ranks and ranks_done_at is None:
            ranks_done_at = waited
        settled = all_ranks and (launcher.count is None or waited - ranks_done_at >= grace_s)
        timed_out = not (all_nodes or settled) and waited >= timeout_s
        if all_nodes or settled or timed_out:
            have = {int(p.name[4:-17]) for p in Path(run_dir).glob("rank*.pt.trace.json.gz") if p.name[4:-17].isdigit()}
            missing = [r for r in range(world) if r not in have] if world else []
            return WaitResult(world, missing, nodes, timed_out, waited)
        state = (len(nodes), len(finished))
        if on_progress is not None and state != said:
            said = state
            of_nodes = f"{len(nodes)} of {launcher.count}" if launcher.count else str(len(nodes))
            of_ranks = f"{len(finished)} of {world}" if world else str(len(finished))
            on_progress(f"waiting for the other nodes: {of_nodes} node(s) and {of_ranks} rank(s) done "
                        f"(at most {timeout_s:g} s)")
        time.sleep(poll_s)
