"""The keys blocks are stored under, the same on the scheduler and every worker.

A prompt's full blocks are chained: ``h0 = sha256(scheme, model, cache salt, LoRA)``,
``h(i) = sha256(h(i-1), tokens of block i)``, so a block's key names its whole prefix. The
namespace names the model, the KV layout and the shard of tensor-parallel ranks, so shards and
layouts never read each other's bytes. The layout has two halves: what the engine's
configuration says (``Layout``: heads, head size, block size, dtypes, layers) and what only a
worker sees once its cache exists (its "page format": device, attention backends, vLLM's
resolved ``KVCacheLayout``, the CPU backend's packing, and the page's byte order found from the
cache's strides). Workers hand their format to the scheduler through vLLM's connector handshake.

Ranks that hold the same KV (MLA's one latent cache, or more ranks than KV heads) form one
shard: they share one key space, every rank of it loads, and only its first rank saves, so no
value is stored twice. One value per block: its page of every layer, in layer order, under
``<namespace>/<h(i)>``.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

#: bumped when the key scheme or the value format changes: old values are then never read
KEY_SCHEME = "kvcache-vllm-3"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _cpu_packing(dtype: torch.dtype, block_size: int, head_size: int) -> str:
    """How the CPU attention backend packs a block's interior on this machine (it depends on
    the instruction set): part of the format, so machines that pack differently never share."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(dtype, block_size, head_size))
    except Exception as e:  # noqa: BLE001 - any failure: a format of its own
        return f"unknown-{type(e).__name__}"


def attention_backends(vllm_config: VllmConfig, layer_names: list[str]) -> str:
    """The attention backends of `layer_names`, as this worker's model runs them."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase, layer_names)  # type: ignore[type-abstract]
    names = sorted({layer.get_attn_backend().get_name() for layer in layers.values()})
    if not names:
        raise ValueError("kvcache.vllm: the worker's model has no attention layers for its KV cache")
    return "+".join(names)


def engine_format(vllm_config: VllmConfig, layout: Layout) -> str:
    """What of a page's format a worker knows from its engine (``Pages.signature`` adds the
    byte order): device, attention backends, resolved KV cache layout, the CPU's packing."""
    from vllm.platforms import current_platform

    device = current_platform.device_type
    parts = [
        f"device={device}",
        f"backend={attention_backends(vllm_config, list(layout.layers))}",
        f"layout={getattr(vllm_config.cache_config, 'kv_cache_layout', None) or 'default'}",
    ]
    if device == "cpu":
        parts.append(f"packing={layout.packing}")
    return ";".join(parts)


def _replicas(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, spec: Any, tp_size: int) -> int:
    """Consecutive tensor-parallel ranks that hold the same KV: vLLM's count (MLA declares one
    shard), or as many as the ranks beyond the model's KV heads."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    replicas = int(getattr(kv_cache_config, "kv_tp_replicas", 1) or 1)
    if isinstance(spec, MLAAttentionSpec):
        replicas = tp_size
    else:
        total = getattr(vllm_config.model_config, "get_total_num_kv_heads", None)
        heads = total() if callable(total) else 0
        if heads and tp_size > heads:
            replicas = max(replicas, tp_size // heads)
    if replicas < 1 or tp_size % replicas:
        raise ValueError(f"kvcache.vllm: {replicas} replicas of the KV cache do not divide {tp_size} ranks")
    return replicas


@dataclass(frozen=True)
class Layout:
    """The KV layout blocks are stored in, as the engine's configuration gives it (the same on
    the scheduler and every worker)."""

    block_size: int
    dtype: str
    layers: tuple[str, ...]
    #: bytes of one block of one layer, as the KV cache spec says
    page_bytes: int
    #: everything of the configuration that must match for bytes to be reusable, as one string
    describe: str
    tp_rank: int
    tp_size: int
    #: consecutive ranks holding the same KV (1: every rank its own)
    replicas: int = 1
    #: the CPU backend's packing (``engine_format`` names it on a CPU)
    packing: str = ""

    @staticmethod
    def of(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, tp_rank: int) -> Layout:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        par = vllm_config.parallel_config
        if par.pipeline_parallel_size > 1:
            raise ValueError("kvcache.vllm does not support pipeline parallelism yet (pipeline_parallel_size > 1)")
        if getattr(par, "decode_context_parallel_size", 1) > 1:
            raise ValueError("kvcache.vllm does not support decode context parallelism yet")
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise ValueError(
                f"kvcache.vllm stores one group of full-attention layers; this model has "
                f"{len(groups)} KV cache groups (a hybrid model vLLM cannot run without its hybrid "
                "KV cache manager, which this connector does not support): run it without the connector"
            )
        spec = groups[0].kv_cache_spec
        if not isinstance(spec, FullAttentionSpec):
            raise ValueError(
                f"kvcache.vllm supports paged full-attention KV caches (MLA too); this model's is {type(spec).__name__}"
            )
        if getattr(spec, "tokens_per_state", 1) != 1 or getattr(spec, "model_version", None):
            raise ValueError(
                "kvcache.vllm supports KV caches of one state per token; this model compresses tokens "
                f"({type(spec).__name__}, tokens_per_state={getattr(spec, 'tokens_per_state', 1)})"
            )
        from vllm.platforms import current_platform

        dtype = spec.dtype
        on_cpu = current_platform.device_type == "cpu"
        describe = ";".join(
            [
                KEY_SCHEME,
                f"spec={type(spec).__name__}",
                f"kv_heads={spec.num_kv_heads}",
                f"head={spec.head_size}",
                f"head_v={getattr(spec, 'head_size_v', spec.head_size)}",
                f"block={spec.block_size}",
                f"dtype={_dtype_name(dtype)}",
                f"cache_dtype={vllm_config.cache_config.cache_dtype}",
                f"page={spec.page_size_bytes}",
                f"layers={len(groups[0].layer_names)}",
            ]
        )
        return Layout(
            block_size=spec.block_size,
            dtype=_dtype_name(dtype),
            layers=tuple(groups[0].layer_names),
            page_bytes=spec.page_size_bytes,
            describe=describe,
            tp_rank=tp_rank,
            tp_size=par.tensor_parallel_size,
            replicas=_replicas(vllm_config, kv_cache_config, spec, par.tensor_parallel_size),
            packing=_cpu_packing(dtype, spec.block_size, spec.head_size) if on_cpu else "",
        )

    @property
    def shards(self) -> int:
        """Distinct key spaces across the ranks."""
        return self.tp_size // self.replicas

    @property
    def shard(self) -> int:
        """This rank's key space."""
        return self.tp_rank // self.replicas

    @property
    def saves(self) -> bool:
        """Whether this rank stores its shard's blocks (only the first rank of a shard does)."""
        return self.tp_rank % self.replicas == 0

    def namespace(self, model: str, page_format: str, shard: int | None = None) -> str:
        """The key prefix of one shard's blocks: model, a digest of the layout (configuration and
        page format), the shard."""
        digest = hashlib.sha256(f"{self.describe};{page_format}".encode()).hexdigest()[:16]
        s = self.shard if shard is None else shard
        return f"vllm/{model}/{digest}/tp{s}of{self.shards}"


def chain(seed: bytes, tokens: list[int], block_size: int, blocks: int) -> list[str]:
    """The hex hashes of the first `blocks` full blocks of `tokens`, each covering its prefix."""
    out = []
    h = hashlib.sha256(seed).digest()
    for i in range(blocks):
        part = tokens[i * block_size : (i + 1) * block_size]
        h = hashlib.sha256(h + struct.pack(f"<{len(part)}q", *part)).digest()
        out.append(h.hex()[:32])
    return out


def seed(model: str, cache_salt: str = "", lora_name: str = "") -> bytes:
    """What a chain starts from: the key scheme, the model, the cache salt and the LoRA. The
    layout is not in it: the namespace every key starts with separates layouts already, so a
    router that reads the namespaces from the store's keys computes the same chain from the
    same tokens (kv-router's ``keys.rs``, pinned by the same vector as ``test_vllm``)."""
    return "\x00".join([KEY_SCHEME, model, f"salt={cache_salt}", f"lora={lora_name}"]).encode()


def request_seed(request: Request, model: str) -> bytes | None:
    """What a request's chain starts from (:func:`seed`); ``None`` when the request cannot be
    served from the cache (multimodal inputs, prompt embeddings)."""
    if getattr(request, "mm_features", None) or request.prompt_token_ids is None:
        return None
    if getattr(request, "prompt_embeds", None) is not None:
        return None
    lora = getattr(request, "lora_request", None)
    return seed(model, getattr(request, "cache_salt", None) or "", getattr(lora, "lora_name", "") if lora else "")


def block_key(namespace: str, block_hash: str) -> str:
    """The key of one block's value: its page of every layer, in layer order."""
    return f"{namespace}/{block_hash}"
