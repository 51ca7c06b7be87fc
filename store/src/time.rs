//! Wall-clock milliseconds, the unit deadlines cross process boundaries in. Durations on the
//! command line are parsed by `kvcache_units::parse_duration`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `now + d` in Unix milliseconds, saturating.
pub fn unix_ms_after(d: Duration) -> u64 {
    now_unix_ms().saturating_add(d.as_millis() as u64)
}

/// The monotonic instant of a deadline given in Unix milliseconds (`None` for 0: no deadline).
pub fn instant_of_unix_ms(deadline_unix_ms: u64) -> Option<tokio::time::Instant> {
    (deadline_unix_ms != 0)
        .then(|| tokio::time::Instant::now() + Duration::from_millis(deadline_unix_ms.saturating_sub(now_unix_ms())))
}
