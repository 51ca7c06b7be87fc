//! `--workers-dns KIND=HOST:PORT`: HOST resolved every second (in a cluster a headless Service,
//! one A record per ready Pod) into workers `http://IP:PORT`. A failed resolution keeps the last
//! set (a worker that is really gone fails its health checks and is taken out) and says why once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Pool, Source, WorkerSets};
use crate::config::DnsSource;

/// How often the names are resolved.
pub const POLL: Duration = Duration::from_secs(1);

/// The watch on one `--workers-dns`.
#[derive(Debug)]
pub struct DnsWatch {
    index: usize,
    source: DnsSource,
    last_error: Option<String>,
}

impl DnsWatch {
    pub fn new(index: usize, source: DnsSource) -> Self {
        Self {
            index,
            source,
            last_error: None,
        }
    }

    /// Resolves once and applies the addresses.
    pub async fn poll(&mut self, pool: &Pool) {
        let target = self.source.target.clone();
        let lookup = tokio::time::timeout(POLL * 5, tokio::net::lookup_host(target.as_str())).await;
        match lookup {
            Ok(Ok(addrs)) => {
                self.last_error = None;
                pool.set_source(Source::Dns(self.index), sets(&self.source, addrs));
            }
            Ok(Err(e)) => self.refused(e.to_string()),
            Err(_) => self.refused("no answer within 5 s".into()),
        }
    }

    fn refused(&mut self, why: String) {
        if self.last_error.as_ref() != Some(&why) {
            tracing::warn!(kind = self.source.kind.label(), target = %self.source.target, error = %why,
                "resolving workers failed; keeping the last set");
            self.last_error = Some(why);
        }
    }

    /// Resolves every [`POLL`] until `cancel` fires.
    pub async fn run(mut self, pool: Arc<Pool>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(POLL) => self.poll(&pool).await,
            }
        }
    }
}

/// The workers a resolution names, sorted so that the same answer is the same set.
fn sets(source: &DnsSource, addrs: impl Iterator<Item = SocketAddr>) -> WorkerSets {
    let mut urls: Vec<String> = addrs.map(|a| format!("http://{a}")).collect();
    urls.sort();
    urls.dedup();
    let mut s = WorkerSets::default();
    s.set(source.kind, urls);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::Kind;

    #[test]
    fn addresses_become_urls() {
        let src = DnsSource {
            kind: Kind::Decode,
            target: "x:8000".into(),
        };
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.2:8000".parse().unwrap(),
            "[fd00::1]:8000".parse().unwrap(),
            "10.0.0.2:8000".parse().unwrap(),
        ];
        let s = sets(&src, addrs.into_iter());
        assert_eq!(s.get(Kind::Decode), ["http://10.0.0.2:8000", "http://[fd00::1]:8000"]);
        assert!(s.get(Kind::Prefill).is_empty());
    }

    #[tokio::test]
    async fn resolves_localhost() {
        let pool = Pool::new(2, crate::metrics::Metrics::register(&mut Default::default()));
        let mut w = DnsWatch::new(
            0,
            DnsSource {
                kind: Kind::Prefill,
                target: "127.0.0.1:9".into(),
            },
        );
        w.poll(&pool).await;
        let ws = pool.workers(Kind::Prefill);
        assert_eq!(ws.len(), 1);
        assert_eq!(&*ws[0].url, "http://127.0.0.1:9");
    }
}
