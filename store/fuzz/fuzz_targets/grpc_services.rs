//! The gRPC services' request decoding, as a connection hands requests to them: the input picks a
//! service and method of the leader (behind its front door: `leader/front.rs`) or of a mounted
//! member (behind `GrantFirst`), which headers the call shows (the protocol, a tenant credential,
//! the member or controllers' token, a write grant the member signs or bytes of the input), and the
//! body: the rest of the input, raw or framed as one gRPC message. Every call must be answered
//! with an HTTP response whose body ends (or, for a stream, yields) without a panic, and nothing
//! past a method's limit is read.

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use kvcache_store::flags::parse_tenant;
use kvcache_store::grant::{Access, GrantKey, Range};
use kvcache_store::leader::{Leader, LeaderConfig};
use kvcache_store::member::mmap::SharedMap;
use kvcache_store::member::segment::Segment;
use libfuzzer_sys::fuzz_target;
use tower::{Layer, Service};

const CREDENTIAL: &str = "credential-of-tenant-t";
const MEMBER_TOKEN: &str = "member-token-0123";
const CONTROL_TOKEN: &str = "control-token-4567";
const MOUNT: u64 = 11;
const EPOCH: u64 = 3;

const LEADER_PATHS: &[&str] = &[
    "/kvstore.v1.Store/PutStart",
    "/kvstore.v1.Store/PutCommit",
    "/kvstore.v1.Store/PutRevoke",
    "/kvstore.v1.Store/Get",
    "/kvstore.v1.Store/Exists",
    "/kvstore.v1.Store/Remove",
    "/kvstore.v1.Store/BatchExists",
    "/kvstore.v1.Store/BatchGet",
    "/kvstore.v1.Store/BatchPutStart",
    "/kvstore.v1.Store/BatchPutCommit",
    "/kvstore.v1.Store/BatchRemove",
    "/kvstore.v1.Store/WatchBlocks",
    "/kvstore.v1.Membership/Mount",
    "/kvstore.v1.Membership/Heartbeat",
    "/kvstore.v1.Control/SetTenants",
    "/kvstore.v1.Control/GetTenants",
    "/kvstore.v1.Control/GetMembers",
    "/kvstore.v1.Control/RemoveMember",
    "/kvstore.v1.Control/Health",
    "/kvstore.v1.Nothing/Here",
];
const MEMBER_PATHS: &[&str] = &[
    "/kvstore.v1.SegmentData/Write",
    "/kvstore.v1.SegmentData/Read",
    "/kvstore.v1.SegmentData/Health",
];

struct World {
    rt: tokio::runtime::Runtime,
    leader: Leader,
    segment: std::sync::Arc<Segment>,
    key: GrantKey,
    _dir: tempfile::TempDir,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a directory");
        let file = |name: &str, token: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, token).expect("a token file");
            p
        };
        let hash: String = kvcache_store::leader::ledger::credential_hash(CREDENTIAL)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let cfg = LeaderConfig {
            tenants: vec![parse_tenant(&format!("t=64Mi:16:bfloat16,sha256={hash}")).expect("a tenant")],
            member_ttl: Duration::from_secs(1 << 30),
            max_value_size: 8 << 20,
            member_token_file: Some(file("member", MEMBER_TOKEN)),
            control_token_file: Some(file("control", CONTROL_TOKEN)),
            ..LeaderConfig::default()
        };
        let cfg = LeaderConfig {
            listen: "127.0.0.1:0".parse().expect("an address"),
            fast_listen: Some(kvcache_store::flags::FastListen::Off),
            ..cfg
        };
        let leader = Leader::new(cfg.clone()).expect("a leader");
        // served as the binary serves it, so that it is ready and its term's gate is open; the
        // calls below go to its services in this process, not through the port
        let serving = leader.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listeners = kvcache_store::leader::LeaderListeners::bind(&cfg).await.expect("bind");
                let _ = tx.send(());
                let _ = serving
                    .serve(
                        listeners,
                        Default::default(),
                        tokio_util::sync::CancellationToken::new(),
                    )
                    .await;
            });
        });
        rx.recv().expect("the leader binds");
        while !leader.is_serving() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let segment = std::sync::Arc::new(Segment::new(
            SharedMap::create(dir.path(), 1 << 20, false).expect("a segment"),
        ));
        segment.set_mount(MOUNT);
        assert!(segment.see_epoch(EPOCH));
        let key = GrantKey::generate();
        segment.set_grant_key(key.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        World {
            rt,
            leader,
            segment,
            key,
            _dir: dir,
        }
    })
}

/// A little reader over the input.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        *b
    }

    fn u64(&mut self) -> u64 {
        let mut v = 0u64;
        for _ in 0..4 {
            v = (v << 8) | u64::from(self.byte());
        }
        v
    }
}

fn call(w: &World, req: http::Request<tonic::body::Body>, member: bool) {
    w.rt.block_on(async {
        let answer = if member {
            let svc = kvcache_store::member::grpc::DataService {
                segment: w.segment.clone(),
                readiness: kvcache_store::readiness::ReadinessHandle::new(),
            }
            .server(9 << 20);
            let mut svc = kvcache_store::member::grpc::GrantFirstLayer(w.segment.clone()).layer(svc);
            svc.call(req).await
        } else {
            let mut svc = kvcache_store::leader::grpc::fuzzing(w.leader.clone());
            svc.call(req).await
        };
        let Ok(answer) = answer;
        assert!(answer.status().as_u16() < 600);
        // a stream (WatchBlocks, Read) yields a few frames; a unary answer ends
        let mut body = answer.into_body();
        for _ in 0..8 {
            match tokio::time::timeout(Duration::from_millis(20), body.frame()).await {
                Ok(Some(Ok(_))) => continue,
                _ => break,
            }
        }
    });
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let mut input = Input(data);
    let target = input.byte();
    let shows = input.byte();
    let member = target & 0x80 != 0;
    let path = if member {
        MEMBER_PATHS[usize::from(target) % MEMBER_PATHS.len()]
    } else {
        LEADER_PATHS[usize::from(target) % LEADER_PATHS.len()]
    };
    let mut req = http::Request::post(path).header("content-type", "application/grpc");
    if shows & 1 != 0 {
        req = req.header(
            kvcache_store::protocol::PROTOCOL_HEADER,
            kvcache_store::protocol::PROTOCOL.to_string(),
        );
    }
    match (shows >> 1) & 3 {
        1 => req = req.header(kvcache_store::protocol::CREDENTIAL_HEADER, CREDENTIAL),
        2 => req = req.header(kvcache_store::protocol::CREDENTIAL_HEADER, "a-guess"),
        _ => {}
    }
    match (shows >> 3) & 3 {
        1 => req = req.header("authorization", format!("Bearer {MEMBER_TOKEN}")),
        2 => req = req.header("authorization", format!("Bearer {CONTROL_TOKEN}")),
        3 => req = req.header("authorization", "Bearer x"),
        _ => {}
    }
    if member && shows & 0x20 != 0 {
        // a write grant the member signs, for a range and tag the input names
        let (offset, len, allocation) = (input.u64() % (2 << 20), input.u64() % (2 << 20), input.u64());
        let tag_len = usize::from(input.byte());
        let tag = &input.0[..tag_len.min(input.0.len())];
        input.0 = &input.0[tag.len()..];
        let range = Range {
            access: Access::Write,
            mount_id: MOUNT,
            epoch: EPOCH,
            allocation,
            offset,
            len,
            deadline_unix_ms: 0,
        };
        let head = kvcache_store::wire::Request {
            op: kvcache_store::wire::Op::Write,
            mount_id: MOUNT,
            offset,
            len,
            deadline_unix_ms: 0,
            epoch: EPOCH,
            allocation,
            mac: kvcache_store::member::segment::Grant::mac_from(&w.key.sign(&range, tag)),
            tag_len: tag.len() as u16,
        };
        let mut grant = head.encode().to_vec();
        grant.extend_from_slice(tag);
        let value = tonic::metadata::BinaryMetadataValue::from_bytes(&grant);
        let mut meta = tonic::metadata::MetadataMap::new();
        meta.insert_bin(kvcache_store::member::grpc::GRANT_METADATA, value);
        for (k, v) in meta.into_headers().iter() {
            req = req.header(k, v);
        }
    }
    let rest = input.0;
    let body = if shows & 0x40 != 0 {
        // one well-formed gRPC message around the rest, so that decoding is reached
        let mut framed = BytesMut::with_capacity(5 + rest.len());
        framed.put_u8(0);
        framed.put_u32(rest.len() as u32);
        framed.put_slice(rest);
        framed.freeze()
    } else {
        Bytes::copy_from_slice(rest)
    };
    let req = req
        .body(tonic::body::Body::new(http_body_util::Full::new(body)))
        .expect("a request");
    call(w, req, member);
});
