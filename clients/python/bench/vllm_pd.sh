#!/usr/bin/env bash
# Prefill/decode through the store against two whole replicas, both behind our router (kv-router),
# on one workload, in one run: time to first token and per-token latency (p50, p99) as a client
# of the router sees them, and the KV bytes handed from prefill to decode per request.
#
#   clients/python/bench/vllm_pd.sh     # env: REQUESTS=40 CONCURRENCY=4 OUTPUT_TOKENS=64
#
# The workload (vllm_pd_load.py): REQUESTS prompts of about 3,000 tokens, half of them in groups
# that share a 2,000-token prefix, streamed, CONCURRENCY at a time, OUTPUT_TOKENS each. Layouts:
#   pd:      one Prefill replica (kv_both) and one Decode replica (kv_consumer): every prompt
#            goes through prefill, then decode loads the handoff from the store;
#   servers: two Server replicas (kv_both): the router sends each request to the least loaded.
#   pd-both: as pd with decode kv_both (saving its own blocks); LAYOUTS="pd pd-both" compares.
# Each layout gets a fresh store (a leader and one 4 GiB member) and fresh replicas, one layout
# after the other. Needs what scripts/setup makes (the vLLM environment and the local model),
# kv-store and kv-router built (cargo build -p kvcache-store -p kvcache-router) and this build's
# kvcache package (built here unless KVCACHE_PACKAGE_DIR names one). Runs in a private network
# namespace (unshare --net, root); stops exactly the processes it started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
VENV="${KVCACHE_VLLM_VENV:-$HOME/.cache/kvcache-vllm-venv}"
MODEL="${KVCACHE_VLLM_MODEL:-$HOME/.cache/kvcache-vllm-model}"
TARGET="${CARGO_TARGET_DIR:-$HOME/.cache/kvcache-target}"
KVSTORE="${KVSTORE_BIN:-$TARGET/debug/kv-store}"
KVROUTER="${KVROUTER_BIN:-$(dirname "$KVSTORE")/kv-router}"
LAYOUTS="${LAYOUTS:-pd servers}"
OUT="${OUT:-$(mktemp -d /tmp/vllm-pd.XXXXXX)}"

if [[ -z "${PD_IN_NETNS:-}" ]]; then
  mkdir -p "$OUT"
  [[ -x "$VENV/bin/python" && -d "$MODEL" ]] || { echo "run scripts/setup first (no $VENV or $MODEL)" >&2; exit 1; }
  [[ -x "$KVSTORE" && -x "$KVROUTER" ]] || {
    echo "no kv-store or kv-router next to $KVSTORE: cargo build -p kvcache-store -p kvcache-router" >&2; exit 1; }
  if [[ -z "${KVCACHE_PACKAGE_DIR:-}" ]]; then
    venv="${KVCACHE_VENV:-$HOME/.cache/kvcache-venv}"
    mkdir -p "$OUT/wheel"
    PATH="$venv/bin:$PATH" "$venv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$OUT/wheel" "$ROOT/clients/python"
    "$VENV/bin/pip" install -q --no-deps --target "$OUT/package" "$OUT/wheel"/kvcache-*.whl
    export KVCACHE_PACKAGE_DIR="$OUT/package"
  fi
  exec unshare --net env PD_IN_NETNS=1 OUT="$OUT" KVCACHE_PACKAGE_DIR="$KVCACHE_PACKAGE_DIR" \
    KVSTORE="$KVSTORE" KVROUTER="$KVROUTER" bash "$0" "$@"
fi

# ---- inside the namespace
ip link set lo up
STARTED=()
stop_all() {
  for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  STARTED=()
}
trap stop_all EXIT
wait_url() { for _ in $(seq 1200); do curl -sf "$1" >/dev/null && return 0; sleep 0.5; done; echo "$1 never answered" >&2; return 1; }
export VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1

replica() {  # port kv_role name
  env PYTHONPATH="$KVCACHE_PACKAGE_DIR" KVSTORE_LEADER=127.0.0.1:50081 KVSTORE_TENANT=bench \
    KVSTORE_BLOCK_SIZE=64 KVSTORE_DTYPE=bfloat16 \
    "$VENV/bin/vllm" serve "$MODEL" --host 127.0.0.1 --port "$1" --max-model-len 4096 --enforce-eager \
    --dtype bfloat16 --block-size 64 \
    --kv-transfer-config "{\"kv_connector\":\"KVCacheStoreConnector\",\"kv_connector_module_path\":\"kvcache.vllm\",\"kv_role\":\"$2\",\"kv_load_failure_policy\":\"recompute\"}" \
    >"$OUT/$3.log" 2>&1 &
  STARTED+=($!)
}

for layout in $LAYOUTS; do
  echo "== $layout" >&2
  "$KVSTORE" leader --listen 127.0.0.1:50081 --tenant "bench=4Gi:64:bfloat16" >"$OUT/$layout-leader.out" 2>"$OUT/$layout-leader.err" &
  STARTED+=($!)
  for _ in $(seq 100); do grep -q '"state":"serving"' "$OUT/$layout-leader.out" && break; sleep 0.1; done
  "$KVSTORE" member --leader 127.0.0.1:50081 --capacity 4Gi --name bench-member --no-prefault >"$OUT/$layout-member.out" 2>"$OUT/$layout-member.err" &
  STARTED+=($!)
  for _ in $(seq 100); do grep -q '"state":"serving"' "$OUT/$layout-member.out" && break; sleep 0.1; done
  case "$layout" in
    pd)
      replica 8201 kv_both "$layout-prefill"; wait_url http://127.0.0.1:8201/health
      replica 8202 kv_consumer "$layout-decode"; wait_url http://127.0.0.1:8202/health
      echo '{"prefill": ["http://127.0.0.1:8201"], "decode": ["http://127.0.0.1:8202"]}' >"$OUT/workers.json" ;;
    pd-both)  # decode saving its own blocks too (the choice the README weighs)
      replica 8201 kv_both "$layout-prefill"; wait_url http://127.0.0.1:8201/health
      replica 8202 kv_both "$layout-decode"; wait_url http://127.0.0.1:8202/health
      echo '{"prefill": ["http://127.0.0.1:8201"], "decode": ["http://127.0.0.1:8202"]}' >"$OUT/workers.json" ;;
    servers)
      replica 8201 kv_both "$layout-server-0"; wait_url http://127.0.0.1:8201/health
      replica 8202 kv_both "$layout-server-1"; wait_url http://127.0.0.1:8202/health
      echo '{"server": ["http://127.0.0.1:8201", "http://127.0.0.1:8202"]}' >"$OUT/workers.json" ;;
  esac
  "$KVROUTER" --listen 127.0.0.1:8200 --model "$MODEL" --workers-file "$OUT/workers.json" \
    >"$OUT/$layout-router.log" 2>&1 &
  STARTED+=($!)
  wait_url http://127.0.0.1:8200/health
  "$VENV/bin/python" -P "$HERE/vllm_pd_load.py" --router http://127.0.0.1:8200 --model "$MODEL" \
    --layout "$layout" >"$OUT/$layout.json"
  stop_all
done
"$VENV/bin/python" -P "$HERE/vllm_pd_load.py" --table $(for l in $LAYOUTS; do echo "$OUT/$l.json"; done)
echo "logs in $OUT" >&2
