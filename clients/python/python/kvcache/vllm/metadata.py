"""What the connector's sides hand each other through vLLM: each step's transfers (scheduler to
workers) and, once at start, each worker's page format (workers to scheduler, by vLLM's
connector handshake)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata, KVConnectorMetadata


@dataclass
class Transfer:
    """Blocks of one request to move: their chain hashes and vLLM block ids, in order."""

    req_id: str
    hashes: list[str]
    block_ids: list[int]


@dataclass
class KVCacheStoreMetadata(KVConnectorMetadata):
    """One step's work for the workers: blocks to load (asynchronously: the request waits in
    ``WAITING_FOR_REMOTE_KVS`` until every worker reports it in ``get_finished``), blocks to
    save once the step's forward has written them, and the requests whose prompt this step
    completes for a remote decode (``handoff``): the step ends only once every put of theirs has."""

    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)
    handoffs: list[str] = field(default_factory=list)


@dataclass
class KVCacheStoreHandshake(KVConnectorHandshakeMetadata):
    """A worker's page format (``keys.engine_format`` and ``Pages.signature``): the half of its
    key namespace only a worker can see."""

    page_format: str
