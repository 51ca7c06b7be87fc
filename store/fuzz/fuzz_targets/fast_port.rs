//! The leader's fast port, as a connection feeds it: the input is cut into frames
//! (`frame::split`, the reader the port uses) and each is answered by a serving leader with a
//! registered tenant and a mounted member (`fastport::answer`, what the port runs per frame). Every
//! frame must get a reply frame or a refusal, never a panic; the reply must parse as a frame.

#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kvcache_store::flags::parse_tenant;
use kvcache_store::leader::{Leader, LeaderConfig, LeaderListeners, fastport};
use kvcache_store::proto::MountRequest;
use libfuzzer_sys::fuzz_target;

fn leader() -> &'static Leader {
    static LEADER: OnceLock<Leader> = OnceLock::new();
    LEADER.get_or_init(|| {
        let cfg = LeaderConfig {
            listen: "127.0.0.1:0".parse().expect("an address"),
            tenants: vec![parse_tenant("t=64Mi:16:bfloat16").expect("a tenant")],
            member_ttl: Duration::from_secs(1 << 30),
            max_value_size: 8 << 20,
            ..LeaderConfig::default()
        };
        let leader = Leader::new(cfg.clone()).expect("a leader");
        let serving = leader.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listeners = LeaderListeners::bind(&cfg).await.expect("bind");
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
        leader
            .with(|s| {
                s.mount(
                    &MountRequest {
                        name: "m".into(),
                        data_addr: "127.0.0.1:1".into(),
                        grpc_addr: "127.0.0.1:2".into(),
                        capacity: 32 << 20,
                        mount_id: 0,
                        instance_id: 7,
                        local_addr: String::new(),
                        holdings: Vec::new(),
                    },
                    Instant::now(),
                )
            })
            .expect("mount");
        leader
    })
}

fuzz_target!(|data: &[u8]| {
    let leader = leader();
    let mut buf = BytesMut::from(data);
    let mut out = BytesMut::new();
    for _ in 0..64 {
        let Ok(Some((method, body))) = kvcache_store::frame::split(&mut buf, 1 << 20) else {
            break;
        };
        fastport::answer(leader, method, &body, &mut out);
        let mut reply = out.clone();
        match kvcache_store::frame::split(&mut reply, usize::MAX) {
            Ok(Some((tag, _))) => assert!(tag <= 1, "a reply frame is an answer (0) or a refusal (1)"),
            other => panic!("the reply is not a whole frame: {other:?}"),
        }
        assert!(reply.is_empty(), "one reply frame per request");
    }
});
