"""Reads compare.sh's output directory and prints ours vs the reference, per round, with ratios,
and, with TLS, our 4 MiB put and get against the machine's crypto bound measured in the same round
(AES-128-GCM seal and open through ring on two threads, nothing else; goal: at least 90% of it),
with the median over the rounds, and beside it how fast our TLS record layer alone moves a value
over loopback (not a bound: the store sometimes passes it).

For the reference, each op is compared with its *best* single-key API row (put_from or
put(bytes), get_into or get(bytes)), so the ratio is never flattered by a slow API choice.
"""
import json
import os
import statistics
import sys

out, rounds = sys.argv[1], int(sys.argv[2])
GOALS = {("put", 4 << 20): ("bytes_per_s", 2.0), ("get", 4 << 20): ("bytes_per_s", 2.0),
         ("put", 64 << 10): ("ops_per_s", 2.0), ("get", 64 << 10): ("ops_per_s", 2.0)}


def ref_rows(path):
    rows = json.load(open(path))["results"]
    best = {}
    for r in rows:
        if r.get("items_per_op", 1) != 1:
            continue
        op = {"put_from": "put", "put(bytes)": "put", "get_into": "get", "get(bytes)": "get",
              "is_exist": "exists"}.get(r["op"])
        if not op:
            continue
        key = (op, r["size"])
        row = {"ops_per_s": r["ops_per_s"], "bytes_per_s": r["MB_per_s"] * 1e6, "p50_us": r["p50_us"],
               "p99_us": r["p99_us"], "api": r["op"]}
        if key not in best or row["ops_per_s"] > best[key]["ops_per_s"]:
            best[key] = row
    return best


of_bound = {}
for r in range(1, rounds + 1):
    ref = ref_rows(f"{out}/ref{r}/mooncake_remote.json")
    ours = {}
    for line in open(f"{out}/ours{r}.jsonl"):
        d = json.loads(line)
        ours[(d["op"], d["size"])] = d
    # the reference measures is_exist once, in its 64 KiB run; so do we compare our 64 KiB run's
    ex = ours[("exists", 64 << 10)]
    print(f"round {r}")
    print(f"{'op':7} {'size':>8} | {'ours ops/s':>10} {'MB/s':>7} {'p50us':>7} | {'ref ops/s':>10} {'MB/s':>7} "
          f"{'p50us':>7} {'ref api':>11} | ratio")
    for (op, size) in sorted(ours, key=lambda k: (k[1], k[0])):
        if op == "exists":
            continue
        o, f = ours[(op, size)], ref.get((op, size))
        if not f:
            continue
        ratio = o["ops_per_s"] / f["ops_per_s"]
        goal = GOALS.get((op, size))
        mark = "" if not goal else (" (goal 2x: " + ("met" if ratio >= goal[1] else "MISSED") + ")")
        print(f"{op:7} {size:>8} | {o['ops_per_s']:>10.0f} {o['bytes_per_s'] / 1e6:>7.0f} {o['p50_us']:>7.0f} | "
              f"{f['ops_per_s']:>10.0f} {f['bytes_per_s'] / 1e6:>7.0f} {f['p50_us']:>7.0f} {f['api']:>11} | "
              f"{ratio:.2f}x{mark}")
    f = ref[("exists", 0)]
    ratio = ex["p50_us"] / f["p50_us"]
    print(f"exists {'':>8} | p50 {ex['p50_us']:.0f} us (ours) vs {f['p50_us']:.0f} us (ref) | "
          f"{ratio:.2f} of the reference (goal <= 0.5: {'met' if ratio <= 0.5 else 'MISSED'})")
    bound_file = f"{out}/bound{r}.jsonl"
    if os.path.exists(bound_file):
        bound = {json.loads(line)["op"]: json.loads(line) for line in open(bound_file)}
        crypto = bound.get("crypto_bound")
        for op in ("put", "get"):
            o, t = ours.get((op, 4 << 20)), bound.get(f"tls_bound_{op}")
            if not (o and crypto):
                continue
            share = o["bytes_per_s"] / crypto["bytes_per_s"]
            of_bound.setdefault(op, []).append(share)
            layer = f"; our record layer alone {t['bytes_per_s'] / 1e6:.0f} MB/s" if t else ""
            print(f"{op:7} {4 << 20:>8} | ours {o['bytes_per_s'] / 1e6:.0f} MB/s vs the crypto bound "
                  f"{crypto['bytes_per_s'] / 1e6:.0f} MB/s | {share:.0%} of it{layer}")
    print()
for op, shares in sorted(of_bound.items()):
    med = statistics.median(shares)
    print(f"4 MiB {op}: median {med:.0%} of the crypto bound over {len(shares)} rounds "
          f"({', '.join(f'{x:.0%}' for x in shares)}); goal >= 90%: {'met' if med >= 0.9 else 'MISSED'}")
