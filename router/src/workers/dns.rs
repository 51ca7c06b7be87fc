//! `--workers-dns KIND=HOST:PORT`: HOST resolved every second (in a cluster a headless Service,
//! one A record per ready Pod) into workers `http://IP:PORT`. A failed resolution keeps the last
//! set (a worker that is really gone fails its health checks and is taken out) and says why once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Pool, Source, WorkerSets};
use crate::config::{DnsSource, EventPorts};
use crate::engine_memory::follow::Publisher;

/// How often the names are resolved.
pub const POLL: Duration = Duration::from_secs(1);

/// The watch on one `--workers-dns`.
#[derive(Debug)]
pub struct DnsWatch {
    index: usize,
    source: DnsSource,
    /// `--engine-events-ports`: where every resolved worker publishes its KV events
    events: Option<EventPorts>,
    last_error: Option<String>,
}

impl DnsWatch {
    pub fn new(index: usize, source: DnsSource, events: Option<EventPorts>) -> Self {
        Self {
            index,
            source,
            events,
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
                pool.set_source(Source::Dns(self.index), sets(&self.source, self.events, addrs));
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
fn sets(source: &DnsSource, events: Option<EventPorts>, addrs: impl Iterator<Item = SocketAddr>) -> WorkerSets {
    let mut addrs: Vec<SocketAddr> = addrs.collect();
    addrs.sort();
    addrs.dedup();
    let mut s = WorkerSets::default();
    let at = |a: &SocketAddr, port: u16| format!("tcp://{}", SocketAddr::new(a.ip(), port));
    for a in &addrs {
        if let Some(ports) = events {
            let publisher = Publisher {
                events: at(a, ports.events),
                replay: ports.replay.map(|p| at(a, p)),
            };
            s.set_publisher(format!("http://{a}"), publisher);
        }
    }
    let mut urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    urls.sort();
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
        let s = sets(&src, None, addrs.clone().into_iter());
        assert_eq!(s.get(Kind::Decode), ["http://10.0.0.2:8000", "http://[fd00::1]:8000"]);
        assert!(s.get(Kind::Prefill).is_empty());
        assert_eq!(s.publisher("http://10.0.0.2:8000"), None);
        let ports = EventPorts {
            events: 5557,
            replay: Some(5558),
        };
        let s = sets(&src, Some(ports), addrs.into_iter());
        assert_eq!(
            s.publisher("http://[fd00::1]:8000"),
            Some(&Publisher {
                events: "tcp://[fd00::1]:5557".into(),
                replay: Some("tcp://[fd00::1]:5558".into())
            })
        );
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
            None,
        );
        w.poll(&pool).await;
        let ws = pool.workers(Kind::Prefill);
        assert_eq!(ws.len(), 1);
        assert_eq!(&*ws[0].url, "http://127.0.0.1:9");
    }
}
