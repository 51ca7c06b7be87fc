"""The device check: our vLLM connector's worker side on a real device, without vLLM.

Run from the bundle ``scripts/device-check bundle`` makes (``python3 bench.py``; ``--help``):
starts a leader and a member (the bundle's ``kv-store``) on loopback; for an 8B-like and a
0.5B-like model builds the KV cache exactly as vLLM 0.32 allocates it (one buffer, a
``[layers, blocks, heads, tokens, content]`` logical view strided in each of vLLM's six physical
layouts, a ``[blocks, heads, tokens, content]`` view per layer) on the device; registers it with
the connector's ``WorkerSide``, saves 54 blocks, loads them into 54 other blocks, and checks the
bytes are equal; times the save (how long the step is held, and until the store has it), the
load (until the request would be reported loaded), and their split into device copies, network
and the rest (Python); then times recomputing a 3,500-token prefill with a randomly initialised
``LlamaForCausalLM`` of the same shape (``transformers``). Writes one JSON file of results.

On a machine without CUDA it runs the same on CPU tensors, with the 8B-like prefill skipped and
the 0.5B-like one on 64 tokens (``.ci/run`` runs it so): the wiring is proven here, the numbers
are the GPU's to give.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isdir(os.path.join(HERE, "lib")):
    # the bundle: its kvcache package, and the vLLM stand-in (vLLM is not installed there)
    sys.path.insert(0, os.path.join(HERE, "lib"))

import torch  # noqa: E402

from kvcache.vllm.keys import Layout  # noqa: E402
from kvcache.vllm.metadata import KVCacheStoreMetadata, Transfer  # noqa: E402
from kvcache.vllm.settings import Settings  # noqa: E402
from kvcache.vllm.worker import WorkerSide  # noqa: E402

#: vLLM 0.32's ``KVCacheLayout``: the physical order of the logical [L, B, H, N, C] axes
LAYOUTS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}
BLOCK = 64
BLOCKS = 54
PROMPT = 3500
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Shape:
    key: str
    name: str
    layers: int
    kv_heads: int
    head: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int

    @property
    def page_bytes(self) -> int:
        """One block of one layer: heads x tokens x (K and V of `head` bf16 values)."""
        return self.kv_heads * BLOCK * 2 * self.head * 2


SHAPES = [
    Shape("8b", "8B-like (Llama-3-8B)", 32, 8, 128, 4096, 32, 14336, 128256),
    Shape("0.5b", "0.5B-like (Qwen2.5-0.5B)", 24, 2, 64, 896, 14, 4864, 151936),
]


def kv_cache(
    shape: Shape, layout: str, num_blocks: int, device: torch.device
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The KV cache as vLLM 0.32 allocates it in `layout`: one int8 buffer and a bf16
    ``[B, H, N, C]`` view per layer, strided in the layout's physical order."""
    logical = (shape.layers, num_blocks, shape.kv_heads, BLOCK, 2 * shape.head * 2)
    strides, size = [0] * 5, 1
    for dim in reversed(LAYOUTS[layout]):
        strides[dim] = size
        size *= logical[dim]
    raw = torch.empty(size, dtype=torch.int8, device=device)
    raw.random_(-128, 128)
    whole = torch.as_strided(raw, logical, tuple(strides))
    return raw, [whole[i].view(DTYPE) for i in range(shape.layers)]


class StoreProcesses:
    """A leader and one member of `capacity` bytes on loopback, stopped by `stop`."""

    def __init__(self, kv_store: str, capacity: int, out: str):
        self.port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        gib = -(-capacity // (1 << 30))
        self.procs: list[subprocess.Popen[bytes]] = []
        self._start(
            out,
            "leader",
            [kv_store, "leader", "--listen", self.endpoint, "--tenant", f"bench={gib}Gi:{BLOCK}:bfloat16"],
        )
        _wait(lambda: _connects(self.port), "the leader's port")
        member_out = os.path.join(out, "member.out")
        self._start(
            out,
            "member",
            [kv_store, "member", "--leader", self.endpoint, "--capacity", f"{gib}Gi", "--name", "m0", "--no-prefault"],
        )
        _wait(lambda: '"state":"serving"' in open(member_out).read(), "the member serving")

    def _start(self, out: str, name: str, argv: list[str]) -> None:
        stdout = open(os.path.join(out, f"{name}.out"), "wb")
        stderr = open(os.path.join(out, f"{name}.err"), "wb")
        self.procs.append(subprocess.Popen(argv, stdout=stdout, stderr=stderr))

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connects(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(ready: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"device check: {what} did not happen within {timeout:g} s")
        time.sleep(0.05)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(since: float) -> float:
    return round(time.perf_counter() - since, 6)


def _worker(shape: Shape, layout: str, device: torch.device, endpoint: str) -> tuple[WorkerSide, list[str]]:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(shape.layers)]
    settings = Settings(
        endpoint=endpoint,
        tenant="bench",
        model="device-check",
        timeout_ms=120_000,
        retry_interval_s=5.0,
        staging=False,
        staging_blocks=None,
        same_host=True,
        report=False,
        report_interval_s=1.0,
    )
    describe = f"device-check;{shape.key};heads={shape.kv_heads};head={shape.head};block={BLOCK}"
    layout_of = Layout(BLOCK, "bfloat16", tuple(names), shape.page_bytes, describe, 0, 1)
    worker = WorkerSide(settings, layout_of, f"device={device.type};backend=device-check;layout={layout}")
    _wait(lambda: worker.link.store is not None, "the connector's connection")
    return worker, names


def case(shape: Shape, layout: str, device: torch.device, endpoint: str) -> dict[str, Any]:
    """One shape in one layout: save 54 blocks, load them elsewhere, compare, time, split."""
    raw, views = kv_cache(shape, layout, 2 * BLOCKS + 4, device)
    worker, names = _worker(shape, layout, device, endpoint)
    worker.register_kv_caches(dict(zip(names, views)))
    assert worker.pages is not None and worker.transfers is not None
    hashes = [hashlib.sha256(f"{shape.key}/{layout}/{i}".encode()).hexdigest()[:32] for i in range(BLOCKS)]
    src, dst = list(range(BLOCKS)), list(range(BLOCKS + 2, 2 * BLOCKS + 2))
    sync(device)
    t0 = time.perf_counter()
    worker.wait_for_save(KVCacheStoreMetadata(saves=[Transfer("save", hashes, src)]))
    sync(device)
    held = _seconds(t0)
    _wait(worker.transfers.idle, "the saves")
    saved = _seconds(t0)
    t0 = time.perf_counter()
    worker.start_load_kv(KVCacheStoreMetadata(loads=[Transfer("load", hashes, dst)]))
    submitted = _seconds(t0)
    done: set[str] = set()
    while "load" not in done:
        done |= worker.get_finished(set())[1] or set()
        time.sleep(0.0005)
    loaded = _seconds(t0)
    failed = worker.get_block_ids_with_load_errors()
    ids = (torch.tensor(src, device=device), torch.tensor(dst, device=device))
    # as integers: random bytes are NaNs as bf16, which never equal themselves
    equal = not failed and all(
        torch.equal(v.view(torch.int16).index_select(0, ids[0]), v.view(torch.int16).index_select(0, ids[1]))
        for v in views
    )
    split = _split(worker, hashes, src, dst, device)
    # nothing is removed: the store evicts the oldest cases' values (a read leases a value for
    # a few seconds, so a remove now would be refused)
    worker.close()
    del raw, views
    if device.type == "cuda":
        torch.cuda.empty_cache()
    value = worker.pages.value_bytes
    return {
        "shape": shape.key,
        "layout": layout,
        "blocks": BLOCKS,
        "value_bytes": value,
        "bytes": BLOCKS * value,
        "page_format": worker.page_format,
        "parts_per_block": worker.pages.parts_per_block,
        "loads": "by pointer" if worker.transfers.direct else "staged",
        "bytes_equal": bool(equal),
        "failed_blocks": len(failed),
        "save_step_held_s": held,
        "save_s": saved,
        "load_submit_s": submitted,
        "load_s": loaded,
        "save_gb_per_s": round(BLOCKS * value / saved / 1e9, 3),
        "load_gb_per_s": round(BLOCKS * value / loaded / 1e9, 3),
        "split": split,
    }


def _split(
    worker: WorkerSide, hashes: list[str], src: list[int], dst: list[int], device: torch.device
) -> dict[str, float]:
    """The same 54 blocks moved by each piece alone: device copies (gather and device-to-host;
    host-to-device and scatter) and network (puts and gets of the staged bytes), in the
    transfers' chunks. What the end-to-end times add beyond them is the rest (Python, waits)."""
    pages, transfers, store = worker.pages, worker.transfers, worker.link.store
    assert pages is not None and transfers is not None and store is not None
    slot, chunk, value = transfers.slots[0], transfers.chunk, pages.value_bytes
    out = {"gather_and_to_host_s": 0.0, "put_s": 0.0, "get_s": 0.0, "to_device_and_scatter_s": 0.0}
    keys = [f"{worker.namespace}/split-{h}" for h in hashes]
    for at in range(0, BLOCKS, chunk):
        n = min(chunk, BLOCKS - at)
        ids = torch.tensor(src[at : at + n], device=device)
        host = slot.host[: n * value]
        staged = slot.device[: n * value] if slot.device is not None else host
        sync(device)
        t0 = time.perf_counter()
        pages.gather(ids, staged)
        if staged is not host:
            host.copy_(staged)
        sync(device)
        out["gather_and_to_host_s"] += time.perf_counter() - t0
        ptrs, sizes = zip(*[pages.staged(host.data_ptr(), n, j) for j in range(n)])
        t0 = time.perf_counter()
        store.batch_put_from_parts(keys[at : at + n], list(ptrs), list(sizes), timeout_ms=120_000)
        out["put_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        store.batch_get_into_parts(keys[at : at + n], list(ptrs), list(sizes), timeout_ms=120_000)
        out["get_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        if staged is not host:
            staged.copy_(host)
        pages.scatter(torch.tensor(dst[at : at + n], device=device), staged)
        sync(device)
        out["to_device_and_scatter_s"] += time.perf_counter() - t0
    return {k: round(v, 6) for k, v in out.items()}


def recompute(shape: Shape, device: torch.device, tokens: int) -> dict[str, Any]:
    """Seconds to prefill `tokens` tokens with a random ``LlamaForCausalLM`` of `shape`
    (median of three, after a warm-up), logits of the last token only, as vLLM computes them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head,
        vocab_size=shape.vocab,
        max_position_embeddings=8192,
    )
    before = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(before)
    ids = torch.randint(0, shape.vocab, (1, tokens), device=device)
    times = []
    with torch.inference_mode():
        model(ids[:, :128], logits_to_keep=1)
        for _ in range(3):
            sync(device)
            t0 = time.perf_counter()
            model(ids, logits_to_keep=1)
            sync(device)
            times.append(time.perf_counter() - t0)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"shape": shape.key, "tokens": tokens, "prefill_s": round(statistics.median(times), 6), "runs_s": times}


def _cases(spec: str) -> list[tuple[Shape, str]]:
    shapes = {s.key: s for s in SHAPES}
    out = []
    for item in spec.split(","):
        key, _, layouts = item.partition(":")
        if key not in shapes:
            raise SystemExit(f"device check: no shape {key!r}; known: {sorted(shapes)}")
        names = list(LAYOUTS) if layouts in ("", "all") else layouts.split("+")
        unknown = [n for n in names if n not in LAYOUTS]
        if unknown:
            raise SystemExit(f"device check: no layout {unknown}; known: {list(LAYOUTS)}")
        out.extend((shapes[key], n) for n in names)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv-store", default=os.path.join(HERE, "bin", "kv-store"), help="the kv-store binary")
    ap.add_argument("--out", default=None, help="the results file (default: results/device-check-HOST-TIME.json)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--cases",
        default="8b:all,0.5b:all",
        help="SHAPE:LAYOUTS,... (LAYOUTS: all, or layout names joined by +), e.g. 0.5b:all,8b:LBNHC",
    )
    ap.add_argument("--expect-standin", action="store_true", help="fail unless vllm is the bundle's stand-in")
    a = ap.parse_args()
    import vllm

    if a.expect_standin and not os.path.abspath(vllm.__file__).startswith(os.path.join(HERE, "lib")):
        raise SystemExit(f"device check: vllm came from {vllm.__file__}, not the bundle's stand-in")
    cases = _cases(a.cases)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = a.out or os.path.join(HERE, "results", f"device-check-{platform.node()}-{stamp}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    logs = tempfile.mkdtemp(prefix="device-check-")
    biggest = max(s.page_bytes * s.layers for s in SHAPES) * BLOCKS
    # room for three cases of the biggest shape (each stores its blocks twice)
    store = StoreProcesses(a.kv_store, 6 * biggest, logs)
    result: dict[str, Any] = {
        "started": stamp,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "vllm": vllm.__file__,
        "shapes": [asdict(s) for s in SHAPES],
        "cases": [],
        "recompute": [],
    }
    try:
        for shape, layout in cases:
            c = case(shape, layout, device, store.endpoint)
            print(json.dumps({k: c[k] for k in ("shape", "layout", "bytes_equal", "save_s", "load_s")}), flush=True)
            result["cases"].append(c)
        for shape in SHAPES:
            if cuda:
                result["recompute"].append(recompute(shape, device, PROMPT))
            elif shape.key == "0.5b":
                result["recompute"].append(recompute(shape, device, 64))
            else:
                result["recompute"].append({"shape": shape.key, "skipped": "too slow on a CPU"})
    finally:
        store.stop()
    result["all_bytes_equal"] = all(c["bytes_equal"] for c in result["cases"])
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"device check: {len(result['cases'])} cases, bytes equal: {result['all_bytes_equal']}; results in {out}")
    if not result["all_bytes_equal"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
