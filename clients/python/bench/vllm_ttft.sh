#!/usr/bin/env bash
# Time to first token of a vLLM replica B for prompts of about 3,500 tokens that replica A (another
# process) served before, in one run, five ways: recomputed (no connector), from our store
# (kvcache.vllm), from our store's disk tier (kvcache-disk: a member of DISK_MEMORY, default
# 256Mi, under the 850 MB that 20 prompts make, with a tier in $OUT/tier; the page cache is dropped
# before B starts, so B's prefixes are read from the device), from vLLM's in-tree ExampleConnector
# (files), and from the reference store (Mooncake) through vLLM's in-tree MooncakeStoreConnector.
# Prints a table: p50 over PROMPTS requests each, the KV bytes moved per request, and each mode's
# ratio to recomputing; for kvcache-disk, what the leader counted (values loaded from disk).
#
#   clients/python/bench/vllm_ttft.sh   # env: PROMPTS=20 MODES="none kvcache kvcache-disk example mooncake"
#
# Needs what scripts/setup makes (the vLLM environment and the local model), kv-store built
# (cargo build -p kvcache-store) and the kvcache package of this build: it is installed into a
# folder of its own and named by PYTHONPATH, as the local runtime does. The reference store comes
# from PyPI (mooncake-transfer-engine-non-cuda 0.3.13.post1, installed into the vLLM environment
# without its dependencies, with Debian's libibverbs1 its binaries link). Everything runs in a
# private network namespace (unshare --net, root), where only 127.0.0.1 exists: the reference
# store's processes bind 0.0.0.0. Stops exactly the processes it started.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
VENV="${KVCACHE_VLLM_VENV:-$HOME/.cache/kvcache-vllm-venv}"
MODEL="${KVCACHE_VLLM_MODEL:-$HOME/.cache/kvcache-vllm-model}"
TARGET="${CARGO_TARGET_DIR:-$HOME/.cache/kvcache-target}"
KVSTORE="${KVSTORE_BIN:-$TARGET/debug/kv-store}"
PROMPTS="${PROMPTS:-20}"
MODES="${MODES:-none kvcache kvcache-disk example mooncake}"
DISK_MEMORY="${DISK_MEMORY:-256Mi}"
MC_VERSION=0.3.13.post1
OUT="${OUT:-$(mktemp -d /tmp/vllm-ttft.XXXXXX)}"

if [[ -z "${TTFT_IN_NETNS:-}" ]]; then
  # ---- outside: install what is missing, build the package, enter a namespace of our own
  [[ -x "$VENV/bin/python" && -d "$MODEL" ]] || { echo "run scripts/setup first (no $VENV or $MODEL)" >&2; exit 1; }
  [[ -x "$KVSTORE" ]] || { echo "no kv-store at $KVSTORE: cargo build -p kvcache-store" >&2; exit 1; }
  if ! "$VENV/bin/python" -c "import mooncake.store" 2>/dev/null; then
    ldconfig -p | grep -q 'libibverbs.so.1 ' || {
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null; }
    "$VENV/bin/pip" install -q --no-deps "mooncake-transfer-engine-non-cuda==$MC_VERSION"
  fi
  mkdir -p "$OUT/wheel"
  if [[ -z "${KVCACHE_PACKAGE_DIR:-}" ]]; then
    venv="${KVCACHE_VENV:-$HOME/.cache/kvcache-venv}"
    PATH="$venv/bin:$PATH" "$venv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$OUT/wheel" "$ROOT/clients/python"
    "$VENV/bin/pip" install -q --no-deps --target "$OUT/package" "$OUT/wheel"/kvcache-*.whl
    export KVCACHE_PACKAGE_DIR="$OUT/package"
  fi
  exec unshare --net env TTFT_IN_NETNS=1 OUT="$OUT" KVCACHE_PACKAGE_DIR="$KVCACHE_PACKAGE_DIR" bash "$0" "$@"
fi

# ---- inside the namespace
ip link set lo up
STARTED=()
cleanup() {
  for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
export VLLM_CPU_KVCACHE_SPACE=2 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1

# our store: a leader and one 4 GiB member, the tenant registered with the domain's layout
"$KVSTORE" leader --listen 127.0.0.1:50061 --tenant "bench=4Gi:64:bfloat16" >"$OUT/leader.out" 2>"$OUT/leader.err" &
STARTED+=($!); wait_port 50061
"$KVSTORE" member --leader 127.0.0.1:50061 --capacity 4Gi --name bench-member --no-prefault >"$OUT/member.out" 2>"$OUT/member.err" &
STARTED+=($!)
for _ in $(seq 100); do grep -q '"state":"serving"' "$OUT/member.out" && break; sleep 0.1; done
# our store with a disk tier: a member of DISK_MEMORY and a 4 GiB tier; reads lease what they read
# for 500 ms (not 10 s), so B's loads find memory to land in
mkdir -p "$OUT/tier"
"$KVSTORE" leader --listen 127.0.0.1:50071 --metrics-listen 127.0.0.1:9171 --lease-ttl 500ms \
  --tenant "bench=$DISK_MEMORY:64:bfloat16" >"$OUT/disk-leader.out" 2>"$OUT/disk-leader.err" &
STARTED+=($!); wait_port 50071
"$KVSTORE" member --leader 127.0.0.1:50071 --capacity "$DISK_MEMORY" --name disk-member --no-prefault \
  --metrics-listen 127.0.0.1:9172 --tier-dir "$OUT/tier" --tier-capacity 4Gi >"$OUT/disk-member.out" 2>"$OUT/disk-member.err" &
STARTED+=($!)
for _ in $(seq 100); do grep -q '"state":"serving"' "$OUT/disk-member.out" && break; sleep 0.1; done
metric() {  # port name: the sum of a series on /metrics
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 ~ "^"n"(_total)?([{]|$)" {s += $2} END {print s + 0}'
}
# the reference store: its master and a segment holder of 4 GiB (engines give none)
PKG="$("$VENV/bin/python" -c 'import mooncake, os; print(os.path.dirname(mooncake.__file__))')"
"$PKG/mooncake_master" --rpc_address=127.0.0.1 --rpc_port=50051 --metrics_port=9003 \
  --enable_http_metadata_server=false --enable_ha=false --logtostderr=true >"$OUT/mc-master.log" 2>&1 &
STARTED+=($!); wait_port 50051
"$PKG/mooncake_client" --host=127.0.0.1 --port=50052 --protocol=tcp --global_segment_size=4294967296 \
  --metadata_server=P2PHANDSHAKE --master_server_address=127.0.0.1:50051 --logtostderr=true >"$OUT/mc-holder.log" 2>&1 &
STARTED+=($!); wait_port 50052
cat >"$OUT/mooncake.json" <<EOF
{"metadata_server": "P2PHANDSHAKE", "master_server_address": "127.0.0.1:50051", "protocol": "tcp",
 "device_name": "", "mode": "standalone-store", "global_segment_size": 0, "local_buffer_size": 1073741824}
EOF

replica() {  # mode role
  local leader=127.0.0.1:50061
  [[ "$1" != kvcache-disk ]] || leader=127.0.0.1:50071
  env PYTHONPATH="$KVCACHE_PACKAGE_DIR" KVSTORE_LEADER="$leader" KVSTORE_TENANT=bench \
    KVSTORE_BLOCK_SIZE=64 KVSTORE_DTYPE=bfloat16 MOONCAKE_CONFIG_PATH="$OUT/mooncake.json" \
    "$VENV/bin/python" -P "$HERE/vllm_ttft.py" --model "$MODEL" --mode "$1" --role "$2" \
    --prompts "$PROMPTS" --files "$OUT/files" >"$OUT/$1-$2.out" 2>"$OUT/$1-$2.log" \
    || { echo "$1 $2 failed: $(grep -E 'Error|error' "$OUT/$1-$2.log" | tail -n 3)" >&2; return 1; }
}
for mode in $MODES; do
  echo "== $mode" >&2
  [[ "$mode" == none ]] || replica "$mode" writer || continue
  if [[ "$mode" == kvcache-disk ]]; then
    # every value put has its copy on disk (or 30 s passed), then nothing is cached by the kernel
    for _ in $(seq 300); do
      [[ "$(metric 9172 kvstore_member_tier_copies)" -ge "$(metric 9171 kvstore_puts)" ]] && break; sleep 0.1
    done
    sync; echo 3 >/proc/sys/vm/drop_caches
    echo "{\"puts\": $(metric 9171 kvstore_puts), \"copies\": $(metric 9172 kvstore_member_tier_copies), \"demotions\": $(metric 9171 kvstore_demotions), \"loads\": $(metric 9171 kvstore_loads)}" >"$OUT/disk-before.json"
  fi
  replica "$mode" reader || continue
  if [[ "$mode" == kvcache-disk ]]; then
    echo "{\"loads\": $(metric 9171 kvstore_loads), \"load_failures\": $(metric 9171 kvstore_load_failures), \"misses\": $(metric 9171 kvstore_misses), \"hits\": $(metric 9171 kvstore_hits)}" >"$OUT/disk-after.json"
  fi
done
"$VENV/bin/python" - "$OUT" $MODES <<'EOF'
import json, re, sys
out, modes = sys.argv[1], sys.argv[2:]
rows = {}
for m in modes:
    try:
        line = [l for l in open(f"{out}/{m}-reader.out") if l.startswith("{")][-1]
        rows[m] = json.loads(line)
    except (OSError, IndexError):
        pass
base = rows.get("none", {}).get("p50_s")
names = {"none": "recomputed (no connector)", "kvcache": "our store (kvcache.vllm)",
         "kvcache-disk": "our store, from its disk tier",
         "example": "ExampleConnector (files)", "mooncake": "Mooncake store (MooncakeStoreConnector)"}
print(f"replica B, {next(iter(rows.values()))['prompt_tokens'] if rows else '?'}-token prompts, p50 over {len(next(iter(rows.values()))['ttft_s']) if rows else 0} requests each")
print(f"{'':42} {'p50 TTFT':>10} {'min':>8} {'max':>8} {'tokens from cache':>18} {'KV MB/request':>14} {'vs recompute':>13}")
for m in modes:
    r = rows.get(m)
    if not r:
        print(f"{names[m]:42} did not run (see {out}/{m}-*.log)")
        continue
    t = sorted(r["ttft_s"])
    ratio = f"{r['p50_s'] / base:.3f}" if base else "-"
    cached = sorted(r["cached_tokens"])[len(t) // 2]
    print(f"{names[m]:42} {r['p50_s'] * 1000:8.1f}ms {t[0] * 1000:6.1f}ms {t[-1] * 1000:6.1f}ms {cached:>18} {r['kv_bytes_per_request'] / 1e6:14.1f} {ratio:>13}")
try:
    before, after = (json.load(open(f"{out}/disk-{w}.json")) for w in ("before", "after"))
    print(f"disk tier: {before['puts']} values put, {before['copies']} copied to disk, {before['demotions']} demoted "
          f"before B; B's run loaded {after['loads'] - before['loads']} from disk "
          f"({after['load_failures']} load failures, {after['misses']} misses, {after['hits']} hits in all)")
except (OSError, ValueError, KeyError):
    pass
# blocks our connector found but could not load (vLLM recomputed them): the table's times for that
# mode are then partly recompute, whatever the store counted
for m in modes:
    if not m.startswith("kvcache"):
        continue
    failed = blocks = 0
    try:
        for l in open(f"{out}/{m}-reader.out"):
            found = re.search(r"kvcache\.vllm: (\d+) of (\d+) blocks did not load", l)
            if found:
                failed, blocks = failed + int(found[1]), blocks + int(found[2])
    except OSError:
        continue
    print(f"{names[m]}: " + (f"{failed} blocks did not load (of {blocks} in the loads that failed any), vLLM recomputed them; see {out}/{m}-reader.out" if failed else "every block found was loaded"))
floor = rows.get("none")
if floor and base:
    t = sorted(floor["local_ttft_s"])
    print(f"{'the floor: B own prefix cache (no transfer)':42} {floor['local_p50_s'] * 1000:8.1f}ms {t[0] * 1000:6.1f}ms {t[-1] * 1000:6.1f}ms {'':>18} {0.0:14.1f} {floor['local_p50_s'] / base:13.3f}")
EOF
echo "logs in $OUT" >&2
