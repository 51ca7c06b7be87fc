//! Hostile callers, with real `kv-store` processes: what a caller with no credential, a reader
//! that never reads, or a writer that sends more than its grant can cost a leader or a member.
//! Each test measures the process it attacks (`/proc/<pid>/status`) and checks that the store
//! keeps serving an honest tenant.

#![allow(clippy::unwrap_used)]

mod common;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use common::{Proc, leader, member_with, scope};
use kvcache_store::client::Client;
use kvcache_store::proto::Scope;

const CONTROL_TOKEN: &str = "controllers-0123456789abcdef";
const MEMBER_TOKEN: &str = "members-fedcba9876543210";
const CREDENTIAL: &str = "credential-of-team-a";
const MIB: u64 = 1 << 20;

/// A process's resident memory at its peak (`VmHWM`) and its anonymous (heap) memory now
/// (`RssAnon`), in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap();
        kib << 10
    };
    (field("VmHWM:"), field("RssAnon:"))
}

fn token_file(dir: &std::path::Path, name: &str, token: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{token}\n")).unwrap();
    p.display().to_string()
}

/// Bytes already encoded as a protobuf message: what a hostile caller sends without building
/// the message (so the test itself does not hold millions of them).
#[derive(Debug, Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Sends `body` to `path` on `addr` as a unary call carrying `metadata`; the answer's status.
async fn raw_call(addr: &str, path: &'static str, body: Bytes, metadata: &[(&'static str, &str)]) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(body);
    for (k, v) in metadata {
        req.metadata_mut().insert(*k, v.parse().unwrap());
    }
    match grpc.unary(req, http::uri::PathAndQuery::from_static(path), Raw).await {
        Ok(_) => tonic::Status::ok("answered"),
        Err(s) => s,
    }
}

/// `n` empty entries of repeated field `field`: two bytes each on the wire, about 64 each once
/// decoded.
fn empty_entries(field: u32, n: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(2 * n);
    for _ in 0..n {
        b.put_u8(((field << 3) | 2) as u8);
        b.put_u8(0);
    }
    b.freeze()
}

/// A leader that takes the controllers' and members' tokens, with one tenant bound to
/// [`CREDENTIAL`], and a member that mounts with its token.
struct Guarded {
    _dir: tempfile::TempDir,
    leader: Proc,
    _member: Proc,
    addr: String,
}

fn guarded() -> Guarded {
    let dir = tempfile::tempdir().unwrap();
    let control = token_file(dir.path(), "control", CONTROL_TOKEN);
    let members = token_file(dir.path(), "member", MEMBER_TOKEN);
    let hash: String = kvcache_store::leader::ledger::credential_hash(CREDENTIAL)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tenant = format!("a=16Mi:64:bfloat16,sha256={hash}");
    let leader = leader(&[
        "--control-token-file",
        &control,
        "--member-token-file",
        &members,
        "--tenant",
        &tenant,
    ]);
    let addr = leader.field("grpc");
    let member = member_with(&addr, "m1", "64Mi", &["--member-token-file", &members]);
    Guarded {
        _dir: dir,
        leader,
        _member: member,
        addr,
    }
}

/// How many members the leader has mounted, asked with the controllers' token.
async fn members(addr: &str) -> usize {
    let mut c = kvcache_store::proto::control_client::ControlClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut req = tonic::Request::new(kvcache_store::proto::GetMembersRequest {});
    kvcache_store::auth::attach(&mut req, CONTROL_TOKEN).unwrap();
    c.get_members(req).await.map_or(0, |r| r.into_inner().members.len())
}

async fn wait_mounted(addr: &str) {
    common::eventually("the member mounted", || async { members(addr).await == 1 }).await;
}

fn team_a() -> Scope {
    Scope {
        credential: CREDENTIAL.into(),
        ..scope("a")
    }
}

/// Finding 1 of the second review: a caller with no token or credential is refused from its
/// headers, and its body (64 MiB of empty holdings, 4 MiB of empty ledger entries, 5 MiB of
/// empty keys), which would decode into gigabytes, is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_credentials_is_refused_before_its_request_is_read() {
    let g = guarded();
    let honest = Client::connect(&g.addr, team_a()).await.unwrap();
    wait_mounted(&g.addr).await;
    honest.put("before", Bytes::from_static(b"v")).await.unwrap();
    let pid = g.leader.child.id();
    let (peak_before, _) = memory(pid);

    // Membership.Mount: field 8 is `holdings`
    let mount = empty_entries(8, (64 * MIB / 2) as usize - 64);
    let refused = raw_call(&g.addr, "/kvstore.v1.Membership/Mount", mount.clone(), &[]).await;
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let wrong = raw_call(
        &g.addr,
        "/kvstore.v1.Membership/Mount",
        mount,
        &[("authorization", "Bearer not-the-member-token")],
    )
    .await;
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    // Control.SetTenants: field 1 is `tenants`
    let ledger = empty_entries(1, (4 * MIB / 2) as usize - 64);
    let refused = raw_call(&g.addr, "/kvstore.v1.Control/SetTenants", ledger, &[]).await;
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // Store.BatchExists without a credential: field 2 is `keys`
    let keys = empty_entries(2, (5 * MIB / 2) as usize - 64);
    let protocol = kvcache_store::protocol::PROTOCOL.to_string();
    let refused = raw_call(
        &g.addr,
        "/kvstore.v1.Store/BatchExists",
        keys.clone(),
        &[("x-kvstore-protocol", &protocol)],
    )
    .await;
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("x-kvstore-credential"), "{refused:?}");
    let wrong = raw_call(
        &g.addr,
        "/kvstore.v1.Store/BatchExists",
        keys,
        &[("x-kvstore-protocol", &protocol), ("x-kvstore-credential", "a-guess")],
    )
    .await;
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");

    let (peak_after, _) = memory(pid);
    let rise = peak_after.saturating_sub(peak_before);
    eprintln!("leader peak RSS rose {:.1} MiB", rise as f64 / MIB as f64);
    assert!(
        rise < 16 * MIB,
        "the leader's peak memory rose by {} MiB for requests it refused",
        rise / MIB
    );
    // the honest tenant and the member carry on
    assert_eq!(honest.get("before").await.unwrap().unwrap(), Bytes::from_static(b"v"));
    assert_eq!(members(&g.addr).await, 1);
}

/// A body longer than its method needs is cut where the method's limit is, with a refusal that
/// says so, even from a caller that shows the right credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_its_method_needs_is_refused() {
    let g = guarded();
    let protocol = kvcache_store::protocol::PROTOCOL.to_string();
    // a single-key call of 1 MiB (a key is at most 4 KiB)
    let refused = raw_call(
        &g.addr,
        "/kvstore.v1.Store/Exists",
        empty_entries(2, (MIB / 2) as usize),
        &[("x-kvstore-protocol", &protocol), ("x-kvstore-credential", CREDENTIAL)],
    )
    .await;
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    let control = format!("Bearer {CONTROL_TOKEN}");
    let refused = raw_call(
        &g.addr,
        "/kvstore.v1.Control/GetTenants",
        empty_entries(1, (MIB / 2) as usize),
        &[("authorization", &control)],
    )
    .await;
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
}

/// One HTTP/2 connection whose reader stops reading: each stream's window lets one piece of a
/// value through (80 KiB), and nothing more until the reader takes it.
struct Stalling {
    send: h2::client::SendRequest<Bytes>,
}

impl Stalling {
    async fn connect(addr: &str) -> Stalling {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(80 << 10)
            .initial_connection_window_size(64 << 20)
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap();
        tokio::spawn(conn);
        Stalling { send }
    }

    /// Starts a `SegmentData.Read` of `req` and waits for the answer's headers.
    async fn read(&mut self, req: &kvcache_store::proto::ReadRequest) -> h2::RecvStream {
        use prost::Message;
        let mut body = BytesMut::new();
        body.put_u8(0);
        body.put_u32(req.encoded_len() as u32);
        req.encode(&mut body).unwrap();
        let request = http::Request::post("/kvstore.v1.SegmentData/Read")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        self.send = self.send.clone().ready().await.unwrap();
        let (answer, mut stream) = self.send.send_request(request, false).unwrap();
        stream.send_data(body.freeze(), true).unwrap();
        let answer = answer.await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers().get("grpc-status"),
            None,
            "the read was refused: {answer:?}"
        );
        answer.into_body()
    }
}

/// Reads a stalled stream to its end: the body's bytes and the trailers' `grpc-message`.
async fn drain(mut body: h2::RecvStream) -> (usize, String) {
    let mut got = 0;
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        got += data.len();
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    let message = trailers
        .get("grpc-message")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    (got, message)
}

/// Finding 2 of the second review: 128 gRPC reads of one 16 MiB value by a reader that stops
/// after its first piece hold less than 64 MiB of the member's memory (instead of a copy of the value
/// each), give their range up at the read lease, and end with `LEASE_EXPIRED` when finally read;
/// the member serves an honest tenant meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_grpc_readers_pin_neither_memory_nor_the_range_past_the_lease() {
    const STREAMS: usize = 128;
    const VALUE: usize = 16 << 20;
    let l = leader(&["--tenant", "a=64Mi:64:bfloat16", "--lease-ttl", "3s"]);
    let addr = l.field("grpc");
    let m = member_with(&addr, "m1", "96Mi", &[]);
    let c = Client::connect(&addr, scope("a")).await.unwrap().without_local();
    common::wait_members(&c, 1).await;
    let value = Bytes::from(common::random_bytes(7, VALUE));
    c.put("big", value.clone()).await.unwrap();
    c.put("small", Bytes::from_static(b"honest")).await.unwrap();
    let pid = m.child.id();
    let (peak_before, _) = memory(pid);

    let (loc, granted) = c.locate("big").await.unwrap().unwrap();
    let req = kvcache_store::proto::ReadRequest {
        mount_id: loc.mount_id,
        epoch: loc.epoch,
        offset: loc.offset,
        len: loc.len,
        lease_deadline_unix_ms: granted.lease_deadline_unix_ms,
        grant_mac: loc.grant_mac.clone(),
        allocation: loc.allocation,
    };
    let per_connection = kvcache_store::member::grpc::MAX_STREAMS as usize;
    let mut conns = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..STREAMS / per_connection {
        let mut conn = Stalling::connect(&loc.grpc_addr).await;
        for _ in 0..per_connection {
            streams.push(conn.read(&req).await);
        }
        conns.push(conn);
    }
    // the member keeps serving while they stall
    assert_eq!(c.get("small").await.unwrap().unwrap(), Bytes::from_static(b"honest"));

    // past the lease the member gave the range up: the value's range can be written again
    common::eventually("the read lease ran out", || async {
        kvcache_store::time::now_unix_ms() > granted.lease_deadline_unix_ms + 500
    })
    .await;
    let (peak_after, _) = memory(pid);
    let rise = peak_after.saturating_sub(peak_before);
    eprintln!(
        "{STREAMS} stalled reads of a {} MiB value: member peak RSS rose {:.1} MiB",
        VALUE >> 20,
        rise as f64 / MIB as f64
    );
    assert!(
        rise < 64 * MIB,
        "{STREAMS} stalled reads raised the member's peak memory by {} MiB",
        rise / MIB
    );
    assert!(c.remove("big").await.unwrap(), "no read claim holds the value any more");
    c.put("again", value.clone()).await.unwrap();
    assert_eq!(c.get("again").await.unwrap().unwrap(), value);

    // read now, every stalled stream ends with LEASE_EXPIRED, short of the value
    for body in streams {
        let (got, message) = drain(body).await;
        assert!(got < VALUE, "a stream delivered the whole value after its lease");
        assert!(message.starts_with("LEASE_EXPIRED"), "{message:?}");
    }
}

/// A reservation of `size` bytes for `key`, asked over gRPC (the write grant a writer gets).
async fn reserve(addr: &str, key: &str, size: u64) -> kvcache_store::proto::PutStartResponse {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ours =
        kvcache_store::protocol::SendCaller::new(kvcache_store::protocol::ClientVersion::ours("hostile-test"), "");
    let mut store = kvcache_store::proto::store_client::StoreClient::with_interceptor(channel, ours);
    store
        .put_start(kvcache_store::proto::PutStartRequest {
            scope: Some(scope("a")),
            key: key.into(),
            size,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Finding 8 of the second review: a gRPC `Write` whose grant names 1 KiB may send no more than
/// that (64 such writes of 8 MiB each cost the member nothing like 512 MiB), and one that stops
/// sending is cut at its deadline plus the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_write_may_send_only_what_its_grant_names_and_only_until_its_deadline() {
    use kvcache_store::member::grpc::write_request;
    use kvcache_store::proto::WriteRequest;
    use kvcache_store::proto::segment_data_client::SegmentDataClient;
    let l = leader(&["--tenant", "a=64Mi:64:bfloat16", "--put-ttl", "3s"]);
    let addr = l.field("grpc");
    let m = member_with(&addr, "m1", "64Mi", &[]);
    let c = Client::connect(&addr, scope("a")).await.unwrap().without_local();
    common::wait_members(&c, 1).await;
    c.put("honest", Bytes::from_static(b"v")).await.unwrap();
    let pid = m.child.id();
    let (peak_before, _) = memory(pid);

    let r = reserve(&addr, "small", 1024).await;
    let loc = r.location.clone().unwrap();
    let granted = write_request(&loc, r.write_deadline_unix_ms, Bytes::from(vec![1u8; 1024]));
    let oversized = Bytes::from(vec![7u8; 8 << 20]);
    let mut writes = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let member = SegmentDataClient::connect(format!("http://{}", loc.grpc_addr))
            .await
            .unwrap()
            .max_encoding_message_size(usize::MAX);
        for _ in 0..16 {
            let mut req = tonic::Request::new(WriteRequest {
                data: oversized.clone(),
            });
            *req.metadata_mut() = granted.metadata().clone();
            let mut member = member.clone();
            writes.spawn(async move { member.write(req).await });
        }
    }
    while let Some(w) = writes.join_next().await {
        let refused = w.unwrap().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    }
    let (peak_after, _) = memory(pid);
    let rise = peak_after.saturating_sub(peak_before);
    eprintln!(
        "64 writes of 8 MiB under a 1 KiB grant: member peak RSS rose {:.1} MiB",
        rise as f64 / MIB as f64
    );
    assert!(rise < 32 * MIB, "the member's peak memory rose by {} MiB", rise / MIB);

    // a write that sends half its value and stops is cut at its deadline plus the grace
    let r = reserve(&addr, "stalled", 1024).await;
    let loc = r.location.clone().unwrap();
    let head = write_request(&loc, r.write_deadline_unix_ms, Bytes::from(vec![1u8; 1024]));
    let tcp = tokio::net::TcpStream::connect(&loc.grpc_addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut request = http::Request::post("/kvstore.v1.SegmentData/Write")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    for (k, v) in head.metadata().clone().into_headers().iter() {
        request.headers_mut().insert(k, v.clone());
    }
    let (answer, mut body) = send.ready().await.unwrap().send_request(request, false).unwrap();
    let mut half = BytesMut::new();
    half.put_u8(0);
    half.put_u32(1024 + 3);
    half.put_slice(&[0x0a, 0x80, 0x08]);
    half.put_slice(&[1u8; 512]);
    body.send_data(half.freeze(), false).unwrap();
    let started = std::time::Instant::now();
    let answer = answer.await.unwrap();
    let status = answer
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    let waited = started.elapsed();
    eprintln!("a stalled write was answered {status:?} after {waited:?}");
    assert_eq!(status.as_deref(), Some("4"), "DEADLINE_EXCEEDED: {answer:?}");
    assert!(
        waited < std::time::Duration::from_secs(30),
        "cut at its deadline plus the grace, not left open"
    );
    assert_eq!(c.get("honest").await.unwrap().unwrap(), Bytes::from_static(b"v"));
}

/// Sends one fast-port frame and reads the answer: (status, body).
async fn fast_frame(s: &mut tokio::net::TcpStream, method: u8, body: &[u8]) -> Option<(u8, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut frame = BytesMut::new();
    frame.put_u32_le(body.len() as u32);
    frame.put_u8(method);
    frame.put_slice(body);
    s.write_all(&frame).await.ok()?;
    let mut head = [0u8; 5];
    s.read_exact(&mut head).await.ok()?;
    let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    let mut answer = vec![0u8; len];
    s.read_exact(&mut answer).await.ok()?;
    Some((head[4], answer))
}

/// Finding 4 of the second review, on the fast port: a connection whose hello shows no tenant's
/// credential is refused at the hello (1 KiB at most), so it never gets to send a 5 MiB frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_port_hello_without_a_credential_is_refused() {
    use prost::Message;
    let g = guarded();
    let fast: u16 = {
        let c = Client::connect(&g.addr, team_a()).await.unwrap();
        assert!(c.uses_fast_port());
        let h = c
            .control()
            .health(kvcache_store::proto::HealthRequest {})
            .await
            .unwrap()
            .into_inner();
        h.fast_port as u16
    };
    let host = g.addr.rsplit_once(':').unwrap().0;
    let hello = |credential: &str| {
        kvcache_store::protocol::ClientVersion::ours("hostile-test")
            .hello(credential)
            .encode_to_vec()
    };
    for shown in ["", "a-guess"] {
        let mut s = tokio::net::TcpStream::connect((host, fast)).await.unwrap();
        let (status, body) = fast_frame(&mut s, 12, &hello(shown)).await.unwrap();
        let message = String::from_utf8_lossy(&body);
        assert_eq!(status, 1, "refused: {message}");
        assert!(message.starts_with("UNAUTHENTICATED"), "{message}");
        // and the connection is closed: a 5 MiB frame after it is never answered
        let big = vec![0u8; 5 << 20];
        assert!(fast_frame(&mut s, 7, &big).await.is_none());
    }
    let mut s = tokio::net::TcpStream::connect((host, fast)).await.unwrap();
    let (status, _) = fast_frame(&mut s, 12, &hello(CREDENTIAL)).await.unwrap();
    assert_eq!(status, 0, "a hello that shows a tenant's credential is answered");
}

/// Finding 4 of the second review: one source address cannot hold every place of a port; past
/// its share a new connection is closed at once, while another address is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_take_every_place_of_a_port() {
    use tokio::io::AsyncReadExt;
    let l = leader(&["--tenant", "a=16Mi:64:bfloat16"]);
    let addr = l.field("grpc");
    let m = member_with(&addr, "m1", "16Mi", &[]);
    let data = m.field("data");
    let share = kvcache_store::net::MAX_PER_SOURCE;
    let mut held = Vec::new();
    for _ in 0..share + 16 {
        held.push(tokio::net::TcpStream::connect(&data).await.unwrap());
    }
    // the connections past the share are closed by the member as soon as they are accepted
    let closed = |held: &Vec<tokio::net::TcpStream>| {
        held.iter()
            .filter(|s| {
                let mut byte = [0u8; 1];
                !matches!(s.try_read(&mut byte), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    common::eventually("the connections past the share closed", || {
        let n = closed(&held);
        async move { n >= 16 }
    })
    .await;
    assert_eq!(closed(&held), 16, "{share} kept from one source, the rest closed");
    // another source address (loopback answers all of 127/8) is served
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = other.connect(data.parse().unwrap()).await.unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(500), other.read(&mut byte))
            .await
            .is_err(),
        "a connection from another source is kept open"
    );
}

/// Findings 6 and 9 of the second review: whoever holds the member token (a compromised member)
/// mounts with a report of values it made up under tenant a's keys: the leader adopts none of
/// them (no leader sealed them), and the grant key it is handed signs nothing the real member
/// accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_member_can_plant_no_value_and_its_grant_key_opens_no_other_segment() {
    use kvcache_store::grant::{Access, GrantKey, Range, Tag};
    use kvcache_store::proto::membership_client::MembershipClient;
    use kvcache_store::proto::{Holding, MountRequest};
    let g = guarded();
    let honest = Client::connect(&g.addr, team_a()).await.unwrap().without_local();
    wait_mounted(&g.addr).await;
    honest.put("real", Bytes::from(vec![5u8; 4096])).await.unwrap();

    let planted: Vec<Holding> = (0..4u64)
        .map(|i| Holding {
            tag: Tag {
                tenant: "a".into(),
                uid: String::new(),
                block_size: 64,
                dtype: "bfloat16".into(),
                key: format!("planted-{i}"),
            }
            .encode()
            .into(),
            offset: i * 4096,
            size: 4096,
            epoch: 0,
            last_used_unix_ms: 0,
            // no seal, or one made up
            seal: if i % 2 == 0 {
                Bytes::new()
            } else {
                Bytes::from(vec![i as u8; 32])
            },
        })
        .collect();
    let mut membership = MembershipClient::connect(format!("http://{}", g.addr)).await.unwrap();
    let mut req = tonic::Request::new(MountRequest {
        name: "impostor".into(),
        data_addr: "127.0.0.1:9".into(),
        grpc_addr: "127.0.0.1:9".into(),
        capacity: 1 << 20,
        instance_id: 77,
        holdings: planted,
        handover: kvcache_store::protocol::HANDOVER,
        ..Default::default()
    });
    kvcache_store::auth::attach(&mut req, MEMBER_TOKEN).unwrap();
    let answer = membership.mount(req).await.unwrap().into_inner();
    assert_eq!(answer.adopted, [0, 0, 0, 0], "nothing made up is adopted");
    for i in 0..4 {
        assert_eq!(honest.get(&format!("planted-{i}")).await.unwrap(), None);
    }

    // the impostor signs a read of the real member's value with the key it was handed
    let (loc, granted) = honest.locate("real").await.unwrap().unwrap();
    let key = GrantKey::from_bytes(&answer.grant_key).unwrap();
    let forged = key.sign(
        &Range {
            access: Access::Read,
            mount_id: loc.mount_id,
            epoch: loc.epoch,
            allocation: loc.allocation,
            offset: loc.offset,
            len: loc.len,
            deadline_unix_ms: granted.lease_deadline_unix_ms,
        },
        &[],
    );
    let refused =
        kvcache_store::proto::segment_data_client::SegmentDataClient::connect(format!("http://{}", loc.grpc_addr))
            .await
            .unwrap()
            .read(kvcache_store::proto::ReadRequest {
                mount_id: loc.mount_id,
                epoch: loc.epoch,
                offset: loc.offset,
                len: loc.len,
                lease_deadline_unix_ms: granted.lease_deadline_unix_ms,
                grant_mac: forged.into(),
                allocation: loc.allocation,
            })
            .await
            .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert_eq!(honest.get("real").await.unwrap().unwrap(), Bytes::from(vec![5u8; 4096]));
}
