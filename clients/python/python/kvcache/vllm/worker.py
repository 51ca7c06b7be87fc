"""The worker side: moves blocks between vLLM's KV cache and the store, as the scheduler planned,
without holding the engine's step for the network (``transfers``).

At ``register_kv_caches`` the cache's pages are found from its views' strides (``pages``), for
whichever layout vLLM resolved; that page format completes this worker's key namespace and goes
to the scheduler through vLLM's handshake (``get_handshake_metadata``). Each step then hands
loads and saves to ``Transfers``: loads are asynchronous (the request waits in
``WAITING_FOR_REMOTE_KVS`` until ``get_finished`` reports it, with any block that failed in
``get_block_ids_with_load_errors`` for vLLM to recompute), saves are gathered at the end of the
step and put on a thread (never those of a step whose forward raised: its pages were not
computed); a step that completes a prompt handed to a remote decode ends only once that
request's puts have (``metadata.handoffs``). A rank that replicates another's KV
(``Layout.saves`` false) loads but never saves.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING

import torch

from .. import Store
from .keys import Layout, block_key
from .link import Link
from .metadata import KVCacheStoreHandshake, KVCacheStoreMetadata
from .pages import Pages
from .settings import Settings
from .stats import Counters
from .transfers import SLOT_BYTES, Transfers

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

logger = logging.getLogger("vllm." + __name__)


class WorkerSide:
    """A worker's half of the connector: its own connection (which its staging slots, or the
    KV cache itself, are registered with), its shard's namespace once its cache is registered,
    the movers, and counters. `engine_format` is what the engine says of the page format
    (``keys.engine_format``)."""

    def __init__(self, settings: Settings, layout: Layout, engine_format: str):
        self.settings = settings
        self.layout = layout
        self.engine_format = engine_format
        self.counters = Counters()
        self.link = Link.of(settings, layout)
        self.pages: Pages | None = None
        self.transfers: Transfers | None = None
        #: the page format and where this shard's blocks are stored, once the cache is registered
        self.page_format: str | None = None
        self.namespace: str | None = None
        #: blocks whose load failed, not yet reported to vLLM
        self._invalid: set[int] = set()
        self.link.start()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.layout.layers if n not in kv_caches]
        if missing:
            raise ValueError(f"kvcache.vllm: the worker has no KV cache for layers {missing}")
        tensors = [kv_caches[n] for n in self.layout.layers]
        pages = Pages.of(list(self.layout.layers), tensors, self.layout.block_size, self.layout.page_bytes)
        self.pages = pages
        self.page_format = f"{self.engine_format};{pages.signature}"
        self.namespace = self.layout.namespace(self.settings.model, self.page_format)
        direct = pages.device.type == "cpu" and not self.settings.staging
        chunk = self.settings.staging_blocks or max(1, SLOT_BYTES // pages.value_bytes)
        self.transfers = Transfers(pages, self.link, self.counters, self.settings.timeout_ms, chunk, direct)
        logger.info(
            "kvcache.vllm worker: %d layers, pages of %d bytes (%s), loads %s, %d-block chunks%s",
            len(tensors),
            pages.page_bytes,
            self.page_format,
            "by pointer" if direct else "staged",
            chunk,
            "" if self.layout.saves else f"; rank {self.layout.tp_rank} replicates shard {self.layout.shard}: no saves",
        )
        self.link.attach(self._registered)

    def _registered(self, store: Store) -> None:
        """Registers the memory values move from and into with a (new) connection."""
        assert self.transfers is not None
        for ptr, size in self.transfers.memory():
            store.register_buffer(ptr, size)

    def get_handshake_metadata(self) -> KVCacheStoreHandshake | None:
        return None if self.page_format is None else KVCacheStoreHandshake(self.page_format)

    def _keys(self, hashes: list[str]) -> list[str]:
        assert self.namespace is not None, "kvcache.vllm: a transfer before the KV cache was registered"
        return [block_key(self.namespace, h) for h in hashes]

    def start_load_kv(self, meta: KVConnectorMetadata | None) -> None:
        if not isinstance(meta, KVCacheStoreMetadata) or not meta.loads:
            return
        assert self.transfers is not None, "kvcache.vllm: a load before the KV cache was registered"
        for t in meta.loads:
            self.transfers.load(t.req_id, self._keys(t.hashes), list(t.block_ids))

    def wait_for_layer_load(self, layer_name: str) -> None:
        # a request's loads end before vLLM schedules it (WAITING_FOR_REMOTE_KVS)
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: object, **kwargs: object) -> None:
        # every layer of a step is gathered at once, after the forward (wait_for_save)
        return

    def wait_for_save(self, meta: KVConnectorMetadata | None) -> None:
        if not isinstance(meta, KVCacheStoreMetadata) or not self.layout.saves:
            return
        assert self.transfers is not None, "kvcache.vllm: a save before the KV cache was registered"
        if sys.exc_info()[1] is not None:
            self._drop_unfinished(meta)
            return
        if meta.saves and self.link.get() is None:
            self.counters.add(skipped=1, save_failures=sum(len(t.block_ids) for t in meta.saves))
        else:
            for t in meta.saves:
                self.transfers.save(t.req_id, self._keys(t.hashes), list(t.block_ids))
        if meta.handoffs:
            self._hand_over(meta.handoffs)

    def _drop_unfinished(self, meta: KVCacheStoreMetadata) -> None:
        """vLLM ends every step with ``wait_for_save`` from a ``finally``, so also a step whose
        forward raised (a worker stopping on SIGTERM mid-step): the blocks it planned to save
        were never computed, and their pages still hold whatever was there before. Saving them
        would hand every reader another prompt's KV under this prompt's keys, so nothing of the
        step is saved (counted as failed saves) and no handoff is waited for."""
        dropped = sum(len(t.block_ids) for t in meta.saves)
        raised = sys.exc_info()[0]
        logger.warning(
            "kvcache.vllm: the step's forward raised %s; its %d blocks are not saved",
            raised.__name__ if raised else "an exception",
            dropped,
        )
        self.counters.add(save_failures=dropped)

    def _hand_over(self, req_ids: list[str]) -> None:
        """Holds the step until the puts of the prompts it completes for a remote decode have
        ended, so vLLM's answer means the store has them."""
        assert self.transfers is not None
        began = time.monotonic()
        done = self.transfers.wait_saved(req_ids)
        waited = int((time.monotonic() - began) * 1000)
        if not done:
            logger.warning(
                "kvcache.vllm: the handoff of %s was still being put after %d ms; decode computes what it "
                "does not find",
                ", ".join(req_ids),
                waited,
            )
        self.counters.add(handoff_wait_ms=waited, handoff_timeouts=int(not done))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # saves never hold a block past its gather, so no request waits on them
        if self.transfers is None:
            return None, None
        loaded, failed = self.transfers.finished()
        self._invalid.update(failed)
        return None, loaded or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid

    def close(self) -> None:
        """Stops the movers (after what is queued) and closes the connection."""
        if self.transfers is not None:
            self.transfers.close()
        self.link.close()
