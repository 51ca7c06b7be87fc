#!/usr/bin/env bash
# Our Python package side by side with the reference store's Python client, in one run, ROUNDS
# times, printing MB/s and ratios:
#   1. remote path: batches of 16 x 1 MiB through batch_put_from / batch_get_into, every byte over
#      loopback TCP (the reference: ../shared/bench/mooncake_peer.sh, remote mode; ours: bench.py
#      with same_host=False). Goal 2x.
#   2. same host: 4 MiB put_from / get_into (ours through the member's mapped segment; the
#      reference in its local mode, the segment in the client's own process), and memcpy
#      bandwidth (../shared/bench/memcpy_bw.c, 4 MiB blocks) measured in the same run. Goals:
#      gets >= 90% of memcpy, and 2x the reference.
#   3. eight concurrent clients, 64 KiB and 4 MiB put_from / get_into, aggregate MB/s (ours over
#      TCP and through the mapping; the reference remote, each client a process; concurrent.py).
#      Goal 2x.
#
#   bash clients/python/bench/compare.sh   # env: ROUNDS (1), OUT (/tmp/kvcache_py_compare),
#                                          # SHARED (../shared), KVCACHE_VENV, CARGO_TARGET_DIR,
#                                          # MC_VENV (/tmp/mc, made by mooncake_peer.sh)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
SHARED="${SHARED:-$REPO/../shared}"
OUT="${OUT:-/tmp/kvcache_py_compare}"
ROUNDS="${ROUNDS:-1}"
MC_VENV="${MC_VENV:-/tmp/mc}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kvcache-target}"
venv="${KVCACHE_VENV:-$HOME/.cache/kvcache-venv}"
KV="$CARGO_TARGET_DIR/release/kv-store"
mkdir -p "$OUT"
(cd "$REPO" && cargo build -q --release --locked -p kvcache-store --bin kv-store)
[ "${SKIP_INSTALL:-}" = 1 ] || PATH="$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps "$REPO/clients/python"
gcc -O2 -o "$OUT/memcpy_bw" "$SHARED/bench/memcpy_bw.c"

PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_all EXIT

# ours: a leader and one 2 GiB member (prefaulted, as a serving member is), then concurrent.py
ours() {  # name, then concurrent.py flags
  local name=$1; shift
  "$KV" leader --listen 127.0.0.1:0 --tenant bench=2Gi:64:bfloat16 > "$OUT/leader.out" 2>/dev/null &
  PIDS+=($!)
  local addr=""
  for _ in $(seq 100); do
    addr=$(sed -n 's/.*"event":"listening".*"grpc":"\([^"]*\)".*/\1/p' "$OUT/leader.out" | head -1)
    [ -n "$addr" ] && break; sleep 0.1
  done
  "$KV" member --leader "$addr" --capacity 2Gi --name bench-member > "$OUT/member.out" 2>/dev/null &
  PIDS+=($!)
  for _ in $(seq 300); do grep -q '"state":"serving"' "$OUT/member.out" 2>/dev/null && break; sleep 0.1; done
  "$venv/bin/python" "$HERE/concurrent.py" --store ours --leader "$addr" --json "$OUT/$name.json" "$@"
  stop_all
}

# the reference: mooncake_master (and for remote mode a segment holder) in a private network
# namespace, as mooncake_peer.sh runs them, then concurrent.py with its client
reference() {  # name, mode, then concurrent.py flags
  local name=$1 mode=$2; shift 2
  local pkg
  pkg="$("$MC_VENV/bin/python" -c 'import mooncake,os;print(os.path.dirname(mooncake.__file__))')"
  unshare --net bash -s "$pkg" "$mode" "$MC_VENV/bin/python" "$HERE/concurrent.py" "$OUT/$name.json" "$@" <<'SH'
set -euo pipefail
pkg=$1 mode=$2 py=$3 script=$4 json=$5; shift 5
ip link set lo up
"$pkg/mooncake_master" --rpc_address=127.0.0.1 --rpc_port=50051 --enable_http_metadata_server=false \
  --enable_ha=false --logtostderr=true > /dev/null 2>&1 &
pids=($!)
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
until (exec 3<>/dev/tcp/127.0.0.1/50051) 2>/dev/null; do sleep 0.2; done
if [ "$mode" = remote ]; then
  "$pkg/mooncake_client" --host=127.0.0.1 --port=50052 --protocol=tcp --global_segment_size=2147483648 \
    --metadata_server=P2PHANDSHAKE --master_server_address=127.0.0.1:50051 --logtostderr=true > /dev/null 2>&1 &
  pids+=($!)
  until (exec 3<>/dev/tcp/127.0.0.1/50052) 2>/dev/null; do sleep 0.2; done
  sleep 1
fi
"$py" "$script" --store reference --mode "$mode" --master 127.0.0.1:50051 --json "$json" "$@" 2>/dev/null
SH
}

for r in $(seq "$ROUNDS"); do
  echo "== round $r"
  # 1. remote batches (mooncake_peer.sh also installs the reference's virtual environment)
  VENV="$MC_VENV" MODES=remote OUT="$OUT/ref-$r" bash "$SHARED/bench/mooncake_peer.sh" --sizes 1MiB --batch 16 --ops 400 --no-bytes-api \
    > "$OUT/ref-$r.log" 2>&1
  "$venv/bin/python" "$HERE/bench.py" --kv-store "$KV" --sizes 1MiB --batch 16 --ops 400 --json "$OUT/ours-$r.json" > "$OUT/ours-$r.log"
  # 2. same host, 4 MiB
  "$OUT/memcpy_bw" > "$OUT/memcpy-$r.txt"
  ours "local1-$r" --clients 1 --sizes 4MiB --same-host
  reference "reflocal1-$r" local --clients 1 --sizes 4MiB
  # 3. eight clients
  # eight processes polling for replies on two cores would take turns at the cores: no polling
  ours "tcp8-$r" --clients 8 --spin-us 0
  ours "local8-$r" --clients 8 --same-host --spin-us 0
  reference "ref8-$r" remote --clients 8
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    return {(x["op"], x["size"]): x["MB_per_s"] for x in json.load(open(f"{out}/{name}.json"))}
for r in range(1, rounds + 1):
    print(f"round {r}")
    ref = {x["op"]: x for x in json.load(open(f"{out}/ref-{r}/mooncake_remote.json"))["results"]}
    ours = {x["op"]: x for x in json.load(open(f"{out}/ours-{r}.json"))}
    for op in ("batch_put_from", "batch_get_into"):
        o, m = ours[op]["MB_per_s"], ref[op]["MB_per_s"]
        print(f"  remote {op} 16 x 1MiB: ours {o:.0f} MB/s, reference {m:.0f} MB/s: {o / m:.2f}x (goal 2x)")
    text = open(f"{out}/memcpy-{r}.txt").read()
    m4 = re.search(r"block=\s*4096 KiB.*?([0-9.]+) GB/s", text)
    memcpy = float(m4.group(1)) * 1000 if m4 else float("nan")
    o1, r1 = load(f"local1-{r}"), load(f"reflocal1-{r}")
    for op in ("put_from", "get_into"):
        o, m = o1[(op, 4 << 20)], r1[(op, 4 << 20)]
        goal = " (goals: 90% of memcpy, 2x)" if op == "get_into" else " (goal 2x)"
        print(f"  same host {op} 4MiB: ours {o:.0f} MB/s, reference local {m:.0f} MB/s: {o / m:.2f}x;"
              f" memcpy {memcpy:.0f} MB/s: {o / memcpy:.0%}{goal}")
    t8, l8, r8 = load(f"tcp8-{r}"), load(f"local8-{r}"), load(f"ref8-{r}")
    for size in (64 << 10, 4 << 20):
        for op in ("put_from", "get_into"):
            m = r8[(op, size)]
            print(f"  8 clients {op} {size >> 10}KiB: ours TCP {t8[(op, size)]:.0f} MB/s ({t8[(op, size)] / m:.2f}x),"
                  f" ours same host {l8[(op, size)]:.0f} MB/s ({l8[(op, size)] / m:.2f}x), reference {m:.0f} MB/s (goal 2x)")
PY
