//! Many watchers, some of which stop reading: the real server with a thousand watch streams on
//! one object, ten of which never read a byte (each on a connection of its own, as a stuck
//! client is). The server closes the ten once their queues fill and counts them in
//! `apiserver_terminated_watchers_total`; every other watcher receives every event, in order.
//! Their latency with and without the ten is a benchmark (`apiserver/benches/watchers.rs`);
//! this test prints the figures of its run and asserts no timing.

#[path = "../../apiserver/benches/support/h2.rs"]
mod h2;
mod support;

use support::Server;

const POOLS: &str = "/apis/worker.gpustack.ai/v1/kvcachepools";
/// Events queued per watcher before it is closed (the server's default is 1000; fewer here,
/// so that fewer updates fill the stalled watchers' queues).
const QUEUE: &str = "100";

fn terminated(s: &Server) -> u64 {
    s.get_body("/metrics", &[])
        .lines()
        .filter(|l| l.starts_with("apiserver_terminated_watchers_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn watchers_that_never_read_are_closed_and_counted_and_the_others_get_every_event() {
    let s = Server::start_with(&["--controllers=false", "--watch-queue", QUEUE]);
    s.kubectl("1.33").must_apply(&support::pool("pool-00000", ""));
    let pki = s.pki_file("ca.crt");
    let endpoint = h2::Endpoint {
        port: s.port,
        server_name: "localhost".into(),
        tls: h2::tls_connector(pki.parent().expect("the pki folder")).expect("the admin's TLS settings"),
    };
    let load = h2::WatchLoad {
        readers: 990,
        stalled: 10,
        // a stalled watcher holds its 64 KiB window, the server's body buffer and the queue:
        // 600 updates of ~700-byte events overflow all three with a queue of 100
        updates: 600,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let d = runtime
        .block_on(h2::watch_latency(&endpoint, POOLS, load))
        .expect("every reader receives every event");
    println!(
        "{} readers beside {} stalled watchers, {} updates: p50 {:?}, p99 {:?}",
        load.readers, load.stalled, load.updates, d.p50, d.p99
    );
    assert_eq!(d.delivered, load.readers * load.updates);
    assert_eq!(
        d.in_order, load.readers,
        "a reader missed, repeated or reordered an event"
    );
    assert_eq!(
        terminated(&s),
        10,
        "the stalled watchers, and only they, are closed and counted"
    );
}
