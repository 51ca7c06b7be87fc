#!/usr/bin/env python3
"""Single-key put_from / get_into through registered memory, from --clients processes at once,
for our package or the reference store's Python client (mooncake.store), measured the same way
for both: each client writes its own ring of keys (its own prefix), then reads them back in
order; a client's MB/s is its bytes over the time its calls took, and the aggregate is the sum
over clients (they run at once: a barrier starts each phase). Every value read is compared with
what was written once per pass.

  ours:      python concurrent.py --store ours --leader HOST:PORT --tenant bench [--same-host]
  reference: python concurrent.py --store reference --master HOST:PORT [--mode local|remote]
  common:    [--clients 8] [--sizes 64KiB,4MiB] [--ops 400] [--ring-bytes 128MiB] [--json OUT]

With --same-host (ours) values go through the member's mapped segment; without, over TCP. The
reference's local mode mounts the segment in each client process (its copies are memcpy in
process); remote mode reaches a segment another process holds, over TCP.
"""

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import sys
import time

from sizes import parse_size


def open_store(a):
    if a.store == "ours":
        import kvcache

        return kvcache.Store(a.leader, a.tenant, 64, "bfloat16", spin_us=a.spin_us, same_host=a.same_host)
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    seg = parse_size(a.segment_size) if a.mode == "local" else 0
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", seg, parse_size(a.local_buffer), "tcp", "", a.master)
    if rc != 0:
        raise SystemExit(f"reference setup failed: {rc}")
    return s


def remove(a, s, k):
    if a.store == "ours":
        s.remove(k)
    else:
        s.remove(k, True)


def client(a, idx, barrier, out):
    s = open_store(a)
    sizes = [parse_size(x) for x in a.sizes.split(",")]
    top = max(sizes)
    buf = ctypes.create_string_buffer(os.urandom(top), 2 * top)
    base = ctypes.addressof(buf)
    rc = s.register_buffer(base, 2 * top)
    assert rc == 0, f"register_buffer: {rc}"
    # warm up outside the timed phases: the first transfer connects (ours, same host: maps the
    # member's segment, filling its page tables, a few hundred ms for 2 GiB)
    warm = f"{a.run}-c{idx}-warm"
    s.put_from(warm, base, 4096)
    s.get_into(warm, base + top, 4096)
    ring_bytes = parse_size(a.ring_bytes)
    results = []
    for size in sizes:
        ring = max(1, min(a.ops, ring_bytes // size))
        keys = [f"{a.run}-c{idx}-{size}-{j}" for j in range(ring)]
        for phase in ("put_from", "get_into"):
            barrier.wait()
            busy, n, err, t0 = 0.0, 0, 0, time.perf_counter()
            while n < a.ops and time.perf_counter() - t0 < a.max_seconds:
                k = keys[n % ring]
                if phase == "put_from":
                    if n >= ring:
                        remove(a, s, k)
                    t = time.perf_counter_ns()
                    r = s.put_from(k, base, size)
                    busy += (time.perf_counter_ns() - t) / 1e9
                    err += r != 0
                else:
                    t = time.perf_counter_ns()
                    r = s.get_into(k, base + top, size)
                    busy += (time.perf_counter_ns() - t) / 1e9
                    err += r != size
                    if n < ring and ctypes.string_at(base + top, size) != ctypes.string_at(base, size):
                        err += 1
                n += 1
            results.append(
                {
                    "op": phase,
                    "size": size,
                    "ops": n,
                    "errors": err,
                    "MB_per_s": (n - err) * size / busy / 1e6 if busy else 0.0,
                }
            )
        for k in keys:
            try:
                remove(a, s, k)
            except Exception:  # ours: still leased to the last read; it ages out
                pass
    s.close()
    out.put((idx, results))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", choices=["ours", "reference"], required=True)
    ap.add_argument("--leader", default="127.0.0.1:50051")
    ap.add_argument("--tenant", default="bench")
    ap.add_argument("--same-host", action="store_true")
    ap.add_argument("--spin-us", type=int, default=200)
    ap.add_argument("--master", default="127.0.0.1:50051")
    ap.add_argument("--mode", choices=["local", "remote"], default="remote")
    ap.add_argument("--segment-size", default="1GiB")
    ap.add_argument("--local-buffer", default="64MiB")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--sizes", default="64KiB,4MiB")
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--ring-bytes", default="128MiB")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    a.run = f"{os.getpid()}-{time.time_ns()}"
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(a.clients), ctx.Queue()
    procs = [ctx.Process(target=client, args=(a, i, barrier, out)) for i in range(a.clients)]
    for p in procs:
        p.start()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    agg = {}
    for _, rs in got:
        for r in rs:
            e = agg.setdefault(
                (r["op"], r["size"]),
                {"op": r["op"], "size": r["size"], "MB_per_s": 0.0, "ops": 0, "errors": 0, "clients": a.clients},
            )
            e["MB_per_s"] += r["MB_per_s"]
            e["ops"] += r["ops"]
            e["errors"] += r["errors"]
    res = sorted(agg.values(), key=lambda r: (r["size"], r["op"]))
    for r in res:
        r["MB_per_s"] = round(r["MB_per_s"], 1)
        print(
            f"  {a.store} x{a.clients} {r['op']:<9} {r['size'] >> 10:>5}KiB {r['MB_per_s']:>9.1f} MB/s"
            f" ops={r['ops']}" + (f" errors={r['errors']}" if r["errors"] else ""),
            flush=True,
        )
    if any(r["errors"] for r in res):
        print("  !! errors (refusals or other bytes read)", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
