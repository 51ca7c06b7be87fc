//! A leader serves only clients that speak a protocol it serves (`src/protocol.rs`), with a real
//! `kv-store leader`: a client of another protocol version is refused with
//! `CLIENT_VERSION_UNSUPPORTED` on gRPC and on the fast port, and so is one that does not say;
//! this build's client is served on both.

#![allow(clippy::unwrap_used)]

mod common;

use bytes::{BufMut, BytesMut};
use common::{client, leader, scope};
use kvcache_store::client::Client;
use kvcache_store::error::{ErrorCode, StoreError};
use kvcache_store::proto::ExistsRequest;
use kvcache_store::proto::store_client::StoreClient;
use kvcache_store::protocol::{self, ClientVersion, SendVersion};
use prost::Message;
use tokio::io::AsyncWriteExt;

const TENANT: &str = "v=16Mi:64:bfloat16";

fn another(protocol: Option<u32>) -> ClientVersion {
    ClientVersion {
        protocol,
        client: "kvcache-python 9.0.0".into(),
    }
}

fn refused(e: &StoreError, says: &str) {
    assert_eq!(e.code, ErrorCode::ClientVersionUnsupported, "{e}");
    assert!(e.message.contains("kvcache-python 9.0.0"), "the client is named: {e}");
    assert!(
        e.message.contains(&format!("kv-store {}", protocol::RELEASE)),
        "the leader is named: {e}"
    );
    assert!(e.message.contains(says), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_another_protocol_is_refused_on_both_faces() {
    let l = leader(&["--tenant", TENANT]);
    let addr = l.field("grpc");
    // this build's client is served, on the fast port and over gRPC
    let ours = client(&addr, "v").await;
    assert!(ours.uses_fast_port());
    assert!(!ours.exists("k").await.unwrap());
    assert!(!ours.clone().grpc_only().exists("k").await.unwrap());

    // a newer client: every call refused, whichever face it uses
    let newer = Client::connect_as(&addr, scope("v"), another(Some(protocol::PROTOCOL + 1)))
        .await
        .unwrap();
    refused(&newer.exists("k").await.unwrap_err(), "upgrade the store");
    refused(
        &newer.clone().grpc_only().exists("k").await.unwrap_err(),
        "upgrade the store",
    );
    refused(
        &newer.batch_exists(&["a".into(), "b".into()]).await.unwrap_err(),
        "upgrade the store",
    );
    let older = Client::connect_as(&addr, scope("v"), another(Some(0))).await.unwrap();
    refused(&older.get("k").await.unwrap_err(), "no longer serves");

    // a gRPC client that does not say which protocol it speaks
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut silent = StoreClient::with_interceptor(
        channel.clone(),
        SendVersion(ClientVersion {
            protocol: None,
            client: "kvcache-python 9.0.0".into(),
        }),
    );
    let status = silent
        .exists(ExistsRequest {
            scope: Some(scope("v")),
            key: "k".into(),
        })
        .await
        .unwrap_err();
    refused(
        &StoreError::from_status(&status),
        &format!("{}: {}", protocol::PROTOCOL_HEADER, protocol::PROTOCOL),
    );
    let mut said = StoreClient::with_interceptor(channel, SendVersion(ClientVersion::ours("versions-test")));
    assert!(
        !said
            .exists(ExistsRequest {
                scope: Some(scope("v")),
                key: "k".into()
            })
            .await
            .unwrap()
            .into_inner()
            .exists
    );

    // a fast-port connection that opens with a call instead of its hello: one refusal, closed
    let health = ours
        .control()
        .health(kvcache_store::proto::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    let host = addr.rsplit_once(':').unwrap().0;
    let mut s = tokio::net::TcpStream::connect(format!("{host}:{}", health.fast_port))
        .await
        .unwrap();
    let call = ExistsRequest {
        scope: Some(scope("v")),
        key: "k".into(),
    };
    let mut frame = BytesMut::new();
    frame.put_u32_le(call.encoded_len() as u32);
    frame.put_u8(kvcache_store::leader::fastport::Method::Exists as u8);
    call.encode(&mut frame).unwrap();
    s.write_all(&frame).await.unwrap();
    let mut buf = BytesMut::new();
    let (status, body) = kvcache_store::frame::read(&mut s, &mut buf, 1 << 20)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 1, "refused");
    let e = kvcache_store::wire::refusal(&body);
    assert_eq!(e.code, ErrorCode::ClientVersionUnsupported, "{e}");
    assert!(e.message.contains("did not say"), "{e}");
    assert!(
        kvcache_store::frame::read(&mut s, &mut buf, 1 << 20)
            .await
            .unwrap()
            .is_none(),
        "the connection is closed after the refusal"
    );
}
