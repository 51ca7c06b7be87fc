"""One vLLM replica of the time-to-first-token benchmark (``vllm_ttft.sh`` runs it): vLLM's
offline ``LLM`` on this CPU, serving PROMPTS prompts of about 3,500 tokens each, every one with a
prefix of its own, with one of four caches behind it:

- ``none``: no connector (every prompt recomputed);
- ``kvcache``: our connector (``kvcache.vllm``) on our store (``KVSTORE_*`` in the environment);
- ``kvcache-disk``: the same connector on a store whose member holds a fraction of the prompts in
  memory and the rest on its disk tier, so replica B's prefixes come from disk;
- ``example``: vLLM's in-tree ``ExampleConnector`` (KV to files under ``--files``);
- ``mooncake``: vLLM's in-tree ``MooncakeStoreConnector`` on the reference store
  (``MOONCAKE_CONFIG_PATH`` in the environment).

``--role writer`` serves each prompt once (replica A: the connector stores its KV); ``--role
reader`` (replica B, another process) first warms up on prompts of its own, then times each of
the same prompts with one output token: the time to its first token; then each again, now from
its own prefix cache (the floor of any connector: no transfer at all). Prints one JSON line:
mode, role, the times, and the tokens vLLM took from the connector per prompt.
"""

import argparse
import json
import random
import statistics
import sys
import time

WORDS_SEED = 424242


def prompts(n, seed):
    """`n` prompts of about 3,500 tokens (1,100 words of the model's generated vocabulary), no
    two sharing a prefix."""
    rng = random.Random(WORDS_SEED)
    words = ["".join(rng.choice("abcdefghij") for _ in range(5)) for _ in range(500)]
    out = []
    for i in range(n):
        r = random.Random(seed * 1000 + i)
        out.append(" ".join(r.choice(words) for _ in range(1100)) + f" question {i}")
    return out


def transfer_config(mode, files):
    if mode == "none":
        return None
    if mode in ("kvcache", "kvcache-disk"):
        return {
            "kv_connector": "KVCacheStoreConnector",
            "kv_connector_module_path": "kvcache.vllm",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
        }
    if mode == "example":
        return {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": files},
        }
    if mode == "mooncake":
        return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}
    raise SystemExit(f"unknown mode {mode}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", required=True, choices=["none", "kvcache", "kvcache-disk", "example", "mooncake"])
    ap.add_argument("--role", required=True, choices=["writer", "reader"])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--files", default="/tmp/kvcache-bench-files")
    a = ap.parse_args()

    from vllm import LLM, SamplingParams

    kw = {}
    cfg = transfer_config(a.mode, a.files)
    if cfg is not None:
        kw["kv_transfer_config"] = cfg
    llm = LLM(
        model=a.model,
        dtype="bfloat16",
        kv_cache_dtype="bfloat16",
        block_size=64,
        max_model_len=4096,
        enforce_eager=True,
        disable_log_stats=False,
        **kw,
    )
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    timed = prompts(a.prompts, seed=1)
    if a.role == "writer":
        for p in timed:
            llm.generate([p], one, use_tqdm=False)
        # let asynchronous savers finish before the process ends
        time.sleep(2)
        print(json.dumps({"mode": a.mode, "role": a.role, "prompts": len(timed)}), flush=True)
        return
    for p in prompts(3, seed=2):
        llm.generate([p], one, use_tqdm=False)
    ttft, cached, lengths = [], [], []
    for p in timed:
        t = time.perf_counter()
        out = llm.generate([p], one, use_tqdm=False)[0]
        ttft.append(time.perf_counter() - t)
        cached.append(out.num_cached_tokens or 0)
        lengths.append(len(out.prompt_token_ids))
    # the floor: the same prompts again, now in this replica's own prefix cache (no transfer)
    local = []
    for p in timed:
        t = time.perf_counter()
        llm.generate([p], one, use_tqdm=False)
        local.append(time.perf_counter() - t)
    cfg = llm.llm_engine.vllm_config.model_config.hf_config
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    print(
        json.dumps(
            {
                "mode": a.mode,
                "role": a.role,
                "ttft_s": ttft,
                "p50_s": statistics.median(ttft),
                "prompt_tokens": statistics.median(lengths),
                "cached_tokens": cached,
                "kv_bytes_per_request": statistics.median(cached) * per_token,
                "local_ttft_s": local,
                "local_p50_s": statistics.median(local),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
