"""alpha_beta_fit: α, β and n½ fitted per (run, op, group size) — a Python analysis.

Reads: collective_samples

The fit itself lives in :func:`tracekit.model.fit_alpha_beta` (a regression that
weights relative error, with a robust outlier rule; the reference's "Fitting α
and β"); this module only groups the samples and stores the results as the
DuckDB table ``alpha_beta_fit``. Warm-up samples (the first call on each
communicator) are excluded before fitting. A group with fewer than two distinct
sizes cannot separate α from β: it gets a row with ``status`` saying so and
NULL parameters.

run_id            VARCHAR  run
source            VARCHAR  'trace' or 'nccl_tests'
op                VARCHAR  canonical op
group_size        INTEGER  k
algo              VARCHAR  the algorithm whose coefficients turn (a, b) into (α, β)
n_samples         INTEGER  samples offered (warm-up excluded)
n_used            INTEGER  samples kept by the fit
n_dropped         INTEGER  samples the robust rule (or zero size) dropped
n_warmup          INTEGER  warm-up samples excluded before fitting
alpha_s           DOUBLE   α, seconds per message/step
beta_Bps          DOUBLE   β, bytes/s per direction
beta_gbps         DOUBLE   β in GB/s (1e9)
n_half_bytes      DOUBLE   n½ = α·β, bytes
a_s               DOUBLE   fitted intercept a of t = a + b·bytes, s
b_s_per_byte      DOUBLE   fitted slope b, s/byte
residual_spread   DOUBLE   spread of the relative residuals (t − model)/t of the used samples
residual_max_abs  DOUBLE   largest |relative residual| among used samples
min_size_bytes    BIGINT   smallest size offered
max_size_bytes    BIGINT   largest size offered
status            VARCHAR  'ok', or why there is no fit
"""

from __future__ import annotations

from collections import defaultdict

import pyarrow as pa


SCHEMA = pa.schema(
    [
        ("run_id", pa.string()), ("source", pa.string()), ("op", pa.string()), ("group_size", pa.int32()),
        ("algo", pa.string()), ("n_samples", pa.int32()), ("n_used", pa.int32()), ("n_dropped", pa.int32()),
        ("n_warmup", pa.int32()), ("alpha_s", pa.float64()), ("beta_Bps", pa.float64()), ("beta_gbps", pa.float64()),
        ("n_half_bytes", pa.float64()), ("a_s", pa.float64()), ("b_s_per_byte", pa.float64()),
        ("residual_spread", pa.float64()), ("residual_max_abs", pa.float64()),
        ("min_size_bytes", pa.int64()), ("max_size_bytes", pa.int64()), ("status", pa.string()),
    ]
)


def fit_rows(samples: list[tuple]) -> list[dict]:
    """samples: (run_id, source, op, group_size, algo, size_bytes, time_ns, warmup, seq) → table rows."""
    from tracekit.errors import TracekitError
    from tracekit.model import ALGORITHMS, fit_alpha_beta

    groups: dict = defaultdict(list)
    for s in samples:
        groups[(s[0], s[1], s[2], s[3])].append(s)
    rows = []
    for (run_id, source, op, k), lst in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        # a total order (seq, then size and time): the regression's float sums must not depend on row order
        lst.sort(key=lambda s: (s[8] if s[8] is not None else 0, s[5] if s[5] is not None else 0, s[6] or 0))
        warm = [s for s in lst if s[7]]
        use = [s for s in lst if not s[7]]
        algos = ALGORITHMS.get(op)
        algo = algos[0] if algos else None
        row = dict(run_id=run_id, source=source, op=op, group_size=k, algo=algo, n_samples=len(use), n_used=0,
                   n_dropped=0, n_warmup=len(warm),
                   min_size_bytes=min((s[5] for s in use), default=None),
                   max_size_bytes=max((s[5] for s in use), default=None), status="ok")
        if algo is None:
            row["status"] = f"no model for {op}"
        else:
            try:
                f = fit_alpha_beta([float(s[5]) for s in use], [s[6] * 1e-9 for s in use], op, int(k),
                                   algo=algo, warmup_first=False)
                row.update(n_used=f.n_used, n_dropped=f.n_dropped, alpha_s=f.alpha_s, beta_Bps=f.beta_Bps,
                           beta_gbps=f.beta_Bps / 1e9, n_half_bytes=f.n_half_bytes, a_s=f.a_s,
                           b_s_per_byte=f.b_s_per_byte, residual_spread=f.residual_spread,
                           residual_max_abs=f.residual_max_abs)
            except TracekitError as exc:
                row["status"] = str(exc)
        rows.append(row)
    return rows


def create(con) -> None:
    """Create the table ``alpha_beta_fit`` on ``con`` from its ``collective_samples`` view."""
    samples = con.execute(
        "SELECT run_id, source, op, group_size, algo, size_bytes, time_ns, warmup, seq FROM collective_samples"
    ).fetchall()
    from tracekit.analyses import create_table_from_rows

    create_table_from_rows(con, "alpha_beta_fit", SCHEMA, fit_rows(samples))
