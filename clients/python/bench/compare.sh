#!/usr/bin/env bash
# The Python remote path side by side: the reference store's Python client
# (../shared/bench/mooncake_peer.sh, "remote" mode: a separate process holds the memory, every
# byte crosses loopback TCP) and our package (bench.py, a leader and one member in other
# processes), batches of 16 x 1 MiB through batch_put_from and batch_get_into, alternated ROUNDS
# times. Prints MB/s and the ratio (the goal is 2x).
#
#   bash clients/python/bench/compare.sh      # env: ROUNDS (1), OUT (/tmp/kvcache_py_compare),
#                                             # SHARED (../shared), KVCACHE_VENV, CARGO_TARGET_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
SHARED="${SHARED:-$REPO/../shared}"
OUT="${OUT:-/tmp/kvcache_py_compare}"
ROUNDS="${ROUNDS:-1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kvcache-target}"
venv="${KVCACHE_VENV:-$HOME/.cache/kvcache-venv}"
mkdir -p "$OUT"
(cd "$REPO" && cargo build -q --release --locked -p kvcache-store --bin kv-store)
PATH="$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps "$REPO/clients/python"
for r in $(seq "$ROUNDS"); do
  MODES=remote OUT="$OUT/ref-$r" bash "$SHARED/bench/mooncake_peer.sh" --sizes 1MiB --batch 16 --ops 400 --no-bytes-api \
    > "$OUT/ref-$r.log" 2>&1
  "$venv/bin/python" "$HERE/bench.py" --sizes 1MiB --batch 16 --ops 400 --json "$OUT/ours-$r.json" > "$OUT/ours-$r.log"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    ref = {x["op"]: x for x in json.load(open(f"{out}/ref-{r}/mooncake_remote.json"))["results"]}
    ours = {x["op"]: x for x in json.load(open(f"{out}/ours-{r}.json"))}
    for op in ("batch_put_from", "batch_get_into"):
        o, m = ours[op]["MB_per_s"], ref[op]["MB_per_s"]
        print(f"round {r}: {op} 16 x 1MiB: ours {o} MB/s (p50 {ours[op]['p50_us']} us), reference {m} MB/s "
              f"(p50 {ref[op]['p50_us']} us): {o / m:.2f}x (goal 2x)")
PY
