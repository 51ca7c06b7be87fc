#!/usr/bin/env bash
# Side-by-side benchmark on this machine: the reference store in "remote" mode (data crosses
# loopback TCP; ../shared/bench/mooncake_peer.sh) and `kv-store bench` against a leader and one
# 1 GiB member, alternated ROUNDS times so both see the same background load. Prints a table with
# the ratios the store issues set as goals. With TLS each round also measures the machine's crypto
# bound (`kv-store tls-bound`: AES-128-GCM seal and open of 4 MiB values through ring on two threads,
# nothing else), which 4 MiB puts and gets are compared with, and how fast our TLS record layer
# alone moves 4 MiB over loopback.
#
#   bash store/bench/compare.sh            # ROUNDS=1; OUT=/tmp/kvstore_compare
#   env: ROUNDS, OUT, SHARED (default ../shared next to the repo), CARGO_TARGET_DIR,
#        KVSTORE_BIN (an already built kv-store; skips the build),
#        TLS (default 1: every port of ours is TLS, as the runtimes run it; 0: plaintext)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SHARED="${SHARED:-$REPO/../shared}"
OUT="${OUT:-/tmp/kvstore_compare}"
ROUNDS="${ROUNDS:-1}"
TLS="${TLS:-1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/kvcache-target}"
mkdir -p "$OUT"
BIN="${KVSTORE_BIN:-}"
if [[ -z "$BIN" ]]; then
  (cd "$REPO" && cargo build --release --locked -p kvcache-store --bin kv-store)
  BIN="$CARGO_TARGET_DIR/release/kv-store"
fi

STARTED=()
cleanup() { for pid in "${STARTED[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

# Credentials on, as a controller-run store has them: the bench tenant is bound to the bench's
# credential (every call proves it), and the Control and Membership APIs take tokens. Grants are
# always signed.
credential_sha256="$(printf %s kv-store-bench | sha256sum | cut -d' ' -f1)"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/control.token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/member.token"
chmod 600 "$OUT/control.token" "$OUT/member.token"

# TLS on, as the runtimes run the store: a CA of the run's own, one certificate for the backend's
# store name that the leader and the member serve, and clients that check that name.
SERVE_TLS=(); DIAL_TLS=()
if [[ "$TLS" == 1 ]]; then
  name=bench.kvstore.internal
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
    -keyout "$OUT/ca.key" -out "$OUT/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$OUT/tls.key" -out "$OUT/tls.csr" 2>/dev/null
  openssl x509 -req -in "$OUT/tls.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" -CAcreateserial -days 1 \
    -extfile <(printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth\n' "$name") -out "$OUT/tls.crt" 2>/dev/null
  SERVE_TLS=(--tls-cert "$OUT/tls.crt" --tls-key "$OUT/tls.key")
  DIAL_TLS=(--tls-ca "$OUT/ca.crt" --tls-server-name "$name")
fi
echo "== TLS=$TLS" >&2

ours() {  # $1 = output file
  local port=$((20000 + RANDOM % 20000))
  "$BIN" leader --listen "127.0.0.1:$port" --tenant "bench=2Gi:64:bfloat16,sha256=$credential_sha256" \
    --control-token-file "$OUT/control.token" --member-token-file "$OUT/member.token" "${SERVE_TLS[@]}" \
    > "$OUT/leader.out" 2> "$OUT/leader.log" &
  local lp=$!; STARTED+=("$lp")
  sleep 0.3
  "$BIN" member --leader "127.0.0.1:$port" --capacity 1Gi --name bench-member --member-token-file "$OUT/member.token" \
    "${SERVE_TLS[@]}" "${DIAL_TLS[@]}" \
    > "$OUT/member.out" 2> "$OUT/member.log" &
  local mp=$!; STARTED+=("$mp")
  "$BIN" bench --leader "127.0.0.1:$port" --ops 2000 --control-token-file "$OUT/control.token" "${DIAL_TLS[@]}" > "$1"
  kill "$lp" "$mp"; wait "$lp" "$mp" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
  echo "== round $r: reference (remote mode)" >&2
  MODES=remote OUT="$OUT/ref$r" bash "$SHARED/bench/mooncake_peer.sh" > "$OUT/ref$r.log" 2>&1
  echo "== round $r: kv-store" >&2
  ours "$OUT/ours$r.jsonl"
  if [[ "$TLS" == 1 ]]; then
    echo "== round $r: the TLS bound" >&2
    "$BIN" tls-bound "${SERVE_TLS[@]}" "${DIAL_TLS[@]}" > "$OUT/bound$r.jsonl"
  fi
done
python3 "$HERE/compare.py" "$OUT" "$ROUNDS"
