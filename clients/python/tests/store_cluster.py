"""A real store for the package's tests (the client's and the engine adapters'): one leader and
one member (`kv-store`, started here on loopback ports the OS picks, stopped by ``stop``).
``KVSTORE_BIN`` names the binary (``scripts/test`` sets it); the tenants are given as the
leader's ``--tenant`` specs."""

import json
import os
import subprocess
import tempfile

BIN = os.environ.get(
    "KVSTORE_BIN",
    os.path.join(
        os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/kvcache-target")), "debug", "kv-store"
    ),
)


def start(args, until="serving"):
    """Starts `kv-store ARGS` and returns it with its first event (the one naming its ports),
    once it reports readiness `until` (``serving``; a leader that lost its election: ``standby``)."""
    p = subprocess.Popen([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events = []
    for line in p.stdout:
        event = json.loads(line)
        events.append(event)
        if event.get("event") == "readiness" and event.get("state") == until:
            return p, events[0]
    p.wait()
    raise RuntimeError(f"kv-store {args[0]} exited before {until}: {events}")


class Cluster:
    """A leader with `tenants` (``NAME=QUOTA:BLOCK_SIZE:DTYPE`` each) and one member;
    ``endpoint`` is the leader's Client endpoint."""

    def __init__(self, tenants, capacity="256Mi", max_value_size="8Mi"):
        if not os.path.exists(BIN):
            raise RuntimeError(f"no kv-store binary at {BIN}: build it (cargo build) or set KVSTORE_BIN")
        self.shm = tempfile.TemporaryDirectory()
        self.procs = []
        try:
            args = ["leader", "--listen", "127.0.0.1:0", "--spin", "0", "--max-value-size", max_value_size]
            for t in tenants:
                args += ["--tenant", t]
            leader, listening = start(args)
            self.procs.append(leader)
            self.endpoint = listening["grpc"]
            member, _ = start(
                [
                    "member",
                    "--leader",
                    self.endpoint,
                    "--capacity",
                    capacity,
                    "--name",
                    "test-member",
                    "--shm-dir",
                    self.shm.name,
                    "--no-prefault",
                    "--spin",
                    "0",
                    "--max-value-size",
                    max_value_size,
                    # the package's same-host path is under test too
                    "--same-host",
                ]
            )
            self.procs.append(member)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
            p.wait(timeout=10)
            p.stdout.close()
        self.procs = []
        self.shm.cleanup()
