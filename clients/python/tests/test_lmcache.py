"""`kvcache.lmcache` inside the real LMCache (the version ``scripts/setup`` pins in the engine
environment) against a real leader and member: loaded by LMCache's own storage-backend factory
from ``remote_storage_plugins``, and driven through the ``RemoteBackend`` LMCache wraps around
it (put tasks, blocking and batched gets, contains, removal) with memory objects from LMCache's
own CPU allocator, chunk bytes compared byte for byte, with and without LMCache's chunk header.

Runs with the engine environment's python (``scripts/test``); ``KVSTORE_BIN`` names kv-store."""

import asyncio
import os
import threading
import time
import unittest
import warnings
from unittest import mock

warnings.filterwarnings("ignore")
# LMCache logs every backend it builds at INFO; its warnings and errors are what a failure needs
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

import torch  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import CreateStorageBackends  # noqa: E402
from lmcache.v1.storage_backend.connector import CreateConnector  # noqa: E402
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402

import kvcache  # noqa: E402
import kvcache.lmcache  # noqa: E402
from store_cluster import Cluster  # noqa: E402

CHUNK, LAYERS, HEADS, HEAD_DIM = 16, 3, 4, 32
TENANT, SMALL = "lmc", "lmc-small"
CHUNK_BYTES = 2 * LAYERS * CHUNK * HEADS * HEAD_DIM * 2


def metadata():
    return LMCacheMetadata(
        model_name="org/model",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM),
        chunk_size=CHUNK,
    )


def key(n):
    return CacheEngineKey("org/model", 1, 0, n, torch.bfloat16)


class LMCacheRemotePluginTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster([f"{TENANT}=64Mi:{CHUNK}:bfloat16", f"{SMALL}=2Ki:{CHUNK}:bfloat16"])
        cls.store = kvcache.Store(cls.cluster.endpoint, TENANT, CHUNK, "bfloat16")
        # LMCache runs its connectors' coroutines on an event loop of its own thread
        cls.loop = asyncio.new_event_loop()
        cls.thread = threading.Thread(target=cls.loop.run_forever, daemon=True)
        cls.thread.start()
        cls.opened = []

    @classmethod
    def tearDownClass(cls):
        for backend in cls.opened:
            backend.close()
        cls.loop.call_soon_threadsafe(cls.loop.stop)
        cls.thread.join(timeout=10)
        cls.store.close()
        cls.cluster.stop()

    def config(self, plugin="kvcache", save_chunk_meta=None, **options):
        extra = {
            f"remote_storage_plugin.{plugin}.module_path": "kvcache.lmcache",
            f"remote_storage_plugin.{plugin}.class_name": "KVCacheConnectorAdapter",
        }
        options.setdefault("endpoint", self.cluster.endpoint)
        options.setdefault("tenant", TENANT)
        extra.update({f"remote_storage_plugin.{plugin}.{k}": v for k, v in options.items() if v is not None})
        if save_chunk_meta is not None:
            extra["save_chunk_meta"] = save_chunk_meta
        return LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK,
            local_cpu=False,
            max_local_cpu_size=0.02,
            remote_storage_plugins=[plugin],
            extra_config=extra,
        )

    def remote(self, config, plugin="kvcache"):
        """The RemoteBackend LMCache's storage-backend factory builds for the plugin."""
        backends = CreateStorageBackends(config, metadata(), self.loop, dst_device="cpu")
        remote = backends.get(f"RemoteBackend-{plugin}")
        self.assertIsInstance(remote, RemoteBackend, f"LMCache built no remote backend: {list(backends)}")
        self.assertIsNotNone(remote.connection, "the plugin's connector failed to open (see the log)")
        self.opened.append(remote)
        return remote

    def chunk(self, remote, seed, tokens=CHUNK):
        """A memory object from LMCache's CPU allocator, filled with random bytes."""
        md = metadata()
        fmt = remote.connection._connector.meta_fmt
        obj = remote.local_cpu_backend.allocate(md.get_shapes(tokens), md.get_dtypes(), fmt)
        self.assertIsNotNone(obj)
        g = torch.Generator().manual_seed(seed)
        raw = obj.raw_tensor[: obj.get_size()]
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
        self.addCleanup(obj.ref_count_down)
        return obj

    def assertSameChunk(self, got, sent):
        """`got` holds what `sent` held, in the same shape; `got` is released (as the engine
        releases what it read once it is in the GPU)."""
        self.assertIsNotNone(got)
        self.assertEqual(got.get_size(), sent.get_size())
        self.assertEqual(got.tensor.shape, sent.tensor.shape)
        self.assertTrue(torch.equal(got.raw_tensor[: got.get_size()], sent.raw_tensor[: sent.get_size()]))
        got.ref_count_down()

    def run_async(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def wait_stored(self, remote, keys):
        """Waits for a batched put task (the engine is given no future for it)."""
        deadline = time.monotonic() + 30
        while remote.batched_contains(keys) != len(keys):
            self.assertLess(time.monotonic(), deadline, "the batched put did not store every chunk")
            time.sleep(0.01)

    def test_lmcache_loads_the_plugin_from_its_config(self):
        remote = self.remote(self.config(save_chunk_meta=False))
        connector = remote.connection._connector
        self.assertIsInstance(connector, kvcache.lmcache.KVCacheConnector)
        self.assertIsInstance(connector, RemoteConnector)
        self.assertEqual(connector.store.endpoint, self.cluster.endpoint)
        self.assertTrue(connector._registered, "the CPU allocator's buffer is registered")
        self.assertEqual(self.run_async(remote.connection.ping()), 0)
        # an instance name is taken too, with its own options
        named = self.remote(self.config(plugin="kvcache.primary"), plugin="kvcache.primary")
        self.assertEqual(named.connection._connector.plugin_name, "kvcache.primary")

    def test_chunks_round_trip_by_pointer_without_the_header(self):
        remote = self.remote(self.config(save_chunk_meta=False))
        connector = remote.connection._connector
        sent = self.chunk(remote, seed=1)
        self.assertTrue(connector._by_pointer(sent))
        self.assertFalse(remote.contains(key(1)))
        remote.submit_put_task(key(1), sent).result(timeout=30)
        self.assertTrue(remote.contains(key(1)))
        self.assertEqual(self.store.get(key(1).to_string()), bytes(sent.byte_array), "the value is the bytes alone")
        self.assertSameChunk(remote.get_blocking(key(1)), sent)
        self.assertIsNone(remote.get_blocking(key(999)))

    def test_chunks_round_trip_with_lmcaches_header(self):
        remote = self.remote(self.config())
        connector = remote.connection._connector
        self.assertTrue(connector.save_chunk_meta, "LMCache saves the chunk header by default")
        sent = self.chunk(remote, seed=2)
        remote.submit_put_task(key(2), sent).result(timeout=30)
        value = self.store.get(key(2).to_string())
        self.assertEqual(len(value), connector.remote_metadata_bytes + CHUNK_BYTES)
        self.assertEqual(value[connector.remote_metadata_bytes :], bytes(sent.byte_array))
        self.assertSameChunk(remote.get_blocking(key(2)), sent)

    def test_partial_chunks_keep_their_shape(self):
        for save_chunk_meta in (False, True):
            with self.subTest(save_chunk_meta=save_chunk_meta):
                remote = self.remote(self.config(save_chunk_meta=save_chunk_meta))
                n = 100 + int(save_chunk_meta)
                sent = self.chunk(remote, seed=n, tokens=5)
                remote.submit_put_task(key(n), sent).result(timeout=30)
                got = remote.get_blocking(key(n))
                self.assertEqual(got.tensor.shape[2], 5, "a 5-token chunk reads back as 5 tokens")
                self.assertSameChunk(got, sent)

    def test_batches_as_the_engine_sends_them(self):
        for save_chunk_meta in (False, True):
            with self.subTest(save_chunk_meta=save_chunk_meta):
                remote = self.remote(self.config(save_chunk_meta=save_chunk_meta))
                base = 200 + 100 * int(save_chunk_meta)
                keys = [key(base + i) for i in range(6)]
                sent = [self.chunk(remote, seed=base + i) for i in range(6)]
                self.assertEqual(remote.batched_contains(keys), 0)
                remote.batched_submit_put_task(keys, sent)
                self.wait_stored(remote, keys)
                self.assertEqual(remote.batched_contains(keys[:2] + [key(base + 99)] + keys[2:]), 2)
                self.assertEqual(self.run_async(remote.batched_async_contains("lookup", keys)), 6)
                got = remote.batched_get_blocking(keys + [key(base + 99)])
                for g, s in zip(got, sent):
                    self.assertSameChunk(g, s)
                self.assertIsNone(got[-1])
                # the non-blocking form answers the chunks before the first miss
                gap = keys[:3] + [key(base + 99)] + keys[3:]
                prefix = self.run_async(remote.batched_get_non_blocking("lookup", gap))
                self.assertEqual(len(prefix), 3)
                for g, s in zip(prefix, sent):
                    self.assertSameChunk(g, s)

    def test_removal_listing_and_refusals(self):
        remote = self.remote(self.config(save_chunk_meta=False))
        connector = remote.connection._connector
        remote.submit_put_task(key(400), self.chunk(remote, seed=400)).result(timeout=30)
        self.assertIn(key(400).to_string(), self.run_async(connector.list()))
        self.assertTrue(remote.remove(key(400)))
        self.assertFalse(remote.contains(key(400)))
        self.assertFalse(remote.remove(key(400)))
        # a tenant too small for a chunk: the put task fails with the store's code
        small = self.remote(self.config(tenant=SMALL, save_chunk_meta=False))
        failed = small.submit_put_task(key(401), self.chunk(small, seed=401))
        with self.assertRaises(kvcache.StoreError) as e:
            failed.result(timeout=30)
        self.assertEqual(e.exception.code, "TENANT_QUOTA_EXCEEDED")
        self.assertFalse(small.contains(key(401)))

    def test_the_connection_comes_from_the_environment_or_fails_clearly(self):
        names = ["KVSTORE_LEADER", "KVSTORE_TENANT", "KVSTORE_BLOCK_SIZE", "KVSTORE_DTYPE", "MOONCAKE_MASTER"]
        # the environment is restored however the test ends
        with mock.patch.dict(os.environ):
            for k in names:
                os.environ.pop(k, None)
            config = self.config(endpoint=None, tenant=None)
            local = self.remote(self.config()).local_cpu_backend
            with self.assertRaises(ValueError) as e:
                CreateConnector("plugin://kvcache", self.loop, local, config, metadata(), plugin_name="kvcache")
            self.assertIn("remote_storage_plugin.kvcache.endpoint", str(e.exception))
            self.assertIn("KVSTORE_LEADER", str(e.exception))
            with self.assertRaises(kvcache.StoreError) as e:
                CreateConnector(
                    "plugin://kvcache",
                    self.loop,
                    local,
                    self.config(tenant="nobody"),
                    metadata(),
                    plugin_name="kvcache",
                )
            self.assertEqual(e.exception.code, "UNAUTHENTICATED")
            os.environ.update(
                {
                    "KVSTORE_LEADER": self.cluster.endpoint,
                    "KVSTORE_TENANT": TENANT,
                    "KVSTORE_BLOCK_SIZE": str(CHUNK),
                    "KVSTORE_DTYPE": "bfloat16",
                }
            )
            remote = self.remote(config)
            sent = self.chunk(remote, seed=500)
            remote.submit_put_task(key(500), sent).result(timeout=30)
            self.assertSameChunk(remote.get_blocking(key(500)), sent)


if __name__ == "__main__":
    unittest.main()
