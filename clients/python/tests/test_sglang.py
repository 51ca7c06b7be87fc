"""`kvcache.sglang.HiCacheStore` inside the real SGLang (the version ``scripts/setup`` pins in the
engine environment) against a real leader and member: built by SGLang's own loader from the
extra config SGLang parses, on real CPU host pools, and driven by the calls SGLang's
HiCacheController makes (backup, hit query, prefetch), page bytes compared byte for byte.

Runs with the engine environment's python (``scripts/test``); ``KVSTORE_BIN`` names kv-store."""

import json
import os
import queue
import unittest
import warnings
from unittest import mock

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.managers.cache_controller import (  # noqa: E402
    HiCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

import kvcache  # noqa: E402
import kvcache.sglang  # noqa: E402
from store_cluster import Cluster  # noqa: E402

PAGE, LAYERS, HEADS, HEAD_DIM = 4, 3, 4, 32
TENANT, SMALL = "sgl", "sgl-small"


def host_pool(layout, seed=0):
    """A real SGLang MHA host pool on the CPU (as HiCache builds it beside a device pool), filled
    with random bytes."""
    device_tokens = 64
    k = tuple(torch.zeros(device_tokens, HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(device_tokens, HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    table = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=table(k), v_data_ptrs=table(v), layout=KVBufferLayout.NHD),
        page_size=PAGE,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    pool = MHATokenToKVPoolHost(
        info,
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=device_tokens,
        start_layer=0,
        end_layer=LAYERS,
    )
    g = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
    return pool


def page_bytes(pool, index):
    return pool.get_data_page(index, flat=True).contiguous().view(torch.uint8).clone()


def controller(backend, pool, zero_copy=True):
    """The HiCacheController methods that move pages between the host pool and storage, bound to
    `backend` and `pool` as attach_storage_backend binds them (no device, streams or threads)."""
    c = HiCacheController.__new__(HiCacheController)
    c.storage_backend, c.storage_host_pool, c.mem_pool_host = backend, pool, pool
    c.page_size = pool.page_size
    c.page_get_func = c._page_get_zero_copy if zero_copy else c._generic_page_get
    c.page_set_func = c._page_set_zero_copy if zero_copy else c._generic_page_set
    c.prefetch_sync_queue = queue.Queue()
    return c


class SGLangHiCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster([f"{TENANT}=64Mi:{PAGE}:bfloat16", f"{SMALL}=2Ki:{PAGE}:bfloat16"])
        cls.store = kvcache.Store(cls.cluster.endpoint, TENANT, PAGE, "bfloat16")
        cls.backends = []

    @classmethod
    def tearDownClass(cls):
        for b in cls.backends:
            b.close()
        cls.store.close()
        cls.cluster.stop()

    def extra_config(self, **over):
        """The extra config as SGLang parses `--hicache-storage-backend-extra-config`."""
        cfg = {
            "backend_name": "kvcache",
            "module_path": "kvcache.sglang",
            "class_name": "HiCacheStore",
            "interface_v1": 1,
            "endpoint": self.cluster.endpoint,
            "tenant": TENANT,
            "prefetch_threshold": 64,
        }
        cfg.update(over)
        cfg = {k: v for k, v in cfg.items() if v is not None}
        extra, threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(json.dumps(cfg))
        self.assertEqual(threshold, 64)
        return extra

    def attach(self, pool, extra, tp_rank=0, tp_size=1, model="org/model"):
        """What HiCacheController.attach_storage_backend does with `--hicache-storage-backend dynamic`."""
        config = HiCacheStorageConfig(
            tp_rank=tp_rank,
            tp_size=tp_size,
            pp_rank=0,
            pp_size=1,
            attn_cp_rank=0,
            attn_cp_size=1,
            is_mla_model=False,
            enable_storage_metrics=False,
            is_page_first_layout=pool.layout == "page_first",
            model_name=model,
            extra_config=extra,
        )
        backend = StorageBackendFactory.create_backend("dynamic", config, pool)
        backend.register_mem_pool_host(pool)
        backend.on_host_pools_registered()
        self.backends.append(backend)
        return backend

    def assertPagesEqual(self, pool, src, dst, pages):
        for p in range(pages):
            self.assertTrue(
                torch.equal(page_bytes(pool, src[p * PAGE].item()), page_bytes(pool, dst[p * PAGE].item())),
                f"page {p} differs after the round trip",
            )

    def test_the_loader_builds_it_from_the_extra_config(self):
        pool = host_pool("page_first")
        backend = self.attach(pool, self.extra_config())
        self.assertIsInstance(backend, kvcache.sglang.HiCacheStore)
        self.assertIsInstance(backend, HiCacheStorage)
        self.assertIs(backend.mem_pool_host, pool)
        self.assertTrue(backend.direct, "page_first pages are two ranges of the pool's own buffer")
        self.assertEqual(backend.store.endpoint, self.cluster.endpoint)

    def test_page_first_pages_round_trip_by_pointer(self):
        pool = host_pool("page_first", seed=1)
        backend = self.attach(pool, self.extra_config())
        pages = 6
        src = pool.alloc(pages * PAGE)
        tokens = list(range(1000, 1000 + pages * PAGE))
        keys = get_storage_hash_str(tokens, None, page_size=PAGE)
        self.assertEqual(backend.batch_exists(keys), 0)
        self.assertEqual(backend.batch_set_v1(keys, src), [True] * pages)
        self.assertEqual(backend.batch_exists(keys), pages)
        self.assertEqual(backend.batch_exists(keys[:2] + ["absent"] + keys[2:]), 2, "hits count from the first key")
        # each page is its K range and its V range, stored as they lie in the pool
        k_range = pool.kv_buffer[0, src[0] : src[0] + PAGE].contiguous().view(torch.uint8)
        stored = self.store.get(f"org/model:{keys[0]}@page_first@tp0of1#0")
        self.assertEqual(stored, k_range.numpy().tobytes())
        # a second set of the same pages is answered true without resending them
        self.assertEqual(backend.batch_set_v1(keys, src), [True] * pages)
        dst = pool.alloc(pages * PAGE)
        self.assertEqual(backend.batch_get_v1(keys, dst), [True] * pages)
        self.assertPagesEqual(pool, src, dst, pages)

    def test_layer_first_pages_are_staged_one_value_each(self):
        pool = host_pool("layer_first", seed=2)
        backend = self.attach(pool, self.extra_config(staging_pages=3))
        self.assertFalse(backend.direct, "a layer_first page is 2 x layers ranges: it is staged")
        pages = 8  # three staging rounds
        src = pool.alloc(pages * PAGE)
        keys = get_storage_hash_str(list(range(2000, 2000 + pages * PAGE)), None, page_size=PAGE)
        self.assertEqual(backend.batch_set_v1(keys, src), [True] * pages)
        self.assertEqual(backend.batch_exists(keys), pages)
        flat = self.store.get(f"org/model:{keys[3]}@layer_first@tp0of1")
        self.assertEqual(flat, page_bytes(pool, src[3 * PAGE].item()).numpy().tobytes())
        dst = pool.alloc(pages * PAGE)
        self.assertEqual(backend.batch_get_v1(keys, dst), [True] * pages)
        self.assertPagesEqual(pool, src, dst, pages)

    def test_the_controllers_backup_hit_query_and_prefetch(self):
        for layout in ("page_first", "layer_first"):
            with self.subTest(layout=layout):
                pool = host_pool(layout, seed=3)
                ctrl = controller(self.attach(pool, self.extra_config()), pool)
                pages = 5
                tokens = list(range(3000, 3000 + pages * PAGE))
                src = pool.alloc(pages * PAGE)
                backup = StorageOperation(src, tokens, hash_value=get_storage_hash_str(tokens, None, page_size=PAGE))
                ctrl._page_backup(backup)
                self.assertEqual(backup.completed_tokens, pages * PAGE)
                # a request sharing the first three pages, then diverging
                asked = tokens[: 3 * PAGE] + list(range(9000, 9000 + 2 * PAGE))
                prefetch = PrefetchOperation("req-1", asked)
                hashes, hit_tokens = ctrl._storage_hit_query(prefetch)
                self.assertEqual(hit_tokens, 3 * PAGE)
                self.assertEqual(hashes, backup.hash_value[:3])
                prefetch.hash_value = hashes
                prefetch.host_indices = pool.alloc(hit_tokens)
                self.assertEqual(ctrl._page_transfer(prefetch), 3)
                self.assertEqual(ctrl.prefetch_sync_queue.get_nowait().completed_tokens, 3 * PAGE)
                self.assertPagesEqual(pool, src, prefetch.host_indices, 3)

    def test_the_legacy_copy_interface(self):
        pool = host_pool("page_first", seed=4)
        backend = self.attach(pool, self.extra_config(interface_v1=0))
        self.assertFalse(backend.direct, "without interface_v1 SGLang only makes the copying calls")
        ctrl = controller(backend, pool, zero_copy=False)
        pages = 3
        tokens = list(range(4000, 4000 + pages * PAGE))
        src = pool.alloc(pages * PAGE)
        backup = StorageOperation(src, tokens, hash_value=get_storage_hash_str(tokens, None, page_size=PAGE))
        ctrl._page_backup(backup)
        self.assertEqual(backup.completed_tokens, pages * PAGE)
        prefetch = PrefetchOperation("req-2", tokens)
        prefetch.hash_value, hit = ctrl._storage_hit_query(prefetch)
        self.assertEqual(hit, pages * PAGE)
        prefetch.host_indices = pool.alloc(hit)
        self.assertEqual(ctrl._page_transfer(prefetch), pages)
        self.assertPagesEqual(pool, src, prefetch.host_indices, pages)
        self.assertTrue(backend.exists(backup.hash_value[0]))
        self.assertFalse(backend.exists("absent"))
        self.assertIsNone(backend.get("absent", pool.get_dummy_flat_data_page()))
        self.assertEqual(backend.batch_get(["absent"], [pool.get_dummy_flat_data_page()]), [None])

    def test_misses_refusals_and_bad_calls_answer_false(self):
        pool = host_pool("page_first", seed=5)
        backend = self.attach(pool, self.extra_config())
        dst = pool.alloc(2 * PAGE)
        before = page_bytes(pool, dst[0].item())
        self.assertEqual(backend.batch_get_v1(["never-stored-a", "never-stored-b"], dst), [False, False])
        self.assertTrue(torch.equal(page_bytes(pool, dst[0].item()), before), "a miss leaves the host page as it was")
        two_keys_one_page = backend.batch_set_v1(["a", "b"], dst[:PAGE])
        self.assertEqual(two_keys_one_page, [False, False], "one page of indices for two keys")
        # a tenant too small for a page: refusals are per page, not exceptions
        small = self.attach(pool, self.extra_config(tenant=SMALL))
        src = pool.alloc(3 * PAGE)
        keys = [f"quota-{i}" for i in range(3)]
        self.assertEqual(small.batch_set_v1(keys, src), [False] * 3, "2 KiB holds no 3 KiB range")
        self.assertEqual(small.batch_exists(keys), 0)
        self.assertEqual(small.batch_get_v1(keys, src), [False] * 3)

    def test_ranks_holding_different_heads_never_share_keys(self):
        pool = host_pool("page_first", seed=6)
        rank0 = self.attach(pool, self.extra_config(), tp_rank=0, tp_size=2)
        rank1 = self.attach(pool, self.extra_config(), tp_rank=1, tp_size=2)
        other_model = self.attach(pool, self.extra_config(), tp_rank=0, tp_size=2, model="org/other")
        src = pool.alloc(PAGE)
        self.assertEqual(rank0.batch_set_v1(["shared-page"], src), [True])
        self.assertEqual(rank0.batch_exists(["shared-page"]), 1)
        self.assertEqual(rank1.batch_exists(["shared-page"]), 0)
        self.assertEqual(other_model.batch_exists(["shared-page"]), 0)

    def test_the_connection_comes_from_the_environment_or_fails_clearly(self):
        names = ["KVSTORE_LEADER", "KVSTORE_TENANT", "KVSTORE_BLOCK_SIZE", "KVSTORE_DTYPE", "MOONCAKE_MASTER"]
        # the environment is restored however the test ends
        with mock.patch.dict(os.environ):
            for k in names:
                os.environ.pop(k, None)
            pool = host_pool("page_first", seed=7)
            with self.assertRaises(ValueError) as e:
                self.attach(pool, self.extra_config(endpoint=None))
            self.assertIn("endpoint", str(e.exception))
            self.assertIn("KVSTORE_LEADER", str(e.exception))
            os.environ.update(
                {
                    "KVSTORE_LEADER": self.cluster.endpoint,
                    "KVSTORE_TENANT": TENANT,
                    "KVSTORE_BLOCK_SIZE": str(PAGE),
                    "KVSTORE_DTYPE": "bfloat16",
                }
            )
            backend = self.attach(pool, self.extra_config(endpoint=None, tenant=None))
            src = pool.alloc(PAGE)
            self.assertEqual(backend.batch_set_v1(["from-env"], src), [True])
            self.assertIsNotNone(self.store.get("org/model:from-env@page_first@tp0of1#1"))
            # a declared layout unlike the domain's is the store's refusal, raised at attach time
            with self.assertRaises(kvcache.StoreError) as e:
                self.attach(pool, self.extra_config(block_size=PAGE * 2))
            self.assertEqual(e.exception.code, "TENANT_LAYOUT_MISMATCH")
            with self.assertRaises(kvcache.StoreError) as e:
                self.attach(pool, self.extra_config(tenant="nobody"))
            self.assertEqual(e.exception.code, "UNAUTHENTICATED")


if __name__ == "__main__":
    unittest.main()
