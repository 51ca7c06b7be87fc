"""The prefill-to-decode handoff through the store, as vLLM's ``kv_transfer_params`` carry it.

A router asks a prefill replica for a request with ``{"do_remote_decode": true}``. That replica
saves every full prompt block into the store before it answers (its workers wait for those puts
in the step that completes the prompt), frees its blocks at once, and answers with
``{"kvcache_handoff": {"blocks": N, "bytes": B, "fingerprint": F}, "prompt_token_ids": [...]}``.
The router hands that object to a decode replica as its request's ``kv_transfer_params``: vLLM
takes the prompt's tokens from it (so both halves key the same tokens), and the decode's connector
reads the handoff: it looks the named blocks up like any prompt, loads those the store holds, and
computes the rest itself, counting them. ``F`` digests the namespaces and the chain's last hash, so
a decode whose keys would differ (another model, layout, salt or LoRA, or other tokens) says so
instead of silently recomputing.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("vllm." + __name__)

#: the key of our handoff in ``kv_transfer_params``
KEY = "kvcache_handoff"
#: the key a router sets to ask a prefill replica for a handoff (vLLM's own name for it)
REQUEST_KEY = "do_remote_decode"


def params_of(request: Any) -> dict[str, Any] | None:
    """The request's ``kv_transfer_params``, when it is a mapping."""
    params = getattr(request, "kv_transfer_params", None)
    return params if isinstance(params, dict) else None


def requested(request: Any) -> bool:
    """Whether a router asked this (prefill) request to hand its prompt over."""
    params = params_of(request)
    return bool(params and params.get(REQUEST_KEY) is True)


def fingerprint(namespaces: list[str], last_hash: str) -> str:
    """What names a chain of blocks wherever it is read: the shards' namespaces and the hash of
    its last block (which covers every block before it)."""
    text = "\x00".join([*namespaces, last_hash])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Handoff:
    """What a prefill replica handed over: its first ``blocks`` full prompt blocks are in the
    store (``bytes`` in all), under the chain ``fingerprint`` names (empty when it named none)."""

    blocks: int
    bytes: int
    fingerprint: str

    def params(self, prompt_token_ids: list[int] | None) -> dict[str, Any]:
        """The ``kv_transfer_params`` a prefill replica answers with."""
        out: dict[str, Any] = {KEY: {"blocks": self.blocks, "bytes": self.bytes, "fingerprint": self.fingerprint}}
        if prompt_token_ids:
            out["prompt_token_ids"] = list(prompt_token_ids)
        return out

    @staticmethod
    def of(request: Any) -> Handoff | None:
        """The handoff a (decode) request carries; ``None`` without one. One that does not parse is
        logged and read as none: the decode replica then computes the whole prompt."""
        params = params_of(request)
        if not params or KEY not in params:
            return None
        raw = params[KEY]
        try:
            blocks, size, fp = int(raw["blocks"]), int(raw["bytes"]), str(raw["fingerprint"])
        except (TypeError, KeyError, ValueError):
            logger.warning("kvcache.vllm: request %s carries a malformed %s; ignored", request.request_id, KEY)
            return None
        if blocks < 0 or size < 0:
            logger.warning("kvcache.vllm: request %s carries a negative %s; ignored", request.request_id, KEY)
            return None
        return Handoff(blocks, size, fp)
