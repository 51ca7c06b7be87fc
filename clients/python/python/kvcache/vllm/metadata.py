"""What the scheduler side hands the worker side each step (vLLM carries it between processes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass
class Transfer:
    """Blocks of one request to move: their chain hashes and vLLM block ids, in order."""

    req_id: str
    hashes: list[str]
    block_ids: list[int]


@dataclass
class KVCacheStoreMetadata(KVConnectorMetadata):
    """One step's work for the workers: blocks to load before the forward, to save after it."""

    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)
