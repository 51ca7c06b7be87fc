"""SGLang HiCache storage backend on the kvcache store: ``HiCacheStore``, loaded by SGLang's
``dynamic`` backend (``--hicache-storage-backend dynamic`` with ``module_path`` ``kvcache.sglang``,
``class_name`` ``HiCacheStore`` and ``interface_v1: 1`` in ``--hicache-storage-backend-extra-config``).

This module owns how HiCache pages become store values: the store connection it opens from the
extra config (``endpoint``, ``tenant``, ``block_size``, ``dtype``) or the injected environment
(``Store.from_env()``), the key of each value, and the two ways pages move.

- Direct: with ``interface_v1`` (SGLang then moves pages by host index), when the host pool gives
  each page as at most two ranges of its own buffers
  (``get_page_buffer_meta``: a page's K and V, or its one MLA range; the ``page_first``,
  ``page_first_direct`` and ``page_head`` layouts), those buffers are registered once and each
  range is stored and read in place by pointer (``batch_put_from`` / ``batch_get_into``).
- Staged: otherwise (``layer_first`` cuts a page into 2 x layers ranges, each its own round trip),
  pages are copied through a registered staging buffer of ours, one value per page in the
  host pool's flat page format (``get_data_page(flat=True)``), which is also what the legacy
  ``get``/``set``/``batch_get``/``batch_set`` calls store.

Keys are ``[model:]<page hash>@<layout>[@tp<r>of<n>][@pp..][@cp..][@dcp..]`` plus ``#<range>``
for a direct range: ranks that hold different slices of a page never share a key, MLA ranks
(which hold the same page) do, and pages written in one layout are never read in another.
Tested against sglang 0.5.23 (``tests/test_sglang.py``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from . import CODE_NAMES, Store, StoreError

logger = logging.getLogger(__name__)

#: pages copied per staged round trip (the staging buffer holds this many pages)
DEFAULT_STAGING_PAGES = 16
#: a page given in more ranges than this is staged rather than moved by pointer
MAX_DIRECT_RANGES = 2


def _dtype_name(dtype: torch.dtype) -> str:
    """The store's spelling of a torch dtype: ``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def _shard_suffix(config: HiCacheStorageConfig) -> str:
    """The part of a key naming which slice of a page this rank holds."""
    suffix = ""
    if not config.is_mla_model:
        # MHA ranks hold different heads; MLA ranks hold the same page (one writer stores it)
        suffix += f"@tp{config.tp_rank}of{config.tp_size}"
    if config.pp_size > 1:
        suffix += f"@pp{config.pp_rank}of{config.pp_size}"
    if config.attn_cp_size > 1:
        suffix += f"@cp{config.attn_cp_rank}of{config.attn_cp_size}"
    if config.dcp_size > 1:
        suffix += f"@dcp{config.dcp_rank}of{config.dcp_size}"
    return suffix


def _failures(codes: list[int]) -> str:
    """The distinct failure codes of a batch, by name, for a log line."""
    names = sorted({CODE_NAMES.get(c, str(c)) for c in codes if c < 0})
    return ", ".join(names)


class HiCacheStore(HiCacheStorage):
    """HiCache pages in the kvcache store. SGLang builds it as ``HiCacheStore(storage_config,
    kwargs)`` and then calls ``register_mem_pool_host(host_pool)``, which opens the connection."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None):
        if storage_config.should_split_heads:
            raise ValueError(
                "kvcache.sglang.HiCacheStore does not split heads across heterogeneous TP "
                "(tp_lcm_size with the page_head layout); drop tp_lcm_size from the extra config"
            )
        self.storage_config = storage_config
        self.extra = dict(storage_config.extra_config or {})
        self.endpoint = self.extra.get("endpoint")
        if not self.endpoint and not (os.environ.get("KVSTORE_LEADER") or os.environ.get("MOONCAKE_MASTER")):
            raise ValueError(
                'no kvcache store configured for the SGLang HiCache backend: put "endpoint": '
                '"HOST:PORT" (the store\'s Client endpoint) in --hicache-storage-backend-extra-config, '
                "or set KVSTORE_LEADER (and KVSTORE_TENANT, KVSTORE_BLOCK_SIZE, KVSTORE_DTYPE)"
            )
        self.staging_pages = int(self.extra.get("staging_pages", DEFAULT_STAGING_PAGES))
        if self.staging_pages < 1:
            raise ValueError(f"staging_pages must be at least 1, got {self.staging_pages}")
        model = storage_config.model_name
        self._prefix = f"{model}:" if model else ""
        self._shard = _shard_suffix(storage_config)
        self.store: Store | None = None
        self.mem_pool_host = None
        self.direct = False
        self._registered: list[tuple] = []
        self._staging = {}

    # -- connection and host pool -------------------------------------------------------------

    def _connect(self, host_pool) -> Store:
        options = {"spin_us": int(self.extra.get("spin_us", 0))}
        if "same_host" in self.extra:
            options["same_host"] = bool(self.extra["same_host"])
        if not self.endpoint:
            return Store.from_env(**options)
        tenant = self.extra.get("tenant") or os.environ.get("KVSTORE_TENANT") or "default"
        block_size = int(self.extra.get("block_size", host_pool.page_size))
        dtype = str(self.extra.get("dtype", _dtype_name(host_pool.dtype)))
        return Store(self.endpoint, tenant, block_size, dtype, **options)

    def register_mem_pool_host(self, mem_pool_host):
        """Opens the store connection, registers the host pool's buffers for the direct path when
        its pages lie in them, and sets up the staging buffers otherwise."""
        super().register_mem_pool_host(mem_pool_host)
        if self.store is None:
            store = self._connect(mem_pool_host)
            try:
                # the store's refusals of this tenant or layout (UNAUTHENTICATED,
                # TENANT_LAYOUT_MISMATCH) fail the attach, rather than every later page
                store.is_exist("kvcache/attach-probe")
            except StoreError:
                store.close()
                raise
            self.store = store
        self.page_size = mem_pool_host.page_size
        self.layout = getattr(mem_pool_host, "layout", "unknown")
        # without interface_v1 SGLang uses the legacy calls only, which store flat pages
        self.direct = bool(int(self.extra.get("interface_v1", 0))) and self._register_pool_buffers(mem_pool_host)
        dummy = mem_pool_host.get_dummy_flat_data_page()
        self.page_bytes = dummy.numel() * dummy.element_size()
        self.page_dtype = dummy.dtype
        if not self.direct:
            # one staging buffer per direction: SGLang's backup and prefetch threads run at once
            for direction in ("put", "get"):
                buf = torch.empty(self.staging_pages * self.page_bytes, dtype=torch.uint8)
                self.store.register_buffer(buf.data_ptr(), buf.numel())
                self._staging[direction] = (buf, threading.Lock())
        logger.info(
            "kvcache HiCache backend on %s: layout %s, %s path, %d-byte pages",
            self.store.endpoint,
            self.layout,
            "direct" if self.direct else "staged",
            self.page_bytes,
        )

    def _register_pool_buffers(self, pool) -> bool:
        """Registers the pool's KV buffers; True when a page's ranges lie inside them and number
        at most MAX_DIRECT_RANGES."""
        get_meta = getattr(pool, "get_page_buffer_meta", None)
        if get_meta is None:
            return False
        try:
            first = torch.arange(self.page_size, dtype=torch.int64)
            last = first + (pool.size - self.page_size)
            ptrs, sizes = get_meta(torch.cat([first, last]))
        except (NotImplementedError, ValueError, AssertionError, AttributeError) as e:
            logger.info("kvcache HiCache backend: no zero-copy page ranges for this pool (%s); staging", e)
            return False
        ranges = len(ptrs) // 2
        if not ptrs or len(ptrs) % 2 or ranges > MAX_DIRECT_RANGES:
            return False
        tensors = []
        kv = getattr(pool, "kv_buffer", None)
        tensors.extend(kv if isinstance(kv, (list, tuple)) else [kv])
        for name in ("k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer"):
            tensors.append(getattr(pool, name, None))
        spans = []
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0:
                start, size = t.data_ptr(), t.numel() * t.element_size()
                if not any(s <= start and start + size <= s + n for s, n in spans):
                    spans.append((start, size))
        inside = all(any(s <= p and p + n <= s + sn for s, sn in spans) for p, n in zip(ptrs, sizes))
        if not inside:
            return False
        for start, size in spans:
            self.store.register_buffer(start, size)
            self._registered.append((start, size))
        self.ranges_per_page = ranges
        return True

    def _require_pool(self):
        if self.store is None or self.mem_pool_host is None:
            raise RuntimeError("HiCacheStore: register_mem_pool_host(host_pool) must be called first")

    # -- keys ---------------------------------------------------------------------------------

    def _page_key(self, key: str) -> str:
        return f"{self._prefix}{key}@{self.layout}{self._shard}"

    def _range_keys(self, keys: list[str]) -> list[str]:
        return [f"{self._page_key(k)}#{j}" for k in keys for j in range(self.ranges_per_page)]

    def _stored_keys(self, keys: list[str]) -> list[str]:
        """The store keys holding `keys`' pages, page by page (ranges_per_page each when direct)."""
        return self._range_keys(keys) if self.direct else [self._page_key(k) for k in keys]

    # -- the zero-copy interface (interface_v1) -----------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """How many of `keys`, from the first, have their whole page stored."""
        self._require_pool()
        if not keys:
            return 0
        stored = self._stored_keys(keys)
        try:
            found = self.store.batch_is_exist(stored)
        except StoreError as e:
            logger.warning("kvcache HiCache batch_exists failed: %s", e)
            return 0
        per_page = len(stored) // len(keys)
        for i in range(len(keys)):
            if not all(found[i * per_page : (i + 1) * per_page]):
                return i
        return len(keys)

    def _indices_match(self, keys, host_indices) -> bool:
        if host_indices.numel() == len(keys) * self.page_size:
            return True
        logger.error(
            "kvcache HiCache: %d keys need %d host indices, got %d",
            len(keys),
            len(keys) * self.page_size,
            host_indices.numel(),
        )
        return False

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Stores the pages at `host_indices` (page_size indices per key); per key, whether its
        page is stored now (already stored pages are not sent again)."""
        self._require_pool()
        if not keys or not self._indices_match(keys, host_indices):
            return [False] * len(keys)
        try:
            if self.direct:
                return self._set_direct(keys, host_indices)
            return self._set_staged(keys, host_indices)
        except StoreError as e:
            logger.warning("kvcache HiCache batch_set_v1 failed: %s", e)
            return [False] * len(keys)

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Reads the pages of `keys` into the host pool at `host_indices`; per key, whether its
        whole page was read."""
        self._require_pool()
        if not keys or not self._indices_match(keys, host_indices):
            return [False] * len(keys)
        try:
            if self.direct:
                return self._get_direct(keys, host_indices)
            return self._get_staged(keys, host_indices)
        except StoreError as e:
            logger.warning("kvcache HiCache batch_get_v1 failed: %s", e)
            return [False] * len(keys)

    def _set_direct(self, keys, host_indices) -> list[bool]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        # a key the store holds already is answered 0 without its bytes being sent
        codes = self.store.batch_put_from(self._range_keys(keys), ptrs, sizes)
        if any(c != 0 for c in codes):
            logger.warning("kvcache HiCache: storing pages failed (%s)", _failures(codes))
        r = self.ranges_per_page
        return [all(c == 0 for c in codes[i * r : (i + 1) * r]) for i in range(len(keys))]

    def _get_direct(self, keys, host_indices) -> list[bool]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        got = self.store.batch_get_into(self._range_keys(keys), ptrs, sizes)
        r = self.ranges_per_page
        return [all(got[j] == sizes[j] for j in range(i * r, (i + 1) * r)) for i in range(len(keys))]

    def _page_starts(self, host_indices) -> list[int]:
        return host_indices[:: self.page_size].tolist()

    def _set_staged(self, keys, host_indices) -> list[bool]:
        stored = [self._page_key(k) for k in keys]
        starts = self._page_starts(host_indices)
        ok = [False] * len(keys)
        buf, lock = self._staging["put"]
        n = self.page_bytes
        with lock:
            for c in range(0, len(keys), self.staging_pages):
                chunk = list(range(c, min(c + self.staging_pages, len(keys))))
                for slot, i in enumerate(chunk):
                    page = self.mem_pool_host.get_data_page(starts[i], flat=True)
                    buf[slot * n : (slot + 1) * n].copy_(page.contiguous().view(torch.uint8))
                codes = self.store.batch_put_from(
                    [stored[i] for i in chunk],
                    [buf.data_ptr() + slot * n for slot in range(len(chunk))],
                    [n] * len(chunk),
                )
                for i, code in zip(chunk, codes):
                    ok[i] = code == 0
                if any(code != 0 for code in codes):
                    logger.warning("kvcache HiCache: storing pages failed (%s)", _failures(codes))
        return ok

    def _get_staged(self, keys, host_indices) -> list[bool]:
        stored = [self._page_key(k) for k in keys]
        starts = self._page_starts(host_indices)
        ok = [False] * len(keys)
        buf, lock = self._staging["get"]
        n = self.page_bytes
        with lock:
            for c in range(0, len(keys), self.staging_pages):
                chunk = list(range(c, min(c + self.staging_pages, len(keys))))
                got = self.store.batch_get_into(
                    [stored[i] for i in chunk],
                    [buf.data_ptr() + slot * n for slot in range(len(chunk))],
                    [n] * len(chunk),
                )
                for slot, (i, read) in enumerate(zip(chunk, got)):
                    if read == n:
                        page = buf[slot * n : (slot + 1) * n].view(self.page_dtype)
                        self.mem_pool_host.set_from_flat_data_page(starts[i], page)
                        ok[i] = True
        return ok

    # -- the legacy interface (page tensors, copied) ------------------------------------------

    def get(self, key: str, target_location: Any | None = None, target_sizes: Any | None = None):
        """The flat page of `key` in `target_location` (a flat page tensor, as
        ``get_dummy_flat_data_page()`` gives), or None when it is not stored."""
        self._require_pool()
        try:
            value = self.store.get(self._page_key(key))
        except StoreError as e:
            logger.warning("kvcache HiCache get failed: %s", e)
            return None
        if value is None:
            return None
        if target_location is None:
            target_location = self.mem_pool_host.get_dummy_flat_data_page()
        dst = target_location.view(torch.uint8)
        if len(value) != dst.numel():
            logger.warning("kvcache HiCache: %r holds %d bytes, the page is %d; not read", key, len(value), dst.numel())
            return None
        dst.copy_(torch.frombuffer(bytearray(value), dtype=torch.uint8))
        return target_location

    def batch_get(self, keys: list[str], target_locations: Any | None = None, target_sizes: Any | None = None):
        """`get` for each key, in order."""
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Stores the flat page tensor `value` under `key`."""
        self._require_pool()
        if value is None:
            return False
        data = value.contiguous().view(torch.uint8).numpy().tobytes()
        try:
            self.store.put(self._page_key(key), data)
            return True
        except StoreError as e:
            logger.warning("kvcache HiCache set failed: %s", e)
            return False

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """`set` for each key; True when all were stored."""
        values = list(values or [])
        if len(values) != len(keys):
            return False
        return all([self.set(k, v) for k, v in zip(keys, values)])

    def exists(self, key: str) -> bool:
        """Whether the whole page of `key` is stored."""
        return self.batch_exists([key]) == 1

    def close(self):
        """Forgets the registered memory and closes the connection."""
        if self.store is None:
            return
        for start, _ in self._registered:
            self.store.unregister_buffer(start)
        for buf, _ in self._staging.values():
            self.store.unregister_buffer(buf.data_ptr())
        self._registered, self._staging = [], {}
        self.store.close()
        self.store = None
