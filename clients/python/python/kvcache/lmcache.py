"""LMCache remote storage plugin on the kvcache store: ``KVCacheConnectorAdapter`` (what LMCache
loads for a plugin in ``remote_storage_plugins``) and the ``KVCacheConnector`` it creates.

Configure LMCache with ``remote_storage_plugins: ["kvcache"]`` and, in ``extra_config``,
``remote_storage_plugin.kvcache.module_path: kvcache.lmcache`` and
``remote_storage_plugin.kvcache.class_name: KVCacheConnectorAdapter``. The plugin's name must be
``kvcache`` or ``kvcache.<instance>``: LMCache asks each adapter whether it takes
``plugin://<name>``.

This module owns how LMCache chunks become store values and the store connection it opens:
``remote_storage_plugin.<name>.endpoint`` (HOST:PORT) with ``.tenant`` (and optional
``.block_size``, default the chunk size, and ``.dtype``, default the KV dtype), or else
``Store.from_env()``. The value of a key (``CacheEngineKey.to_string()``) is the chunk's bytes:

- with ``save_chunk_meta: false`` in ``extra_config`` (as for LMCache's other zero-copy
  connectors) the bytes alone, moved by pointer: the local CPU backend's buffer is registered
  once and chunks go straight from and into it (``batch_put_from`` / ``batch_get_into``);
- otherwise (LMCache's default) LMCache's ``RemoteMetadata`` header, then the bytes, copied:
  the header tells a reader the shape of a partial chunk.

A memory object outside the registered buffer is copied as bytes either way.
Tested against lmcache 0.5.6 (``tests/test_lmcache.py``).
"""

from __future__ import annotations

import asyncio
import builtins  # KVCacheConnector has a method named list (LMCache's API): its signatures say builtins.list
import logging
import os

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import (
    ConnectorAdapter,
    ConnectorContext,
    extract_plugin_type,
)
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from . import CODE_NAMES, CODES, KEY_NOT_FOUND, Store, StoreError

logger = logging.getLogger(__name__)

#: the plugin type this adapter takes (``plugin://kvcache`` or ``plugin://kvcache.<instance>``)
PLUGIN_TYPE = "kvcache"


def _refusal(code: int, what: str) -> StoreError:
    """A StoreError for the batch answer `code`, as the extension raises them ("CODE: ...")."""
    name = CODE_NAMES.get(code, str(code))
    err = StoreError(f"{name}: {what}")
    err.code = name
    return err


def _number(e: StoreError) -> int:
    """The negative number a batch answers for the code of `e`."""
    return CODES.get(getattr(e, "code", ""), CODES["INTERNAL"])


class KVCacheConnectorAdapter(ConnectorAdapter):
    """Takes ``plugin://kvcache[.<instance>]`` and creates a ``KVCacheConnector`` for it."""

    def __init__(self) -> None:
        super().__init__(f"plugin://{PLUGIN_TYPE}")

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://") :]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return KVCacheConnector(
            context.loop, context.local_cpu_backend, context.config, plugin_name=context.plugin_name or PLUGIN_TYPE
        )


class KVCacheConnector(RemoteConnector):
    """LMCache's remote connector interface on a kvcache ``Store``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config, plugin_name: str = PLUGIN_TYPE):
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name = plugin_name
        extra = (config.extra_config if config is not None else None) or {}
        self.store = self._connect(extra, local_cpu_backend.metadata)
        self._registered: list[tuple] = []
        self._register_allocator_buffers()
        logger.info(
            "kvcache LMCache connector on %s: %s, %d-byte chunks, %d registered buffer(s)",
            self.store.endpoint,
            "header and bytes (copied)" if self.save_chunk_meta else "bytes by pointer",
            self.full_chunk_size_bytes,
            len(self._registered),
        )

    def _option(self, extra: dict, name: str, default=None):
        return extra.get(f"remote_storage_plugin.{self.plugin_name}.{name}", default)

    def _connect(self, extra: dict, metadata) -> Store:
        endpoint = self._option(extra, "endpoint")
        options = {"spin_us": int(self._option(extra, "spin_us", 0))}
        if self._option(extra, "same_host") is not None:
            options["same_host"] = bool(self._option(extra, "same_host"))
        if not endpoint:
            if not (os.environ.get("KVSTORE_LEADER") or os.environ.get("MOONCAKE_MASTER")):
                raise ValueError(
                    f"no kvcache store configured for LMCache plugin {self.plugin_name!r}: set extra_config "
                    f"remote_storage_plugin.{self.plugin_name}.endpoint to HOST:PORT (the store's Client "
                    "endpoint) with .tenant, or set KVSTORE_LEADER (and KVSTORE_TENANT, KVSTORE_BLOCK_SIZE, "
                    "KVSTORE_DTYPE)"
                )
            store = Store.from_env(**options)
        else:
            tenant = self._option(extra, "tenant") or os.environ.get("KVSTORE_TENANT") or "default"
            block_size = int(self._option(extra, "block_size", metadata.chunk_size))
            dtype = str(self._option(extra, "dtype", str(metadata.kv_dtype).removeprefix("torch.")))
            store = Store(endpoint, tenant, block_size, dtype, **options)
        try:
            # a tenant the leader does not know, or a layout unlike the domain's, fails here
            store.is_exist("kvcache/attach-probe")
        except StoreError:
            store.close()
            raise
        return store

    def _register_allocator_buffers(self) -> None:
        allocator = getattr(self.local_cpu_backend, "memory_allocator", None)
        pinned = getattr(allocator, "pin_allocator", None)
        candidates = [getattr(allocator, "buffer", None), getattr(pinned, "buffer", None)]
        for t in candidates:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
                continue
            start, size = t.data_ptr(), t.numel() * t.element_size()
            if any(s <= start and start + size <= s + n for s, n in self._registered):
                continue
            self.store.register_buffer(start, size)
            self._registered.append((start, size))

    # -- values -------------------------------------------------------------------------------

    def _by_pointer(self, obj: MemoryObj) -> bool:
        """Whether `obj`'s bytes lie in a registered buffer (and so move by pointer)."""
        if self.save_chunk_meta or obj.raw_tensor is None or not obj.raw_tensor.is_contiguous():
            return False
        p, n = obj.data_ptr, obj.get_size()
        return any(s <= p and p + n <= s + size for s, size in self._registered)

    def _value(self, obj: MemoryObj) -> bytes:
        data = obj.byte_array
        if not self.save_chunk_meta:
            return bytes(data)
        header = RemoteMetadata(len(data), obj.get_shapes(), obj.get_dtypes(), obj.get_memory_format())
        return header.serialize() + bytes(data)

    def _chunk_from(self, value: bytes) -> MemoryObj | None:
        """A memory object from the local CPU backend holding the chunk in `value`."""
        if self.save_chunk_meta:
            if len(value) < self.remote_metadata_bytes:
                logger.warning("kvcache LMCache: a %d-byte value has no chunk header", len(value))
                return None
            meta = RemoteMetadata.deserialize(value[: self.remote_metadata_bytes])
            body = memoryview(value)[self.remote_metadata_bytes :]
            if len(body) != meta.length:
                logger.warning("kvcache LMCache: header says %d bytes, the value has %d", meta.length, len(body))
                return None
            obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
            if obj is None:
                return None
            obj.byte_array.cast("B")[: len(body)] = body
            return obj
        obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
        if obj is None:
            return None
        if len(value) > obj.get_size():
            obj.ref_count_down()
            return None
        obj.byte_array.cast("B")[: len(value)] = value
        return self._trimmed(obj, len(value))

    def _trimmed(self, obj: MemoryObj, n: int) -> MemoryObj | None:
        try:
            return self.reshape_partial_chunk(obj, n)
        except ValueError as e:
            logger.warning("kvcache LMCache: %s", e)
            obj.ref_count_down()
            return None

    # -- blocking forms (run in a worker thread by the async ones) ----------------------------

    def _get_many(self, keys: builtins.list[CacheEngineKey]) -> builtins.list[MemoryObj | None]:
        names = [k.to_string() for k in keys]
        out: list[MemoryObj | None] = [None] * len(keys)
        copied = range(len(keys))
        if not self.save_chunk_meta:
            objs = [self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt) for _ in keys]
            direct = [i for i, o in enumerate(objs) if o is not None and self._by_pointer(o)]
            got = (
                self.store.batch_get_into(
                    [names[i] for i in direct], [objs[i].data_ptr for i in direct], [objs[i].get_size() for i in direct]
                )
                if direct
                else []
            )
            for i, n in zip(direct, got):
                if n > 0:
                    out[i] = self._trimmed(objs[i], n)
                else:
                    if n != KEY_NOT_FOUND:
                        logger.warning("kvcache LMCache: reading %s failed (%s)", names[i], CODE_NAMES.get(n, n))
                    objs[i].ref_count_down()
            moved = set(direct)
            for i, o in enumerate(objs):
                if o is not None and i not in moved:
                    o.ref_count_down()
            copied = [i for i in copied if i not in moved]
        for i in copied:
            value = self.store.get(names[i])
            if value is not None:
                out[i] = self._chunk_from(value)
        return out

    def _put_many(self, keys: builtins.list[CacheEngineKey], objs: builtins.list[MemoryObj]) -> None:
        names = [k.to_string() for k in keys]
        direct = [i for i, o in enumerate(objs) if self._by_pointer(o)]
        moved = set(direct)
        failed = []
        if direct:
            codes = self.store.batch_put_from(
                [names[i] for i in direct], [objs[i].data_ptr for i in direct], [objs[i].get_size() for i in direct]
            )
            failed += [(names[i], c) for i, c in zip(direct, codes) if c != 0]
        for i, o in enumerate(objs):
            if i not in moved:
                try:
                    self.store.put(names[i], self._value(o))
                except StoreError as e:
                    failed.append((names[i], _number(e)))
        if failed:
            name, code = failed[0]
            raise _refusal(code, f"storing {len(failed)} of {len(keys)} chunk(s) failed, the first {name}")

    def _leading_hits(self, keys: builtins.list[CacheEngineKey]) -> int:
        if not keys:
            return 0
        found = self.store.batch_is_exist([k.to_string() for k in keys])
        return found.index(0) if 0 in found else len(found)

    # -- RemoteConnector ----------------------------------------------------------------------

    async def exists(self, key: CacheEngineKey) -> bool:
        return await asyncio.to_thread(self.exists_sync, key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.store.is_exist(key.to_string()) == 1

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await asyncio.to_thread(self._get_many, [key]))[0]

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        await asyncio.to_thread(self._put_many, [key], [memory_obj])

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: builtins.list[CacheEngineKey]) -> builtins.list[MemoryObj | None]:
        return await asyncio.to_thread(self._get_many, list(keys))

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: builtins.list[CacheEngineKey], memory_objs: builtins.list[MemoryObj]):
        await asyncio.to_thread(self._put_many, list(keys), list(memory_objs))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: builtins.list[CacheEngineKey]) -> int:
        return self._leading_hits(list(keys))

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(
        self, lookup_id: str, keys: builtins.list[CacheEngineKey], pin: bool = False
    ) -> int:
        return await asyncio.to_thread(self._leading_hits, list(keys))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: builtins.list[CacheEngineKey]
    ) -> builtins.list[MemoryObj]:
        """The chunks of `keys` up to the first one missing (the rest are released)."""
        prefix: list[MemoryObj] = []
        missed = False
        for obj in await self.batched_get(keys):
            if obj is None:
                missed = True
            elif missed:
                obj.ref_count_down()
            else:
                prefix.append(obj)
        return prefix

    def remove_sync(self, key: CacheEngineKey) -> bool:
        try:
            return self.store.remove(key.to_string()) == 1
        except StoreError as e:
            logger.warning("kvcache LMCache: removing %s failed: %s", key.to_string(), e)
            return False

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the leader answers for this tenant, else the store code's negative number."""
        try:
            await asyncio.to_thread(self.store.is_exist, "kvcache/ping")
            return 0
        except StoreError as e:
            return _number(e)

    async def list(self) -> builtins.list[str]:
        """The keys the tenant holds now (the store's block snapshot; all of this tenant's keys,
        not only LMCache's)."""
        return await asyncio.to_thread(self._snapshot_keys)

    def _snapshot_keys(self, idle: float = 1.0) -> builtins.list[str]:
        watch = self.store.watch_blocks()
        keys: list[str] = []
        try:
            while (event := watch.next(timeout=idle)) is not None and event["snapshot"]:
                if event["type"] == "stored":
                    keys.extend(event["keys"])
        finally:
            watch.close()
        return keys

    async def close(self):
        for start, _ in self._registered:
            self.store.unregister_buffer(start)
        self._registered = []
        self.store.close()

    def __repr__(self) -> str:
        return f"<KVCacheConnector {self.store.endpoint} ({self.plugin_name})>"
