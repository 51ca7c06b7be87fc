//! TLS on the store's ports, with real `kv-store` processes: a relay between a member and its
//! leader (and one between a client and the leader) sees only TLS records, never a token, a
//! credential or a grant key; values of every size cross the encrypted data port and fast port
//! byte for byte; a client that does not trust the backend's CA, or expects another backend's
//! name, is refused before it sends anything. The same relay on a plaintext store finds a
//! credential and no TLS records, so the check can fail.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{Proc, eventually, leader, member_with, random_bytes, scope};
use kvcache_store::client::Client;
use kvcache_store::error::ErrorCode;
use kvcache_store::proto::{GetMembersRequest, GetTenantsRequest};
use kvcache_store::tls::ClientTls;
use parking_lot::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONTROL_TOKEN: &str = "controllers-0123456789abcdef";
const MEMBER_TOKEN: &str = "members-fedcba9876543210";
const CREDENTIAL: &str = "credential-of-team-a-42";
const NAME: &str = "team-store.kvstore.internal";

/// What crossed a relay, each direction.
#[derive(Default)]
struct Seen {
    up: Vec<u8>,
    down: Vec<u8>,
}

/// A TCP relay on loopback to `upstream`, recording every byte.
async fn relay(upstream: String) -> (String, Arc<Mutex<Seen>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = l.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let (ir, iw) = inbound.into_split();
            let (or, ow) = outbound.into_split();
            tokio::spawn(pump(ir, ow, record.clone(), |s| &mut s.up));
            tokio::spawn(pump(or, iw, record.clone(), |s| &mut s.down));
        }
    });
    (addr, seen)
}

/// Copies `from` to `to` until either closes, recording each byte where `side` says.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    seen: Arc<Mutex<Seen>>,
    side: fn(&mut Seen) -> &mut Vec<u8>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        side(&mut seen.lock()).extend_from_slice(&buf[..n]);
    }
    let _ = to.shutdown().await;
}

/// Whether `bytes` is a run of whole TLS records (or their start, cut off at the end) whose
/// content, past the handshake's hellos, is all encrypted (`application_data`, type 23; 20 is
/// TLS 1.3's compatibility change_cipher_spec, one byte).
#[allow(clippy::big_endian_bytes, reason = "TLS numbers are big-endian (RFC 8446)")]
fn only_tls_records(bytes: &[u8]) -> Result<usize, String> {
    let mut at = 0;
    let mut records = 0;
    while at + 5 <= bytes.len() {
        let (kind, version, len) = (
            bytes[at],
            [bytes[at + 1], bytes[at + 2]],
            u16::from_be_bytes([bytes[at + 3], bytes[at + 4]]),
        );
        if version != [3, 3] && version != [3, 1] {
            return Err(format!("record {records} at {at}: version {version:?} is not TLS"));
        }
        let clear_allowed = records == 0 && kind == 22;
        if !(clear_allowed || kind == 23 || kind == 20) {
            return Err(format!("record {records} at {at}: content type {kind} in clear"));
        }
        at += 5 + len as usize;
        records += 1;
    }
    Ok(records)
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    cert: String,
    key: String,
    ca: String,
}

/// A CA and a certificate for [`NAME`], written to files.
fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "store test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![NAME.to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_pem = ca_cert.pem();
    Pki {
        cert: file(dir.path(), "tls.crt", &leaf.pem()),
        key: file(dir.path(), "tls.key", &key.serialize_pem()),
        ca: file(dir.path(), "ca.crt", &ca_pem),
        ca_pem,
        dir,
    }
}

fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Store {
    _leader: Proc,
    _member: Proc,
    leader: String,
    /// member → leader
    membership: Arc<Mutex<Seen>>,
}

/// A leader and a member with both tokens and a tenant bound to [`CREDENTIAL`]; the member mounts
/// through a recording relay. With `pki`, every port is TLS.
async fn start(pki: Option<&Pki>) -> Store {
    let dir = pki.map_or_else(|| tempfile::tempdir().unwrap().keep(), |p| p.dir.path().to_owned());
    let control = file(&dir, "control.token", CONTROL_TOKEN);
    let members = file(&dir, "member.token", MEMBER_TOKEN);
    let tenant = format!("team-a=64Mi:64:bfloat16,sha256={}", sha256_hex(CREDENTIAL));
    let mut args = vec![
        "--control-token-file".to_owned(),
        control,
        "--member-token-file".to_owned(),
        members.clone(),
        "--tenant".to_owned(),
        tenant,
    ];
    let mut member_args = vec!["--member-token-file".to_owned(), members];
    if let Some(p) = pki {
        args.extend(["--tls-cert".into(), p.cert.clone(), "--tls-key".into(), p.key.clone()]);
        member_args.extend([
            "--tls-cert".into(),
            p.cert.clone(),
            "--tls-key".into(),
            p.key.clone(),
            "--tls-ca".into(),
            p.ca.clone(),
            "--tls-server-name".into(),
            NAME.into(),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let l = leader(&args);
    let (via, membership) = relay(l.field("grpc")).await;
    let member_args: Vec<&str> = member_args.iter().map(String::as_str).collect();
    let m = member_with(&via, "m1", "64Mi", &member_args);
    Store {
        leader: l.field("grpc"),
        _leader: l,
        _member: m,
        membership,
    }
}

fn tls(pki: &Pki, name: &str) -> ClientTls {
    ClientTls::from_pem(pki.ca_pem.as_bytes(), Some(name.into())).unwrap()
}

fn credentialed() -> kvcache_store::proto::Scope {
    kvcache_store::proto::Scope {
        credential: CREDENTIAL.into(),
        ..scope("team-a")
    }
}

async fn control_call(c: &Client) -> usize {
    let mut r = tonic::Request::new(GetMembersRequest {});
    kvcache_store::auth::attach(&mut r, CONTROL_TOKEN).unwrap();
    c.control()
        .get_members(r)
        .await
        .map(|m| m.into_inner().members.len())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_relay_between_member_client_and_leader_sees_only_tls_records() {
    let pki = pki();
    let store = start(Some(&pki)).await;
    // a client whose gRPC calls (credential, control token) cross a relay too
    let (via, calls) = relay(store.leader.clone()).await;
    let c = Client::connect_tls(&via, credentialed(), Some(tls(&pki, NAME)))
        .await
        .unwrap()
        .grpc_only();
    eventually("the member mounted over TLS", || async { control_call(&c).await == 1 }).await;
    let value = random_bytes(1, 100_000);
    c.put("k", value.clone().into()).await.unwrap();
    assert_eq!(c.get("k").await.unwrap().unwrap(), value);
    let mut r = tonic::Request::new(GetTenantsRequest {});
    kvcache_store::auth::attach(&mut r, CONTROL_TOKEN).unwrap();
    c.control().get_tenants(r).await.unwrap();

    // heartbeats keep flowing; take what crossed so far
    let member = std::mem::take(&mut *store.membership.lock());
    let client = std::mem::take(&mut *calls.lock());
    for (what, bytes) in [
        ("member → leader", &member.up),
        ("leader → member", &member.down),
        ("client → leader", &client.up),
        ("leader → client", &client.down),
    ] {
        assert!(bytes.len() > 500, "{what}: only {} bytes crossed", bytes.len());
        let records = only_tls_records(bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(records > 3, "{what}: {records} records");
        for secret in [MEMBER_TOKEN, CONTROL_TOKEN, CREDENTIAL] {
            assert!(!contains(bytes, secret), "{what}: {secret} in clear");
        }
    }
}

#[tokio::test]
async fn the_same_relay_on_a_plaintext_store_finds_a_credential_in_clear() {
    let store = start(None).await;
    let (via, calls) = relay(store.leader.clone()).await;
    let c = Client::connect(&via, credentialed()).await.unwrap().grpc_only();
    eventually("the member mounted", || async { control_call(&c).await == 1 }).await;
    c.put("k", bytes::Bytes::from_static(b"v")).await.unwrap();
    let member = std::mem::take(&mut *store.membership.lock());
    let client = std::mem::take(&mut *calls.lock());
    // (tokens travel in HTTP/2 headers, which HPACK may encode; the credential is in the body)
    assert!(contains(&client.up, CREDENTIAL));
    assert!(contains(&member.up, "m1"), "the member's name, in its MountRequest");
    for bytes in [&member.up, &member.down, &client.up, &client.down] {
        assert!(only_tls_records(bytes).is_err());
    }
}

#[tokio::test]
async fn values_of_every_size_cross_the_encrypted_ports_byte_for_byte() {
    let pki = pki();
    let store = start(Some(&pki)).await;
    let c = Client::connect_tls(&store.leader, credentialed(), Some(tls(&pki, NAME)))
        .await
        .unwrap()
        .without_local();
    assert!(c.uses_fast_port(), "the fast port serves over TLS too");
    eventually("the member mounted over TLS", || async { control_call(&c).await == 1 }).await;
    // sizes around TLS records (16 KiB) and the data port's pieces (256 KiB)
    let sizes = [
        1usize,
        4095,
        16 * 1024,
        16 * 1024 + 1,
        65_536,
        256 * 1024 - 1,
        256 * 1024 + 7,
        4 << 20,
    ];
    for (i, len) in sizes.iter().enumerate() {
        let key = format!("v{i}");
        let value = random_bytes(i as u64 + 7, *len);
        c.put(&key, value.clone().into()).await.unwrap();
        let got = c.get(&key).await.unwrap().unwrap();
        assert!(got == value, "{len} bytes came back different");
    }
    // a batch over the same pooled connections, read into the caller's buffers
    let keys: Vec<String> = (0..8).map(|i| format!("b{i}")).collect();
    let values: Vec<Vec<u8>> = (0..8).map(|i| random_bytes(100 + i, 300_000)).collect();
    let pairs: Vec<(&str, &[u8])> = keys
        .iter()
        .map(String::as_str)
        .zip(values.iter().map(Vec::as_slice))
        .collect();
    for r in c.batch_put(&pairs).await.unwrap() {
        r.unwrap();
    }
    let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; 300_000]; 8];
    let mut items: Vec<(&str, &mut [u8])> = keys
        .iter()
        .map(String::as_str)
        .zip(bufs.iter_mut().map(Vec::as_mut_slice))
        .collect();
    for r in c.batch_get_into(&mut items).await.unwrap() {
        assert_eq!(r.unwrap(), Some(300_000));
    }
    assert!(bufs == values);
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_store_is_refused_before_it_sends_anything() {
    let pki = pki();
    let store = start(Some(&pki)).await;
    // no TLS at all: the leader speaks TLS only
    let plain = Client::connect(&store.leader, credentialed()).await;
    let e = plain.expect_err("a plaintext client is refused").to_string();
    assert!(e.contains("TRANSPORT") || e.contains("reach"), "{e}");
    // another backend's name
    let e = Client::connect_tls(&store.leader, credentialed(), Some(tls(&pki, "other.kvstore.internal")))
        .await
        .expect_err("a certificate for another name is refused");
    assert_eq!(e.code, ErrorCode::Transport, "{e}");
    // another CA
    let stranger = self::pki();
    let e = Client::connect_tls(&store.leader, credentialed(), Some(tls(&stranger, NAME)))
        .await
        .expect_err("a certificate from another CA is refused");
    assert_eq!(e.code, ErrorCode::Transport, "{e}");
}
