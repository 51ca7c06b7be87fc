"""The worker side: moves blocks between vLLM's KV cache and the store, as the scheduler planned.

On the CPU the KV cache tensors themselves are registered and each block's value is gathered
from and scattered into its pages of every layer by pointer (``batch_put_from_parts`` /
``batch_get_into_parts``), one call per step each way; a block the step loads whole is taken off
vLLM's list of new blocks to zero first (by the scheduler side: vLLM allows that of a connector
that loads synchronously), and zeroed here instead if its load fails; elsewhere (a GPU), blocks
go through a registered staging buffer on the host (pinned when the device is CUDA). Loads are
whole before the forward starts, saves are made after it: nothing finishes later.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

import torch

from .. import CODE_NAMES, KEY_NOT_FOUND, Store, StoreError
from .keys import Layout, block_key
from .link import KEYS_PER_CALL, Link
from .metadata import KVCacheStoreMetadata, Transfer
from .settings import Settings
from .stats import Counters

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

logger = logging.getLogger("vllm." + __name__)

#: what a transfer may add to the timeout per byte it moves: 1 s per 256 MB
SECONDS_PER_BYTE = 1 / 256e6


class WorkerSide:
    """A worker's half of the connector: its own connection (which the KV cache, or the staging
    buffers, are registered with), its rank's namespace, and counters."""

    def __init__(self, settings: Settings, layout: Layout):
        self.settings = settings
        self.layout = layout
        #: where this rank's blocks are stored
        self.namespace = layout.namespace(settings.model)
        self.counters = Counters()
        self.link = Link.of(settings, layout)
        self._layers: list[tuple[int, int]] = []  # (base pointer, bytes per block) per layer
        self._tensors: list[torch.Tensor] = []
        self._staging: dict[str, tuple[torch.Tensor, threading.Lock]] | None = None
        #: blocks whose load failed, not yet reported to vLLM
        self._invalid: set[int] = set()
        self.link.on_connect.append(self._registered)
        self.link.start()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.layout.layers if n not in kv_caches]
        if missing:
            raise ValueError(f"kvcache.vllm: the worker has no KV cache for layers {missing}")
        tensors = [kv_caches[n] for n in self.layout.layers]
        for name, t in zip(self.layout.layers, tensors):
            per_block = t[0].numel() * t.element_size()
            if not t.is_contiguous() or per_block != self.layout.page_bytes:
                raise ValueError(
                    f"kvcache.vllm: layer {name}'s KV cache is not block-major pages of "
                    f"{self.layout.page_bytes} bytes (shape {tuple(t.shape)}, {t.dtype}); this layout is not supported"
                )
        self._tensors = tensors
        self._layers = [(t.data_ptr(), self.layout.page_bytes) for t in tensors]
        direct = all(t.device.type == "cpu" for t in tensors) and not self.settings.staging
        if not direct:
            pin = tensors[0].device.type == "cuda"
            self._staging = {}
            for direction in ("load", "save"):
                buf = torch.empty(
                    self.settings.staging_blocks * len(tensors) * self.layout.page_bytes,
                    dtype=torch.uint8,
                    pin_memory=pin,
                )
                self._staging[direction] = (buf, threading.Lock())
        logger.info(
            "kvcache.vllm worker: %d layers of %d-byte pages, %s",
            len(tensors),
            self.layout.page_bytes,
            "by pointer" if direct else "staged",
        )
        store = self.link.store
        if store is not None:
            self._registered(store)

    def _registered(self, store: Store) -> None:
        """Registers the memory values move from and into with a (new) connection."""
        if self._staging is not None:
            for buf, _ in self._staging.values():
                store.register_buffer(buf.data_ptr(), buf.numel())
        else:
            for t in self._tensors:
                store.register_buffer(t.data_ptr(), t.numel() * t.element_size())

    @property
    def _value_bytes(self) -> int:
        """A block's value: its page of every layer, in layer order."""
        return len(self.layout.layers) * self.layout.page_bytes

    def _parts(self, transfers: list[Transfer]) -> tuple[list[str], list[list[int]], list[int]]:
        """Keys, the pointers of each block's pages straight in the KV cache, and the blocks."""
        keys, ptrs, blocks = [], [], []
        for t in transfers:
            for h, block in zip(t.hashes, t.block_ids):
                keys.append(block_key(self.namespace, h))
                ptrs.append([base + block * size for base, size in self._layers])
                blocks.append(block)
        return keys, ptrs, blocks

    def start_load_kv(self, meta: KVConnectorMetadata | None) -> None:
        if not isinstance(meta, KVCacheStoreMetadata) or not meta.loads:
            return
        blocks = [b for t in meta.loads for b in t.block_ids]
        store = self.link.get()
        if store is None:
            self.counters.add(skipped=1)
            self._count_loads(blocks, [-1] * len(blocks))
            return
        if self._staging is None:
            keys, ptrs, blocks = self._parts(meta.loads)
            got = self._transfer(store.batch_get_into_parts, "a load", keys, ptrs, parts=True)
            self._count_loads(blocks, got)
        else:
            self._load_staged(store, meta.loads)

    def _transfer(
        self, call: Callable[..., list[int]], what: str, keys: list[str], ptrs: list[Any], parts: bool = False
    ) -> list[int]:
        """`call` (a batch get or put of whole block values) over `keys` in calls of at most
        KEYS_PER_CALL, each given the Link's timeout plus the time its bytes may take; the answers
        per key, -1 for each key of a call that failed (which is logged and counted). With
        `parts`, each pointer is a list: the block's page of each layer."""
        value, page = self._value_bytes, self.layout.page_bytes
        out: list[int] = []
        for at in range(0, len(keys), KEYS_PER_CALL):
            k, p = keys[at : at + KEYS_PER_CALL], ptrs[at : at + KEYS_PER_CALL]
            sizes = [[page] * len(x) for x in p] if parts else [value] * len(k)
            timeout = self.settings.timeout_ms + int(len(k) * value * SECONDS_PER_BYTE * 1000)
            try:
                out.extend(call(k, p, sizes, timeout_ms=timeout))
            except StoreError as e:
                self.link.failed(e, what)
                out.extend([-1] * (len(keys) - at))
                break
        return out

    def _load_staged(self, store: Store, loads: list[Transfer]) -> None:
        assert self._staging is not None
        buf, lock = self._staging["load"]
        layers, size = len(self._tensors), self.layout.page_bytes
        per = self.settings.staging_blocks
        pending = [(h, b) for t in loads for h, b in zip(t.hashes, t.block_ids)]
        with lock:
            for start in range(0, len(pending), per):
                part = pending[start : start + per]
                keys = [block_key(self.namespace, h) for h, _ in part]
                ptrs = [buf.data_ptr() + i * self._value_bytes for i in range(len(keys))]
                got = self._transfer(store.batch_get_into, "a load", keys, ptrs)
                ok = self._count_loads([b for _, b in part], got)
                staged = buf[: len(part) * self._value_bytes].view(len(part), layers, size)
                for j, (_, block) in enumerate(part):
                    if block in ok:
                        for layer, t in enumerate(self._tensors):
                            t.view(t.shape[0], -1).view(torch.uint8)[block].copy_(staged[j, layer], non_blocking=True)
                if self._tensors and self._tensors[0].device.type == "cuda":
                    torch.cuda.current_stream().synchronize()

    def _count_loads(self, blocks: list[int], got: list[int]) -> set[int]:
        """Counts a load's answers (one per block, in order); the blocks that arrived whole. The
        others are reported to vLLM, which recomputes them."""
        value = self._value_bytes
        ok = {block for block, answer in zip(blocks, got) if answer == value}
        failed = [block for block in blocks if block not in ok]
        self._invalid.update(failed)
        # vLLM did not zero these blocks (they were to be overwritten whole): do it before it
        # recomputes them, so nothing of a partial load is ever read
        for block in failed:
            for t in self._tensors:
                t[block].zero_()
        if failed:
            codes = sorted(
                {CODE_NAMES.get(a, "KEY_NOT_FOUND" if a == KEY_NOT_FOUND else str(a)) for a in got if a != value}
            )
            logger.warning(
                "kvcache.vllm: %d of %d blocks did not load (%s); vLLM recomputes them",
                len(failed),
                len(blocks),
                ", ".join(codes),
            )
        self.counters.add(loaded_blocks=len(ok), loaded_bytes=len(ok) * value, load_failures=len(failed))
        return ok

    def wait_for_layer_load(self, layer_name: str) -> None:
        # loads are whole before the forward starts (start_load_kv)
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        # every layer of a step is saved at once, after the forward (wait_for_save)
        return

    def wait_for_save(self, meta: KVConnectorMetadata | None) -> None:
        if not isinstance(meta, KVCacheStoreMetadata) or not meta.saves:
            return
        blocks = sum(len(t.block_ids) for t in meta.saves)
        store = self.link.get()
        if store is None:
            self.counters.add(skipped=1, save_failures=blocks)
            return
        if self._staging is None:
            keys, ptrs, _ = self._parts(meta.saves)
            self._count_saves(self._transfer(store.batch_put_from_parts, "a save", keys, ptrs, parts=True))
        else:
            self._save_staged(store, meta.saves)

    def _count_saves(self, done: list[int]) -> None:
        stored = sum(1 for d in done if d == 0)
        if stored < len(done):
            codes = sorted({CODE_NAMES.get(d, str(d)) for d in done if d != 0})
            logger.warning(
                "kvcache.vllm: %d of %d blocks were not saved (%s)", len(done) - stored, len(done), ", ".join(codes)
            )
        self.counters.add(saved_blocks=stored, saved_bytes=stored * self._value_bytes, save_failures=len(done) - stored)

    def _save_staged(self, store: Store, saves: list[Transfer]) -> None:
        assert self._staging is not None
        buf, lock = self._staging["save"]
        layers, size = len(self._tensors), self.layout.page_bytes
        per = self.settings.staging_blocks
        pending = [(h, b) for t in saves for h, b in zip(t.hashes, t.block_ids)]
        with lock:
            for start in range(0, len(pending), per):
                part = pending[start : start + per]
                staged = buf[: len(part) * self._value_bytes].view(len(part), layers, size)
                for j, (_, block) in enumerate(part):
                    for layer, t in enumerate(self._tensors):
                        staged[j, layer].copy_(t.view(t.shape[0], -1).view(torch.uint8)[block])
                keys = [block_key(self.namespace, h) for h, _ in part]
                ptrs = [buf.data_ptr() + i * self._value_bytes for i in range(len(keys))]
                self._count_saves(self._transfer(store.batch_put_from, "a save", keys, ptrs))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # loads and saves are whole within their step: nothing finishes later
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid = self._invalid, set()
        return invalid
