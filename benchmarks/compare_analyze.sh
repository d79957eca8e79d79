#!/usr/bin/env bash
# compare_analyze.sh: the same traces ingested and analysed by two tracekit commands, then diffed.
#
#   benchmarks/compare_analyze.sh OLD_TRACEKIT NEW_TRACEKIT OUT_DIR
#
# OLD_TRACEKIT / NEW_TRACEKIT: tracekit executables (e.g. /work/main's editable install on PATH,
# and a worktree's .venv/bin/tracekit). For each source below: ingest into a fresh store per
# side, `analyze --json` (also with --link nvlink4), and dump every store table sorted
# (`sql --json`); created_at and store/source paths are masked. Prints one line per
# comparison and exits 1 if any differs (the diffs stay in OUT_DIR).
set -u
OLD=$1 NEW=$2 OUT=$3
REPO=$(cd "$(dirname "$0")/.." && pwd)
SOURCES=(
  "$REPO/fixtures/tp_2rank" "$REPO/fixtures/tp_chunks_2rank" "$REPO/fixtures/ep_2rank" "$REPO/fixtures/ep_2rank/tbo" "$REPO/fixtures/pp_2rank"
  "$REPO/fixtures/pp_decode_2rank" "$REPO/fixtures/kv_layerwise_2rank" "$REPO/fixtures/kv_bulk_2rank"
  "$REPO/fixtures/sweep_2rank" "$REPO/../shared/traces/param_dlrm_8rank_v100"
)
mask() { sed -E 's/"created_at": "[^"]*"/"created_at": "X"/; s#"(source_path|path)": "[^"]*"#"\1": "X"#'; }
rm -rf "$OUT"; mkdir -p "$OUT"
bad=0
for src in "${SOURCES[@]}"; do
  [ -e "$src" ] || { echo "skip $src (absent)"; continue; }
  name=$(basename "$src")
  for side in old new; do
    exe=$OLD; [ $side = new ] && exe=$NEW
    st="$OUT/$side-$name.store"
    "$exe" ingest "$src" --store "$st" --run-id "$name" >/dev/null 2>"$OUT/$side-$name.ingest.err" || echo "$side ingest failed: $src"
    "$exe" analyze --store "$st" --run "$name" --json 2>/dev/null | mask >"$OUT/$side-$name.json"
    "$exe" analyze --store "$st" --run "$name" --json --link nvlink4 2>/dev/null | mask >"$OUT/$side-$name.link.json"
    for t in runs ranks events collectives; do
      "$exe" sql --store "$st" --json "SELECT * FROM $t ORDER BY ALL" \
        2>/dev/null | mask >"$OUT/$side-$name.$t.json"
    done
  done
  for f in json link.json runs.json ranks.json events.json collectives.json; do
    if cmp -s "$OUT/old-$name.$f" "$OUT/new-$name.$f" && [ -s "$OUT/new-$name.$f" ]; then
      echo "same   $name $f"
    else
      echo "DIFFER $name $f"; bad=1
      diff "$OUT/old-$name.$f" "$OUT/new-$name.$f" >"$OUT/$name.$f.diff"
    fi
  done
done
exit $bad
