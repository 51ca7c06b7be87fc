"""The load ``vllm_pd.sh`` sends through kv-router, and the table it prints.

``--router URL --model M --layout NAME``: REQUESTS streamed completions (about 3,000-token prompts;
half of them in groups of four sharing a 2,000-token prefix, the other half of their own),
CONCURRENCY at a time, OUTPUT_TOKENS each (``ignore_eos``); prints one JSON object: each request's
time to first token and mean time per output token after it, and the router's handoff counters.
``--table FILE...``: the table of those objects, one row per layout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

REQUESTS = int(os.environ.get("REQUESTS", "40"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "4"))
OUTPUT_TOKENS = int(os.environ.get("OUTPUT_TOKENS", "64"))


def words(rng: random.Random, n: int) -> str:
    vocabulary = ["".join(rng.choice("abcdefghij") for _ in range(5)) for _ in range(400)]
    return " ".join(rng.choice(vocabulary) for _ in range(n))


def prompts() -> list[str]:
    """Half in groups of four sharing a ~2,000-token prefix, half of their own; ~3,000 tokens each
    (about 3.2 tokens per five-letter word with this tokenizer)."""
    rng = random.Random(7)
    out = []
    shared = [words(rng, 620) for _ in range(REQUESTS // 8 + 1)]
    for i in range(REQUESTS):
        if i % 2 == 0:
            out.append(f"{shared[(i // 2) // 4]} {words(rng, 310)} question {i}?")
        else:
            out.append(f"{words(rng, 930)} question {i}?")
    return out


def one(router: str, model: str, prompt: str) -> dict[str, float]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"{router}/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    began = time.monotonic()
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.monotonic()
                first = first if first is not None else now
                last = now
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if first is None or last is None:
        raise RuntimeError("no token arrived")
    return {"ttft_s": first - began, "tpot_s": (last - first) / max(1, tokens - 1), "tokens": tokens}


def counter(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and "_created" not in line and not line.startswith("#")
    )


def load(router: str, model: str, layout: str) -> None:
    ps = prompts()
    began = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(lambda p: one(router, model, p), ps))
    print(
        json.dumps(
            {
                "layout": layout,
                "requests": len(results),
                "concurrency": CONCURRENCY,
                "output_tokens": OUTPUT_TOKENS,
                "wall_s": time.monotonic() - began,
                "ttft_s": [r["ttft_s"] for r in results],
                "tpot_s": [r["tpot_s"] for r in results],
                "handoffs": counter(router, "kvrouter_handoffs_total"),
                "handoff_bytes": counter(router, "kvrouter_handoff_bytes_total"),
                "fallbacks": counter(router, "kvrouter_fallbacks_total"),
            }
        )
    )


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def table(files: list[str]) -> None:
    rows = [json.load(open(f)) for f in files]
    names = {
        "pd": "1 prefill + 1 decode (handoff via store)",
        "pd-both": "1 prefill + 1 decode (decode kv_both)",
        "servers": "2 server replicas (least loaded)",
    }
    first = rows[0]
    print(
        f"{first['requests']} streamed requests, ~3,000-token prompts (half share 2,000-token prefixes), "
        f"{first['output_tokens']} output tokens, concurrency {first['concurrency']}, behind kv-router"
    )
    print(f"{'':42} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'wall':>7} {'MB handed/req':>14}")
    for r in rows:
        handed = r["handoff_bytes"] / r["handoffs"] / 1e6 if r["handoffs"] else 0.0
        print(
            f"{names.get(r['layout'], r['layout']):42} "
            f"{pct(r['ttft_s'], 50) * 1000:7.0f}ms {pct(r['ttft_s'], 99) * 1000:7.0f}ms "
            f"{pct(r['tpot_s'], 50) * 1000:7.1f}ms {pct(r['tpot_s'], 99) * 1000:7.1f}ms "
            f"{r['wall_s']:6.0f}s {handed:14.1f}"
        )
    fallbacks = ", ".join("{} {:.0f}".format(r["layout"], r["fallbacks"]) for r in rows)
    means = ", ".join("{} {:.0f}ms".format(r["layout"], statistics.mean(r["ttft_s"]) * 1000) for r in rows)
    print(f"(router fallbacks: {fallbacks}; TTFT mean: {means})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--router")
    ap.add_argument("--model")
    ap.add_argument("--layout")
    ap.add_argument("--table", nargs="+")
    a = ap.parse_args()
    if a.table:
        table(a.table)
    else:
        load(a.router, a.model, a.layout)


if __name__ == "__main__":
    sys.exit(main())
