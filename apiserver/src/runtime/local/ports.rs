//! Loopback ports for the processes the local runtime starts (and the tests start), which bind
//! them themselves: free now, below the kernel's ephemeral range (`ip_local_port_range`), so no
//! outgoing connection can take one before its process binds it, and never one this process
//! handed out before. Each port handed out is even and its odd neighbour is free too and never
//! handed out: a leader started with only `--listen` serves its fast port on the next one.

use std::net::{SocketAddr, TcpListener};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out.
const LOWEST: u32 = 10_000;

/// `127.0.0.1:<loopback_port()>`.
pub(super) fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], loopback_port()))
}

/// The first port of the kernel's ephemeral range (read once).
fn ephemeral_start() -> u32 {
    static START: OnceLock<u32> = OnceLock::new();
    *START.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768)
            .min(u32::from(u16::MAX))
    })
}

/// A free loopback port below the ephemeral range; where the range leaves no room below it, a
/// port the kernel picks.
pub fn loopback_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let below = ephemeral_start();
    if below > LOWEST + 1_000 {
        let pairs = (below - LOWEST) / 2;
        // processes (parallel tests, several servers) start at different places in the span
        let start = std::process::id().wrapping_mul(7_919) % pairs + 1;
        let _ = NEXT.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
        for _ in 0..pairs {
            let offset = 2 * (NEXT.fetch_add(1, Ordering::Relaxed) % pairs);
            let port = u16::try_from(LOWEST + offset).unwrap_or(0);
            if port != 0 && free(port) && free(port + 1) {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

/// Whether `port` can be bound on loopback now.
fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}
