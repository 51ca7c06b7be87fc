"""What the connector reads from ``kv_connector_extra_config`` and the environment, checked once
at start (both sides read the same)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig

DEFAULT_TIMEOUT_MS = 2000
DEFAULT_RETRY_INTERVAL_S = 5.0

#: the keys ``kv_connector_extra_config`` may hold; any other is refused
KNOWN_KEYS = frozenset(
    {"endpoint", "tenant", "model", "timeout_ms", "retry_interval_s", "staging", "staging_blocks", "same_host"}
)


@dataclass(frozen=True)
class Settings:
    """What the connector reads from ``kv_connector_extra_config`` and the environment."""

    endpoint: str | None
    tenant: str | None
    model: str
    timeout_ms: int
    retry_interval_s: float
    #: stage loads through host slots even on a CPU (as on a GPU)
    staging: bool
    #: blocks per staging chunk (``None``: as many as 64 MiB holds)
    staging_blocks: int | None
    same_host: bool
    report: bool
    report_interval_s: float

    @staticmethod
    def read(vllm_config: VllmConfig) -> Settings:
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        if "credential" in extra:
            raise ValueError("kvcache.vllm: the credential comes from KVSTORE_CREDENTIAL only, never the command line")
        unknown = sorted(set(extra) - KNOWN_KEYS)
        if unknown:
            raise ValueError(
                f"kvcache.vllm: unknown kv_connector_extra_config keys {unknown}; known: {sorted(KNOWN_KEYS)}"
            )
        endpoint = extra.get("endpoint") or None
        if not endpoint and not (os.environ.get("KVSTORE_LEADER") or os.environ.get("MOONCAKE_MASTER")):
            raise ValueError(
                "kvcache.vllm: no store configured: set KVSTORE_LEADER (and KVSTORE_TENANT, "
                'KVSTORE_BLOCK_SIZE, KVSTORE_DTYPE), or put "endpoint": "HOST:PORT" in '
                "kv_connector_extra_config"
            )
        served = vllm_config.model_config.served_model_name
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        model = str(extra.get("model") or served or vllm_config.model_config.model)
        staging_blocks = int(extra["staging_blocks"]) if "staging_blocks" in extra else None
        if staging_blocks is not None and staging_blocks < 1:
            raise ValueError(f"kvcache.vllm: staging_blocks must be at least 1, got {staging_blocks}")
        return Settings(
            endpoint=endpoint,
            tenant=extra.get("tenant"),
            model=model,
            timeout_ms=int(extra.get("timeout_ms", DEFAULT_TIMEOUT_MS)),
            retry_interval_s=float(extra.get("retry_interval_s", DEFAULT_RETRY_INTERVAL_S)),
            staging=bool(extra.get("staging", False)),
            staging_blocks=staging_blocks,
            same_host=bool(extra.get("same_host", True)),
            report=os.environ.get("KVSTORE_REPORT", "") == "stdout",
            report_interval_s=float(os.environ.get("KVSTORE_REPORT_INTERVAL", "1")),
        )
