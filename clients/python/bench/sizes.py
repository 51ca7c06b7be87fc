"""Sizes as the benchmarks take them on the command line ("64KiB", "1MiB", "4096"), shared by
bench.py and concurrent.py (which also runs under the reference's environment, so this module
imports nothing of ours)."""


def parse_size(s):
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "b": 1}
    low = s.strip().lower()
    for u in sorted(units, key=len, reverse=True):
        if low.endswith(u):
            return int(float(low[: -len(u)]) * units[u])
    return int(s)
