//! The handshake and framing against a peer written here byte by byte (as RFC 23 spells it), and
//! every bound on what a peer sends. vLLM's own publisher (pyzmq over libzmq) is the peer in
//! `router/tests/engine_memory.rs`.

#![allow(clippy::big_endian_bytes, reason = "ZMTP sizes are big-endian (RFC 23)")]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const T: Duration = Duration::from_secs(5);

fn ready_of(kind: &[u8]) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(8);
    body.extend_from_slice(b"Identity");
    body.extend_from_slice(&0u32.to_be_bytes());
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(kind.len() as u32).to_be_bytes());
    body.extend_from_slice(kind);
    body
}

fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![];
    if body.len() < 256 {
        out.extend([flags, body.len() as u8]);
    } else {
        out.push(flags | LONG);
        out.extend((body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// A peer that greets as `kind` and, once our READY is read, writes `then`; returns what it
/// read after the handshake.
async fn peer(kind: &'static [u8], then: Vec<u8>) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut theirs = [0u8; 64];
        s.read_exact(&mut theirs).await.unwrap();
        assert_eq!(theirs, greeting());
        s.write_all(&greeting()).await.unwrap();
        // our READY: flags, size, body
        let mut head = [0u8; 2];
        s.read_exact(&mut head).await.unwrap();
        assert_eq!(head[0], COMMAND);
        let mut body = vec![0u8; head[1] as usize];
        s.read_exact(&mut body).await.unwrap();
        s.write_all(&frame(COMMAND, &ready_of(kind))).await.unwrap();
        s.write_all(&then).await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_millis(300), s.read_to_end(&mut rest)).await;
        let mut out = body;
        out.extend(rest);
        out
    });
    (endpoint, task)
}

#[tokio::test]
async fn subscribes_and_reads_multipart_messages() {
    let big = vec![7u8; 300];
    let mut then = frame(MORE, b"topic");
    then.extend(frame(MORE, &9u64.to_be_bytes()));
    then.extend(frame(0, &big));
    then.extend(frame(COMMAND, b"\x04PING\x00\x00"));
    then.extend(frame(0, b"one"));
    let (endpoint, task) = peer(b"PUB", then).await;
    let mut c = Connection::connect(&endpoint, SocketType::Sub, Limits::default(), T)
        .await
        .unwrap();
    c.subscribe(b"").await.unwrap();
    assert_eq!(
        c.recv().await.unwrap(),
        [b"topic".to_vec(), 9u64.to_be_bytes().to_vec(), big]
    );
    // the heartbeat between messages is passed over
    assert_eq!(c.recv().await.unwrap(), [b"one".to_vec()]);
    drop(c);
    let sent = task.await.unwrap();
    // our READY said SUB, then the subscription message 0x01 ‖ "" followed
    assert!(
        sent.ends_with(b"Socket-Type\x00\x00\x00\x03SUB\x00\x01\x01"),
        "{sent:?}"
    );
}

#[tokio::test]
async fn a_dealer_sends_long_frames() {
    let (endpoint, task) = peer(b"ROUTER", vec![]).await;
    let mut c = Connection::connect(&endpoint, SocketType::Dealer, Limits::default(), T)
        .await
        .unwrap();
    let long = vec![1u8; 256];
    c.send(&[b"", &long]).await.unwrap();
    drop(c);
    let sent = task.await.unwrap();
    let mut want = frame(MORE, b"");
    want.extend(frame(0, &long));
    assert!(sent.ends_with(&want));
    assert_eq!(want[2], LONG);
}

#[tokio::test]
async fn wrong_peers_are_refused() {
    let (endpoint, _task) = peer(b"REP", vec![]).await;
    let e = Connection::connect(&endpoint, SocketType::Sub, Limits::default(), T)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("a SUB cannot talk to a REP"), "{e}");

    // not ZMTP at all: an HTTP server's first bytes
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(&[b'H'; 64]).await.unwrap();
        let _ = s.read(&mut [0u8; 64]).await;
    });
    let e = Connection::connect(&endpoint, SocketType::Sub, Limits::default(), T)
        .await
        .unwrap_err();
    assert!(matches!(e, ZmtpError::Handshake(_)), "{e}");

    for bad in [
        "http://h:1",
        "tcp://h",
        "tcp://:1",
        "tcp://h:99999",
        "ipc://relative",
        "ipc://",
    ] {
        assert!(matches!(address(bad), Err(ZmtpError::Endpoint(_))), "{bad}");
    }
    assert_eq!(
        address("ipc:///run/e.sock").unwrap(),
        Address::Ipc("/run/e.sock".into())
    );
    assert_eq!(address("tcp://[::1]:5557").unwrap(), Address::Tcp("[::1]:5557".into()));
}

#[tokio::test]
async fn a_silent_peer_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
    let _keep = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    });
    let e = Connection::connect(
        &endpoint,
        SocketType::Sub,
        Limits::default(),
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ZmtpError::Timeout(_)), "{e}");
}

#[tokio::test]
async fn sizes_are_checked_before_allocating() {
    // a frame declaring an exabyte
    let mut then = vec![LONG];
    then.extend(u64::MAX.to_be_bytes());
    let (endpoint, _task) = peer(b"PUB", then).await;
    let mut c = Connection::connect(&endpoint, SocketType::Sub, Limits::default(), T)
        .await
        .unwrap();
    let e = c.recv().await.unwrap_err();
    assert!(matches!(e, ZmtpError::TooLarge { what: "a frame", .. }), "{e}");

    // more parts than allowed
    let limits = Limits { frame: 1024, parts: 2 };
    let then: Vec<u8> = (0..3).flat_map(|_| frame(MORE, b"x")).collect();
    let (endpoint, _task) = peer(b"PUB", then).await;
    let mut c = Connection::connect(&endpoint, SocketType::Sub, limits, T)
        .await
        .unwrap();
    let e = c.recv().await.unwrap_err();
    assert!(matches!(e, ZmtpError::TooLarge { what: "a message", .. }), "{e}");

    // reserved flags, and a message cut short by the peer's close
    for then in [vec![0x80, 0], frame(MORE, b"x")] {
        let (endpoint, _task) = peer(b"PUB", then).await;
        let mut c = Connection::connect(&endpoint, SocketType::Sub, Limits::default(), T)
            .await
            .unwrap();
        assert!(c.recv().await.is_err());
    }
}

#[test]
fn ready_commands_are_read_within_their_bounds() {
    assert_eq!(ready_socket_type(&ready_of(b"PUB")).unwrap(), b"PUB");
    let full = ready_of(b"PUB");
    for cut in 0..full.len() {
        assert!(ready_socket_type(&full[..cut]).is_err(), "cut at {cut}");
    }
    assert!(ready_socket_type(b"\x05ERROR").is_err());
}
