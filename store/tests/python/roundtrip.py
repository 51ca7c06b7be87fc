"""Drives the store from Python with grpcio stubs generated from store/proto/kvstore.proto at run
time: a two-phase put (PutStart at the leader, Write at the member, PutCommit), a get (Get at the
leader, Read at the member), byte-for-byte comparison, the batch forms, and the tenant refusal
codes.

usage: roundtrip.py PROTO_DIR OUT_DIR LEADER_ADDR TENANT
Prints "ok" and exits 0 on success; anything else is a failure.
"""
import os
import struct
import sys

proto_dir, out_dir, leader, tenant = sys.argv[1:5]

from grpc_tools import protoc  # noqa: E402

rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                  os.path.join(proto_dir, "kvstore.proto")])
if rc != 0:
    sys.exit(f"protoc failed with {rc}")
sys.path.insert(0, out_dir)

import grpc  # noqa: E402
import kvstore_pb2 as pb  # noqa: E402
import kvstore_pb2_grpc as rpc  # noqa: E402

OPTS = [("grpc.max_send_message_length", 80 << 20), ("grpc.max_receive_message_length", 80 << 20)]


class _SaysItsProtocol(grpc.UnaryUnaryClientInterceptor):
    """Every Store call names the store protocol this client speaks (the leader refuses calls
    that do not, with CLIENT_VERSION_UNSUPPORTED; store/README.md, "Versions"), and would show a
    tenant credential in x-kvstore-credential (this test's tenant takes calls without one)."""

    def intercept_unary_unary(self, continuation, details, request):
        meta = list(details.metadata or []) + [("x-kvstore-protocol", "4"), ("x-kvstore-client", "roundtrip.py")]
        return continuation(details._replace(metadata=meta), request)


store = rpc.StoreStub(grpc.intercept_channel(grpc.insecure_channel(leader, options=OPTS), _SaysItsProtocol()))
scope = pb.Scope(tenant=tenant, block_size=64, dtype="bfloat16")


def put(key, value):
    r = store.PutStart(pb.PutStartRequest(scope=scope, key=key, size=len(value)))
    if r.already_exists:
        return False
    loc = r.location
    member = rpc.SegmentDataStub(grpc.insecure_channel(loc.grpc_addr, options=OPTS))
    # the grant rides in metadata, as the data port's request header (store/src/wire.rs), so the
    # member checks it before it reads the value; the value's tag (whose value it is, which the
    # grant covers) follows the header
    grant = struct.pack("<IHHQQQQQQ32s", 0x3344564B, 1, len(loc.tag), loc.mount_id, loc.offset, len(value),
                        r.write_deadline_unix_ms, loc.epoch, loc.allocation, loc.grant_mac) + loc.tag
    member.Write(pb.WriteRequest(data=value), metadata=[("x-kvstore-grant-bin", grant)])
    store.PutCommit(pb.PutCommitRequest(scope=scope, key=key, put_id=r.put_id))
    return True


def get(key):
    r = store.Get(pb.GetRequest(scope=scope, key=key))
    if not r.found:
        return None
    loc = r.location
    member = rpc.SegmentDataStub(grpc.insecure_channel(loc.grpc_addr, options=OPTS))
    # the bytes arrive in pieces, in order
    pieces = member.Read(pb.ReadRequest(mount_id=loc.mount_id, epoch=loc.epoch, offset=loc.offset, len=loc.len,
                                        lease_deadline_unix_ms=r.lease_deadline_unix_ms, grant_mac=loc.grant_mac,
                                        allocation=loc.allocation))
    return b"".join(p.data for p in pieces)


values = {f"py/{i}": os.urandom(n) for i, n in enumerate([1, 4097, 65536, 1 << 20, 4 << 20])}
for k, v in values.items():
    assert put(k, v), f"{k} already existed"
for k, v in values.items():
    got = get(k)
    assert got == v, f"{k}: bytes differ ({len(got or b'')} vs {len(v)})"
assert get("py/absent") is None
assert store.Exists(pb.ExistsRequest(scope=scope, key="py/0")).exists
assert not put("py/0", b"again"), "an existing key is a no-op"

# the batch forms engines use, answered key by key
keys = list(values) + ["py/absent"]
assert list(store.BatchExists(pb.BatchExistsRequest(scope=scope, keys=keys)).exists) == [True] * 5 + [False]
found = [r.found for r in store.BatchGet(pb.BatchGetRequest(scope=scope, keys=keys)).results]
assert found == [True] * 5 + [False], found

stranger = pb.Scope(tenant="nobody", block_size=64, dtype="bfloat16")
try:
    store.PutStart(pb.PutStartRequest(scope=stranger, key="x", size=1))
    sys.exit("an unregistered tenant was allowed to write")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e.code()
    assert e.details().startswith("UNAUTHENTICATED"), e.details()
    codes = dict(e.trailing_metadata() or ())
    assert codes.get("x-kvstore-error") == "UNAUTHENTICATED", codes

wrong = pb.Scope(tenant=tenant, block_size=64, dtype="fp8_e4m3")
try:
    store.Get(pb.GetRequest(scope=wrong, key="py/0"))
    sys.exit("a mismatched dtype was allowed to read")
except grpc.RpcError as e:
    assert e.details().startswith("TENANT_LAYOUT_MISMATCH"), e.details()

print("ok")
