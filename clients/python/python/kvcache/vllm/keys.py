"""The keys blocks are stored under, the same on the scheduler and every worker.

A prompt's full blocks are chained: ``h0 = sha256(namespace, cache salt, LoRA)``,
``h(i) = sha256(h(i-1), tokens of block i)``, so a block's key names its whole prefix. The
namespace names the model, the KV layout (attention backend and its packing, heads, head size,
block size, dtype, layer shape) and the tensor-parallel rank, so ranks and layouts never read
each other's bytes. One value per block: its page of every layer, in layer order, under
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
KEY_SCHEME = "kvcache-vllm-1"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _cpu_packing(dtype: torch.dtype, block_size: int, head_size: int) -> str:
    """How the CPU attention backend packs a block's interior on this machine (it depends on
    the instruction set): part of the layout, so machines that pack differently never share."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(dtype, block_size, head_size))
    except Exception as e:  # noqa: BLE001 - any failure: a layout of its own
        return f"unknown-{type(e).__name__}"


@dataclass(frozen=True)
class Layout:
    """The KV layout blocks are stored in, the same on the scheduler and every worker."""

    block_size: int
    dtype: str
    layers: tuple[str, ...]
    #: bytes of one block of one layer
    page_bytes: int
    #: everything that must match for bytes to be reusable, as one string
    describe: str
    tp_rank: int
    tp_size: int

    @staticmethod
    def of(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, tp_rank: int) -> Layout:
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

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
        if isinstance(spec, MLAAttentionSpec) or not isinstance(spec, FullAttentionSpec):
            raise ValueError(
                f"kvcache.vllm supports paged full-attention KV caches; this model's is {type(spec).__name__}"
            )
        from vllm.platforms import current_platform

        device = current_platform.device_type
        dtype = spec.dtype
        packing = _cpu_packing(dtype, spec.block_size, spec.head_size) if device == "cpu" else device
        describe = ";".join(
            [
                KEY_SCHEME,
                f"device={device}",
                f"packing={packing}",
                f"kv_heads={spec.num_kv_heads}",
                f"head={spec.head_size}",
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
        )

    def namespace(self, model: str, rank: int | None = None) -> str:
        """The key prefix of one rank's blocks: model, a digest of the layout, the rank."""
        digest = hashlib.sha256(self.describe.encode()).hexdigest()[:16]
        r = self.tp_rank if rank is None else rank
        return f"vllm/{model}/{digest}/tp{r}of{self.tp_size}"


def chain(seed: bytes, tokens: list[int], block_size: int, blocks: int) -> list[str]:
    """The hex hashes of the first `blocks` full blocks of `tokens`, each covering its prefix."""
    out = []
    h = hashlib.sha256(seed).digest()
    for i in range(blocks):
        part = tokens[i * block_size : (i + 1) * block_size]
        h = hashlib.sha256(h + struct.pack(f"<{len(part)}q", *part)).digest()
        out.append(h.hex()[:32])
    return out


def request_seed(request: Request, model: str, layout: Layout) -> bytes | None:
    """What a request's chain starts from (model, layout, cache salt, LoRA); ``None`` when the
    request cannot be served from the cache (multimodal inputs, prompt embeddings)."""
    if getattr(request, "mm_features", None) or request.prompt_token_ids is None:
        return None
    if getattr(request, "prompt_embeds", None) is not None:
        return None
    lora = getattr(request, "lora_request", None)
    parts = [
        KEY_SCHEME,
        model,
        layout.describe,
        f"salt={getattr(request, 'cache_salt', None) or ''}",
        f"lora={getattr(lora, 'lora_name', '') if lora else ''}",
    ]
    return "\x00".join(parts).encode()


def block_key(namespace: str, block_hash: str) -> str:
    """The key of one block's value: its page of every layer, in layer order."""
    return f"{namespace}/{block_hash}"
