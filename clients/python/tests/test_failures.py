"""The refusals an engine meets when the store is not well: a standby leader (NOT_SERVING), no
segment with room (NO_SPACE), a remove racing a put of the same key (PUT_IN_PROGRESS), a writer too
slow for its reservation (PUT_EXPIRED), a reader too slow for its lease (LEASE_EXPIRED), and a read
that reaches its member after the member remounted under a restarted leader (STALE_MOUNT), and a
call without its tenant's credential (UNAUTHENTICATED). Each is
raised through the package, from a real leader and members (`kv-store`, started and stopped here).

The slow network is a forwarder of our own between the client and the member: the member
advertises 127.0.0.2 (`--advertise-host`), the forwarder listens on 127.0.0.2 at the member's
ports and passes the bytes on to 127.0.0.1, holding them back when a test says so."""

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from unittest import mock

import kvcache
from store_cluster import Cluster as PlainCluster
from store_cluster import start

BLOCK_SIZE, DTYPE = 16, "bfloat16"

# Every store code, and where a package call meets it. A new code fails this file until it is
# placed here.
RAISED_IN_TEST_STORE = {
    "TENANT_LAYOUT_MISMATCH",
    "TENANT_QUOTA_EXCEEDED",
    "INVALID_ARGUMENT",
    "VALUE_TOO_LARGE",
    "OBJECT_HAS_LEASE",
    "TRANSPORT",
}
RAISED_HERE = {
    "NOT_SERVING",
    "NO_SPACE",
    "PUT_IN_PROGRESS",
    "PUT_EXPIRED",
    "LEASE_EXPIRED",
    "STALE_MOUNT",
    "UNAUTHENTICATED",
}
RAISED_IN_THE_STORES_TESTS = {
    # this package and its store come from one build; store/tests/versions.rs sends other
    # protocols (and none) on both of the leader's faces
    "CLIENT_VERSION_UNSUPPORTED",
}
NOT_FROM_AN_ENGINE_CALL = {
    "TENANT_LAYOUT_IMMUTABLE": "the Control API's SetTenants, which only the controllers call",
    "INVALID_TENANT_LEDGER": "the Control API's SetTenants",
    "UNKNOWN_MEMBER": "the Membership API, which only members call",
    "MEMBER_NAME_TAKEN": "the Membership API",
    "LEDGER_PENDING": "the Membership API: a member's mount waits for the new term's ledger (leader/tests.rs tests it)",
    "STALE_EPOCH": "a range from a deposed elected leader (member/segment.rs tests it)",
    "RANGE_BUSY": "a range the leader handed out twice, which it never does (member/mmap.rs tests it)",
    "OUT_OF_RANGE": "a range outside the segment, which the leader never hands out",
    "INTERNAL": "a bug",
}
PUT_TTL, LEASE_TTL = 0.3, 0.3


def stop(procs):
    for p in reversed(procs):
        p.terminate()
        p.wait(timeout=10)
        p.stdout.close()


class Forwarder:
    """Accepts on `listen` and relays each connection to `target`. ``hold_upload(after)`` stops
    relaying client bytes once `after` of them have passed (``upload_held`` is set then), until
    ``release_upload``; ``delay_download(s)`` holds the next bytes towards the client for `s`."""

    def __init__(self, listen, target):
        self.target = target
        self.lock = threading.Lock()
        self.upload_budget = None  # bytes still relayed before holding; None: no hold
        self.upload_open = threading.Event()
        self.upload_open.set()
        self.upload_held = threading.Event()
        self.download_delay = 0.0
        self.sock = socket.create_server(listen)
        self.conns = []
        self.closed = False
        threading.Thread(target=self.accept, daemon=True).start()

    def hold_upload(self, after):
        with self.lock:
            self.upload_budget = after
            self.upload_held.clear()
            self.upload_open.clear()

    def release_upload(self):
        with self.lock:
            self.upload_budget = None
        self.upload_open.set()

    def delay_download(self, seconds):
        with self.lock:
            self.download_delay = seconds

    def accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns += [client, server]
            threading.Thread(target=self.upload, args=(client, server), daemon=True).start()
            threading.Thread(target=self.download, args=(server, client), daemon=True).start()

    def upload(self, src, dst):
        try:
            self.relay_upload(src, dst)
        except OSError:
            pass  # closed under it
        dst.close()

    def relay_upload(self, src, dst):
        while chunk := self.recv(src):
            with self.lock:
                budget = self.upload_budget
                if budget is not None:
                    self.upload_budget = max(0, budget - len(chunk))
            if budget is not None and budget < len(chunk):
                dst.sendall(chunk[:budget])
                chunk = chunk[budget:]
                self.upload_held.set()
                self.upload_open.wait()
            dst.sendall(chunk)

    def download(self, src, dst):
        try:
            self.relay_download(src, dst)
        except OSError:
            pass
        dst.close()

    def relay_download(self, src, dst):
        while chunk := self.recv(src):
            with self.lock:
                delay, self.download_delay = self.download_delay, 0.0
            time.sleep(delay)
            dst.sendall(chunk)

    @staticmethod
    def recv(s):
        try:
            return s.recv(1 << 20)
        except OSError:
            return b""

    def close(self):
        self.release_upload()
        self.sock.close()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relayed_port(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


class Cluster:
    """A leader with `tenant` and members of `capacities`; the first member is reached only
    through a Forwarder (``self.forwarders``, one per port it advertises) when `forward`."""

    def __init__(self, tenant, capacities, leader_args=(), forward=False):
        self.shm = tempfile.TemporaryDirectory()
        # the backend's seal key, shared by its leaders: a restarted leader adopts only what a
        # leader sealed with it
        self.secrets = tempfile.TemporaryDirectory()
        seal_key = os.path.join(self.secrets.name, "seal.key")
        with open(seal_key, "w") as f:
            f.write("the-seal-key-of-this-test\n")
        self.procs, self.forwarders, self.member_metrics = [], [], []
        self.leader_args = [
            "leader",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--fast-listen",
            f"127.0.0.1:{free_port()}",
            "--metrics-listen",
            "127.0.0.1:0",
            "--spin",
            "0",
            "--tenant",
            tenant,
            "--seal-key-file",
            seal_key,
            *leader_args,
        ]
        try:
            leader, listening = start(self.leader_args)
            self.procs.append(leader)
            self.endpoint, self.metrics = listening["grpc"], listening["metrics"]
            for i, capacity in enumerate(capacities):
                args = [
                    "member",
                    "--leader",
                    self.endpoint,
                    "--capacity",
                    capacity,
                    "--name",
                    f"member-{i}",
                    "--shm-dir",
                    self.shm.name,
                    "--no-prefault",
                    "--spin",
                    "0",
                    "--metrics-listen",
                    "127.0.0.1:0",
                ]
                if forward and i == 0:
                    # the member's bytes must cross the forwarder (members map nothing without --same-host)
                    args += ["--advertise-host", "127.0.0.2"]
                member, ports = start(args)
                self.procs.append(member)
                self.member_metrics.append(ports["metrics"])
                if forward and i == 0:
                    for name in ("data", "grpc"):
                        host, port = relayed_port(ports[name])
                        self.forwarders.append(Forwarder(("127.0.0.2", port), (host, port)))
        except BaseException:
            self.stop()
            raise

    def restart_leader(self):
        """Stops the leader and starts a new one at the same ports (its members hand over what they hold)."""
        stop(self.procs[:1])
        self.procs[0], listening = start(self.leader_args)
        self.metrics = listening["metrics"]

    def gauge(self, name, metrics=None):
        """A gauge of the leader (or of the process whose metrics listen at `metrics`)."""
        with urllib.request.urlopen(f"http://{metrics or self.metrics}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"{metrics or 'the leader'} exports no {name}")

    def wait_sealed(self, values):
        """Waits until the members hold `values` values sealed for a next leader (a seal reaches
        a member with its next heartbeat answer after the put)."""
        deadline = time.monotonic() + 20
        while sum(self.gauge("kvstore_member_handover_values", m) for m in self.member_metrics) < values:
            assert time.monotonic() < deadline, f"the members never held {values} values sealed"
            time.sleep(0.02)

    def used(self):
        """Bytes held by objects and reservations."""
        return self.gauge("kvstore_used_bytes")

    def stop(self):
        for f in self.forwarders:
            f.close()
        stop(self.procs)
        self.procs = []
        self.shm.cleanup()
        self.secrets.cleanup()


class FailureTest(unittest.TestCase):
    def assertRefused(self, code, f, *args):
        with self.assertRaises(kvcache.StoreError) as e:
            f(*args)
        self.assertEqual(e.exception.code, code, str(e.exception))
        self.assertTrue(str(e.exception).startswith(code + ":"), str(e.exception))
        self.assertLess(kvcache.CODES[code], 0)
        return e.exception

    def test_every_code_has_its_place(self):
        placed = RAISED_IN_TEST_STORE | RAISED_HERE | RAISED_IN_THE_STORES_TESTS | set(NOT_FROM_AN_ENGINE_CALL)
        self.assertEqual(placed, set(kvcache.CODES))
        self.assertEqual(
            len(placed),
            len(RAISED_IN_TEST_STORE)
            + len(RAISED_HERE)
            + len(RAISED_IN_THE_STORES_TESTS)
            + len(NOT_FROM_AN_ENGINE_CALL),
        )

    def test_a_standby_leader_is_not_serving(self):
        # an election whose Lease API cannot be reached: the leader listens and stands by
        with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as kubeconfig:
            kubeconfig.write(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
                "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
            )
            kubeconfig.flush()
            leader, listening = start(
                [
                    "leader",
                    "--listen",
                    "127.0.0.1:0",
                    "--spin",
                    "0",
                    "--tenant",
                    f"t=1Mi:{BLOCK_SIZE}:{DTYPE}",
                    "--election",
                    "kubernetes",
                    "--lease",
                    "default/kv",
                    "--kubeconfig",
                    kubeconfig.name,
                ],
                until="standby",
            )
            try:
                self.assertRefused(
                    "NOT_SERVING", lambda: kvcache.Store(listening["grpc"], "t", BLOCK_SIZE, DTYPE).put("k", b"v")
                )
            finally:
                stop([leader])

    def test_a_tenant_bound_to_a_credential_takes_only_calls_that_carry_it(self):
        secret = "credential-of-team-a"
        digest = hashlib.sha256(secret.encode()).hexdigest()
        c = PlainCluster([f"team-a=16Mi:{BLOCK_SIZE}:{DTYPE},sha256={digest}"], capacity="32Mi")
        try:
            mine = kvcache.Store(c.endpoint, "team-a", BLOCK_SIZE, DTYPE, credential=secret)
            mine.put("k", b"team-a's bytes")
            self.assertEqual(mine.get("k"), b"team-a's bytes")
            for credential in ("", "credential-of-team-b"):
                other = kvcache.Store(c.endpoint, "team-a", BLOCK_SIZE, DTYPE, credential=credential)
                for call, args in (
                    (other.get, ("k",)),
                    (other.put, ("k2", b"x")),
                    (other.is_exist, ("k",)),
                    (other.remove, ("k",)),
                ):
                    self.assertRefused("UNAUTHENTICATED", call, *args)
                self.assertRefused("UNAUTHENTICATED", other.batch_is_exist, ["k"])
                other.close()
            env = {
                "KVSTORE_LEADER": c.endpoint,
                "KVSTORE_TENANT": "team-a",
                "KVSTORE_BLOCK_SIZE": str(BLOCK_SIZE),
                "KVSTORE_DTYPE": DTYPE,
                "KVSTORE_CREDENTIAL": secret,
            }
            with mock.patch.dict(os.environ, env):
                injected = kvcache.Store.from_env()
            self.assertEqual(injected.get("k"), b"team-a's bytes", "injection hands the credential on")
            injected.close()
            mine.close()
        finally:
            c.stop()

    def test_no_segment_with_room_is_no_space(self):
        # the grant (2 MiB over two members) admits the value, but no one segment can hold it
        c = Cluster(f"t=64Mi:{BLOCK_SIZE}:{DTYPE}", ["1Mi", "1Mi"])
        try:
            store = kvcache.Store(c.endpoint, "t", BLOCK_SIZE, DTYPE)
            e = self.assertRefused("NO_SPACE", store.put, "wide", os.urandom(3 << 19))
            self.assertIn("add members", str(e))
            store.put("narrow", b"fits")
            self.assertEqual(store.get("narrow"), b"fits")
            store.close()
        finally:
            c.stop()

    def test_slow_writers_and_readers_are_refused(self):
        c = Cluster(
            f"t=64Mi:{BLOCK_SIZE}:{DTYPE}",
            ["64Mi"],
            forward=True,
            leader_args=[
                "--put-ttl",
                f"{int(PUT_TTL * 1000)}ms",
                "--put-grace",
                f"{int(PUT_TTL * 1000)}ms",
                "--lease-ttl",
                f"{int(LEASE_TTL * 1000)}ms",
            ],
        )
        data = c.forwarders[0]
        writer = kvcache.Store(c.endpoint, "t", BLOCK_SIZE, DTYPE)
        other = kvcache.Store(c.endpoint, "t", BLOCK_SIZE, DTYPE)
        try:
            value = os.urandom(4 << 20)
            # the write starts (its header and some bytes reach the member), then stalls
            data.hold_upload(after=256 << 10)
            failure = {}

            def slow_put():
                try:
                    writer.put("slow", value)
                except kvcache.StoreError as e:
                    failure["put"] = e

            t = threading.Thread(target=slow_put)
            t.start()
            self.assertTrue(data.upload_held.wait(10), "the put never reached the member")
            # PUT_IN_PROGRESS: the key is reserved for the stalled writer, so it cannot be removed;
            # a second put of it is answered "already there" (keys name their bytes) and is invisible
            self.assertRefused("PUT_IN_PROGRESS", other.remove, "slow")
            other.put("slow", value)
            self.assertEqual(other.is_exist("slow"), 0, "a reserved value is not there until committed")
            # PUT_EXPIRED: the reservation outlives its TTL and grace and is reclaimed; then the
            # writer's bytes arrive and its commit finds nothing to commit
            deadline = time.monotonic() + 10
            while c.used() != 0:
                self.assertLess(time.monotonic(), deadline, "the abandoned reservation was never reclaimed")
                time.sleep(0.05)
            data.release_upload()
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertIn("put", failure, "a put whose reservation was reclaimed must fail")
            self.assertEqual(failure["put"].code, "PUT_EXPIRED", str(failure["put"]))
            self.assertIsNone(other.get("slow"), "an expired put must leave nothing behind")
            # the key is free again: a put that keeps to its deadline succeeds
            other.put("slow", value)
            self.assertEqual(other.get("slow"), value)
            # LEASE_EXPIRED: the bytes reach the reader after its read lease ran out
            data.delay_download(LEASE_TTL * 2)
            self.assertRefused("LEASE_EXPIRED", writer.get, "slow")
            self.assertEqual(writer.get("slow"), value, "a read within its lease returns the bytes")
        finally:
            writer.close()
            other.close()
            c.stop()

    def test_a_read_across_a_remount_is_a_stale_mount(self):
        c = Cluster(f"t=64Mi:{BLOCK_SIZE}:{DTYPE}", ["64Mi"], forward=True)
        data = c.forwarders[0]
        store = kvcache.Store(c.endpoint, "t", BLOCK_SIZE, DTYPE)
        try:
            store.put("k", b"old leader's bytes")
            c.wait_sealed(1)
            # the leader says where "k" is; the read then waits on the way to the member while the
            # leader restarts and the member mounts its segment again under the new one
            data.hold_upload(after=0)
            failure = {}

            def read():
                try:
                    failure["got"] = store.get("k")
                except kvcache.StoreError as e:
                    failure["error"] = e

            t = threading.Thread(target=read)
            t.start()
            self.assertTrue(data.upload_held.wait(10), "the read never reached the member")
            c.restart_leader()
            deadline = time.monotonic() + 20
            while c.gauge("kvstore_members") != 1:
                self.assertLess(time.monotonic(), deadline, "the member never mounted under the new leader")
                time.sleep(0.05)
            data.release_upload()
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertNotIn("got", failure, "a range of the old mount must not be read")
            self.assertEqual(failure["error"].code, "STALE_MOUNT", str(failure["error"]))
            self.assertLess(kvcache.CODES["STALE_MOUNT"], 0)
            # asked again, the new leader hands out the member's range of the new mount: the value
            # survived the restart
            self.assertEqual(store.get("k"), b"old leader's bytes")
        finally:
            store.close()
            c.stop()

    def test_calls_out_when_the_interpreter_exits_are_given_up_and_it_exits_cleanly(self):
        # Daemon threads with calls out (a connect to a leader that never answers, a put stalled on
        # its way to the member) when the main thread ends: each call is given up before the
        # interpreter finalizes, and the process exits 0 (CPython before 3.14 ends a thread that
        # asks for the GIL back during finalization, which aborted the process). The thread that
        # runs the atexit hooks still calls as before.
        c = Cluster(f"t=64Mi:{BLOCK_SIZE}:{DTYPE}", ["64Mi"], forward=True)
        silent = socket.create_server(("127.0.0.1", 0))
        # the report is registered with atexit before kvcache is imported, so it runs after the
        # package's own hook gave the calls up
        script = f"""
import atexit, sys, threading
threads, said = [], []
def report():
    for t in threads:
        t.join(10)
    # the thread that finalizes goes on calling (the leader's own port: no forwarder in the way)
    try:
        said.append("finalizing thread: exists " + str(store.is_exist("k")))
    except kvcache.StoreError as e:
        said.append("finalizing thread: " + str(e))
    print("\\n".join(said), flush=True)
atexit.register(report)
import kvcache
def out(name, call):
    try:
        call()
        said.append(name + " answered")
    except kvcache.StoreError as e:
        said.append(name + " given up: " + str(e))
store = kvcache.Store({c.endpoint!r}, "t", {BLOCK_SIZE}, {DTYPE!r})
calls = {{
    "connect": lambda: kvcache.Store("127.0.0.1:{silent.getsockname()[1]}", "t", {BLOCK_SIZE}, {DTYPE!r}),
    "put": lambda: store.put("k", bytes(1 << 20)),
}}
for name, call in calls.items():
    threads.append(threading.Thread(target=out, args=(name, call), daemon=True))
    threads[-1].start()
print("calling", flush=True)
sys.stdin.readline()
"""
        data = c.forwarders[0]
        data.hold_upload(after=0)
        p = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            self.assertEqual(p.stdout.readline().strip(), "calling")
            silent.settimeout(10)
            conn, _ = silent.accept()  # the connect is out
            self.assertTrue(data.upload_held.wait(10), "the put never reached the member")
            out, err = p.communicate("exit\n", timeout=30)
            conn.close()
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
            silent.close()
            c.stop()
        self.assertEqual(p.returncode, 0, err)
        self.assertNotIn("FATAL", err)
        given_up = "given up: TRANSPORT: the Python interpreter is exiting; the call was given up"
        for name in ("connect", "put"):
            self.assertIn(f"{name} {given_up}", out, err)
        self.assertIn("finalizing thread: exists 0", out, err)


if __name__ == "__main__":
    unittest.main()
