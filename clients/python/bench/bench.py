#!/usr/bin/env python3
"""The Python remote path of our package, measured the way the reference's benchmark measures the
reference's client: batches of --batch keys of each --sizes value through batch_put_from and
batch_get_into on a registered buffer, against a leader and one member in other processes (every
byte crosses loopback TCP). Keys are written into a ring that never reaches the eviction
watermark; a slot is removed before it is reused, outside the timed region. Latency is the wall
time of one call; MB/s uses 10^6 bytes.

  python clients/python/bench/bench.py [--kv-store PATH] [--sizes 1MiB] [--batch 16] [--ops 400]
      [--json OUT]
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import kvcache
from sizes import parse_size


def start(args):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = None
    for line in p.stdout:
        ev = json.loads(line)
        first = first or ev
        if ev.get("event") == "readiness" and ev.get("state") == "serving":
            return p, first
    raise RuntimeError(f"{args} did not serve")


def stats(name, size, lat_ns, busy, items, errors):
    lat = sorted(x / 1e3 for x in lat_ns)
    ops = len(lat)

    def pct(q):
        return round(lat[min(ops - 1, int(q * ops))], 1) if ops else None

    r = {
        "op": name,
        "size": size,
        "ops": ops,
        "items_per_op": items,
        "errors": errors,
        "MB_per_s": round(max(0, ops * items - errors) * size / busy / 1e6, 1) if busy else 0.0,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
    }
    print(
        f"  {name:<15} {size >> 10:>6}KiB x{items:<3} ops={ops:<5} {r['MB_per_s']:>9.1f} MB/s "
        f"p50={r['p50_us']}us p99={r['p99_us']}us" + (f" errors={errors}" if errors else ""),
        flush=True,
    )
    return r


def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/kvcache-target"))
    ap.add_argument("--kv-store", default=os.path.join(target, "release", "kv-store"))
    ap.add_argument("--sizes", default="1MiB")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--ring-bytes", default="384MiB")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    shm = tempfile.TemporaryDirectory()
    leader, listening = start([a.kv_store, "leader", "--listen", "127.0.0.1:0", "--tenant", "bench=2Gi:64:bfloat16"])
    member, _ = start(
        [
            a.kv_store,
            "member",
            "--leader",
            listening["grpc"],
            "--capacity",
            "1Gi",
            "--name",
            "bench-member",
            "--shm-dir",
            shm.name,
        ]
    )
    results = []
    try:
        s = kvcache.Store(listening["grpc"], "bench", 64, "bfloat16", same_host=False)
        ring = parse_size(a.ring_bytes)
        for size in [parse_size(x) for x in a.sizes.split(",")]:
            B = a.batch
            buf = ctypes.create_string_buffer(os.urandom(2 * B * size), 2 * B * size)
            base = ctypes.addressof(buf)
            s.register_buffer(base, 2 * B * size)
            W = max(1, ring // (B * size))
            groups = [[f"bp-{size}-{j}-{m}" for m in range(B)] for j in range(W)]
            src = [base + m * size for m in range(B)]
            dst = [base + (B + m) * size for m in range(B)]
            sizes = [size] * B
            lat, err, busy, i, t0 = [], 0, 0.0, 0, time.perf_counter()
            while i < a.ops and time.perf_counter() - t0 < a.max_seconds:
                g = groups[i % W]
                if i >= W:
                    for k in g:
                        s.remove(k)
                t = time.perf_counter_ns()
                rcs = s.batch_put_from(g, src, sizes)
                d = time.perf_counter_ns() - t
                lat.append(d)
                busy += d / 1e9
                err += sum(1 for x in rcs if x != 0)
                i += 1
            results.append(stats("batch_put_from", size, lat, busy, B, err))
            written = groups[: min(i, W)]
            lat, err, busy, i, t0 = [], 0, 0.0, 0, time.perf_counter()
            while i < a.ops and time.perf_counter() - t0 < a.max_seconds:
                t = time.perf_counter_ns()
                ns = s.batch_get_into(written[i % len(written)], dst, sizes)
                d = time.perf_counter_ns() - t
                lat.append(d)
                busy += d / 1e9
                err += sum(1 for x in ns if x != size)
                i += 1
            results.append(stats("batch_get_into", size, lat, busy, B, err))
            if buf.raw[: B * size] != buf.raw[B * size :]:
                print("  !! the last batch read back other bytes", flush=True)
                sys.exit(1)
            s.unregister_buffer(base)
        s.close()
    finally:
        for p in (member, leader):
            p.terminate()
            p.wait(timeout=10)
            p.stdout.close()
        shm.cleanup()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
