"""The kvcache package against a real leader and member (`kv-store`, started here, stopped at the
end): round trips from 1 B to 4 MiB, registered buffers and the batch paths, refusals as
exceptions carrying the store's code, and ``Store.from_env`` with the injected variables.

``KVSTORE_BIN`` names the kv-store binary (``scripts/test`` sets it)."""

import ctypes
import os
import subprocess
import threading
import time
import unittest
from unittest import mock

import kvcache
from store_cluster import Cluster, start

TENANT, BLOCK_SIZE, DTYPE = "py", 16, "bfloat16"


class StoreTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(
            [f"{TENANT}=64Mi:{BLOCK_SIZE}:{DTYPE}", f"small=1Mi:{BLOCK_SIZE}:{DTYPE}"], capacity="128Mi"
        )
        cls.endpoint = cls.cluster.endpoint
        cls.store = kvcache.Store(cls.endpoint, TENANT, BLOCK_SIZE, DTYPE)

    @classmethod
    def tearDownClass(cls):
        cls.store.close()
        cls.cluster.stop()

    def test_round_trips_from_one_byte_to_four_mebibytes(self):
        for n in (1, 7, 4096, 65537, 1 << 20, 4 << 20):
            value = os.urandom(n)
            key = f"rt/{n}"
            self.store.put(key, value)
            self.assertEqual(self.store.get(key), value, n)
            self.assertEqual(self.store.is_exist(key), 1)
        self.assertIsNone(self.store.get("rt/absent"))
        self.assertEqual(self.store.is_exist("rt/absent"), 0)
        self.assertEqual(self.store.batch_is_exist(["rt/1", "rt/absent", "rt/4096"]), [1, 0, 1])
        self.store.put("rt/removable", b"x")
        self.assertEqual(self.store.remove("rt/removable"), 1)
        self.assertEqual(self.store.remove("rt/removable"), 0)
        self.assertIsNone(self.store.get("rt/removable"))

    def test_batches_move_registered_memory(self):
        n, size = 16, 256 << 10
        src = ctypes.create_string_buffer(os.urandom(n * size), n * size)
        dst = ctypes.create_string_buffer(n * size)
        base_src, base_dst = ctypes.addressof(src), ctypes.addressof(dst)
        keys = [f"batch/{i}" for i in range(n)]
        ptrs = [base_src + i * size for i in range(n)]
        sizes = [size] * n
        unregistered = self.store.batch_put_from(keys, ptrs, sizes)
        self.assertEqual(unregistered, [kvcache.CODES["INVALID_ARGUMENT"]] * n, "memory must be registered first")
        self.assertEqual(self.store.register_buffer(base_src, n * size), 0)
        self.assertEqual(self.store.register_buffer(base_dst, n * size), 0)
        self.assertEqual(self.store.batch_put_from(keys, ptrs, sizes), [0] * n)
        dsts = [base_dst + i * size for i in range(n)]
        spare = ctypes.create_string_buffer(size)
        self.assertEqual(self.store.register_buffer(ctypes.addressof(spare), size), 0)
        got = self.store.batch_get_into(keys + ["batch/absent"], dsts + [ctypes.addressof(spare)], sizes + [size])
        self.assertEqual(got, [size] * n + [kvcache.KEY_NOT_FOUND])
        self.assertEqual(dst.raw, src.raw)
        # two destinations of one call may not overlap: the later one is refused, alone
        overlapping = self.store.batch_get_into(keys[:2], [base_dst, base_dst + 1], sizes[:2])
        self.assertEqual(overlapping, [size, kvcache.CODES["INVALID_ARGUMENT"]])
        # a destination smaller than the value is not written
        small = self.store.batch_get_into(["batch/0"], [base_dst], [size - 1])
        self.assertEqual(small, [kvcache.CODES["VALUE_TOO_LARGE"]])
        self.assertEqual(self.store.unregister_buffer(base_src), 0)
        self.assertEqual(self.store.unregister_buffer(base_src), -1)
        with self.assertRaises(kvcache.StoreError) as e:
            self.store.batch_put_from(["a"], [1, 2], [3])
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(self.store.unregister_buffer(base_dst), 0)

    def test_values_gather_from_and_scatter_into_several_ranges(self):
        # four values of three parts each, the parts strided through two buffers (as a block's
        # pages lie in one KV cache tensor per layer), over the mapping and over TCP
        n, part, layers = 4, 64 << 10, 3
        src = [ctypes.create_string_buffer(os.urandom(n * part), n * part) for _ in range(layers)]
        keys = [f"parts/{i}" for i in range(n)]
        ptrs = lambda bufs: [[ctypes.addressof(b) + i * part for b in bufs] for i in range(n)]  # noqa: E731
        sizes = [[part] * layers] * n
        for b in src:
            self.store.register_buffer(ctypes.addressof(b), n * part)
        self.assertEqual(self.store.batch_put_from_parts(keys, ptrs(src), sizes), [0] * n)
        # the value is the concatenation of its parts
        self.assertEqual(self.store.get("parts/1"), b"".join(b.raw[part : 2 * part] for b in src))
        for same_host in (True, False):
            s = kvcache.Store(self.endpoint, TENANT, BLOCK_SIZE, DTYPE, same_host=same_host)
            dst = [ctypes.create_string_buffer(n * part) for _ in range(layers)]
            spare = ctypes.create_string_buffer(part)
            for b in dst + [spare]:
                s.register_buffer(ctypes.addressof(b), len(b))
            got = s.batch_get_into_parts(
                keys + ["parts/absent"], ptrs(dst) + [[ctypes.addressof(spare)]], sizes + [[part]]
            )
            self.assertEqual(got, [part * layers] * n + [kvcache.KEY_NOT_FOUND])
            self.assertEqual([b.raw for b in dst], [b.raw for b in src], f"same_host={same_host}")
            # parts must add up to the value exactly; nothing is read otherwise
            short = s.batch_get_into_parts(keys[:1], [ptrs(dst)[0][:2]], [[part, part]])
            self.assertEqual(short, [kvcache.CODES["VALUE_TOO_LARGE"]])
            long = s.batch_get_into_parts(keys[:1], [ptrs(dst)[0] + [ctypes.addressof(dst[0]) + part]], [[part] * 4])
            self.assertEqual(long, [kvcache.CODES["INVALID_ARGUMENT"]])
            # parts of one call may not overlap
            twice = s.batch_get_into_parts(keys[:2], [ptrs(dst)[0], ptrs(dst)[0]], sizes[:2])
            self.assertEqual(twice, [part * layers, kvcache.CODES["INVALID_ARGUMENT"]])
            s.close()
        for b in src:
            self.store.unregister_buffer(ctypes.addressof(b))

    def assertRefused(self, code, f, *args):
        with self.assertRaises(kvcache.StoreError) as e:
            f(*args)
        self.assertEqual(e.exception.code, code, str(e.exception))
        self.assertTrue(str(e.exception).startswith(code + ":"), str(e.exception))

    def test_refusals_are_exceptions_with_the_store_code(self):
        stranger = kvcache.Store(self.endpoint, "nobody", BLOCK_SIZE, DTYPE)
        self.assertRefused("UNAUTHENTICATED", stranger.put, "k", b"v")
        self.assertRefused("UNAUTHENTICATED", stranger.get, "k")
        wrong = kvcache.Store(self.endpoint, TENANT, BLOCK_SIZE, "fp8")
        self.assertRefused("TENANT_LAYOUT_MISMATCH", wrong.put, "k", b"v")
        self.assertRefused("INVALID_ARGUMENT", self.store.put, "", b"v")
        self.assertRefused("VALUE_TOO_LARGE", self.store.put, "huge", bytes(9 << 20))
        small = kvcache.Store(self.endpoint, "small", BLOCK_SIZE, DTYPE)
        self.assertRefused("TENANT_QUOTA_EXCEEDED", small.put, "big", bytes(2 << 20))
        self.assertRefused("TRANSPORT", kvcache.Store, "127.0.0.1:1", TENANT, BLOCK_SIZE, DTYPE)
        # a value just read is leased to its reader: it cannot be removed under it
        self.store.put("leased", b"v")
        self.assertEqual(self.store.get("leased"), b"v")
        self.assertRefused("OBJECT_HAS_LEASE", self.store.remove, "leased")
        for s in (stranger, wrong, small):
            s.close()
        closed = kvcache.Store(self.endpoint, TENANT, BLOCK_SIZE, DTYPE)
        closed.close()
        self.assertRefused("INVALID_ARGUMENT", closed.get, "k")
        # every code has its batch number, and the numbers are distinct
        self.assertEqual(len(set(kvcache.CODES.values())), len(kvcache.CODES))
        self.assertIn("STALE_EPOCH", kvcache.CODES)

    def test_calls_release_the_gil(self):
        import signal
        import threading

        leader, listening = start(["leader", "--listen", "127.0.0.1:0", "--spin", "0", "--multi-tenancy=false"])
        try:
            s = kvcache.Store(listening["grpc"], "default", BLOCK_SIZE, DTYPE)
            os.kill(leader.pid, signal.SIGSTOP)
            # resumes the leader in 5 s whatever happens here, so a held GIL cannot hang the test
            waker = subprocess.Popen(["sh", "-c", f"sleep 5; kill -CONT {leader.pid}"], start_new_session=True)
            worker = threading.Thread(target=lambda: s.is_exist("k"))
            worker.start()
            # this thread runs while the worker waits on the stopped leader inside the extension
            ran = sum(range(100_000))
            self.assertTrue(worker.is_alive(), "the call held the GIL: this thread ran only after it returned")
            self.assertEqual(ran, 4_999_950_000)
            os.kill(leader.pid, signal.SIGCONT)
            worker.join(timeout=30)
            self.assertFalse(worker.is_alive())
            os.killpg(waker.pid, signal.SIGKILL)
            waker.wait()
            s.close()
        finally:
            os.kill(leader.pid, signal.SIGCONT)
            leader.terminate()
            leader.wait(timeout=10)
            leader.stdout.close()

    def test_block_events_follow_the_cache(self):
        w = self.store.watch_blocks()
        first = w.next(timeout=10)
        self.assertEqual((first["type"], first["snapshot"], first["epoch"]), ("cleared", True, 0))
        # then the blocks held now (other tests' keys), all marked as the snapshot
        held = []
        while (e := w.next(timeout=0.5)) is not None:
            self.assertEqual((e["type"], e["snapshot"]), ("stored", True))
            held.extend(e["keys"])
        self.assertEqual(len(held), len(set(held)))
        self.store.put("events/k", b"block")
        live = w.next(timeout=10)
        self.assertEqual(
            (live["type"], live["keys"], live["size"], live["snapshot"]), ("stored", ["events/k"], 5, False)
        )
        self.assertEqual(self.store.remove("events/k"), 1)
        removed = w.next(timeout=10)
        self.assertEqual((removed["type"], removed["keys"], removed["reason"]), ("removed", ["events/k"], "removed"))
        self.assertEqual(removed["id"], live["id"] + 1)
        self.assertIsNone(w.next(timeout=0.1), "nothing else happened")
        w.close()
        self.assertIsNone(w.next(timeout=0.1))
        self.assertEqual(list(w), [], "a closed watch iterates nothing")

    def test_closing_a_watch_another_thread_waits_on_returns_at_once(self):
        w = self.store.watch_blocks()
        self.assertEqual(w.next(timeout=10)["type"], "cleared")
        while w.next(timeout=0.5) is not None:
            pass
        got = []
        waiter = threading.Thread(target=lambda: got.append(w.next()), daemon=True)
        waiter.start()
        # nothing happens in this tenant meanwhile, so the thread is blocked in its untimed next()
        waiter.join(timeout=0.5)
        self.assertTrue(waiter.is_alive())
        started = time.monotonic()
        w.close()
        self.assertLess(time.monotonic() - started, 1.0, "close() waited for the other thread's next()")
        waiter.join(timeout=1.0)
        self.assertFalse(waiter.is_alive(), "the waiting next() gives up on close")
        self.assertEqual(got, [None])

    def test_from_env_reads_what_injection_gives_a_replica(self):
        env = {
            "KVSTORE_LEADER": self.endpoint,
            "KVSTORE_TENANT": TENANT,
            "KVSTORE_BLOCK_SIZE": str(BLOCK_SIZE),
            "KVSTORE_DTYPE": DTYPE,
        }
        # the environment is restored however the test ends
        with mock.patch.dict(os.environ):
            os.environ.update(env)
            s = kvcache.Store.from_env()
            s.put("env/k", b"from the environment")
            self.assertEqual(self.store.get("env/k"), b"from the environment")
            self.assertEqual(s.endpoint, self.endpoint)
            s.close()
            # the vLLM path's names
            del os.environ["KVSTORE_LEADER"], os.environ["KVSTORE_TENANT"]
            os.environ["MOONCAKE_MASTER"], os.environ["MOONCAKE_TENANT_ID"] = self.endpoint, TENANT
            self.assertEqual(kvcache.Store.from_env().get("env/k"), b"from the environment")
            del os.environ["MOONCAKE_MASTER"]
            self.assertRefused("INVALID_ARGUMENT", kvcache.Store.from_env)
            os.environ["MOONCAKE_MASTER"] = self.endpoint
            del os.environ["KVSTORE_DTYPE"]
            self.assertRefused("INVALID_ARGUMENT", kvcache.Store.from_env)

    def test_the_package_and_the_store_are_one_release(self):
        from store_cluster import BIN

        said = subprocess.run([BIN, "--version"], capture_output=True, text=True, check=True).stdout.split()
        self.assertEqual(said, ["kv-store", kvcache.__version__])
        self.assertEqual(kvcache.PROTOCOL, 4)

    def test_a_call_given_up_after_its_timeout_is_a_transport_failure(self):
        # a listener that accepts and never answers: the connection never completes its handshake
        import socket

        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
            with self.assertRaises(kvcache.StoreError) as e:
                kvcache.Store(endpoint, TENANT, BLOCK_SIZE, DTYPE, timeout_ms=300)
            self.assertEqual(e.exception.code, "TRANSPORT", str(e.exception))
            self.assertIn("within 300 ms", str(e.exception))


if __name__ == "__main__":
    unittest.main()
