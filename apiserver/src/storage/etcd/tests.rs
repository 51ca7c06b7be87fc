//! The storage conformance suite against a real etcd (Debian's `/usr/bin/etcd`, started here on
//! free loopback ports and stopped at the end), and what etcd makes subtle: compares on deleted
//! keys, revisions across compaction, a watch that starts exactly at a revision.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Etcd, EtcdOptions};
use crate::storage::watch::Hub;
use crate::storage::{Compare, EventKind, ListRequest, Op, Storage, StorageError, Txn, TxnOutcome};

#[path = "../../../../tests/support/etcd.rs"]
mod process;
use crate::runtime::local::loopback_port;
use process::{EtcdProcess, Launch};

fn start_etcd() -> EtcdProcess {
    EtcdProcess::start()
}

/// An etcd serving clients over `scheme` (`http` or `https`), with `extra` flags (TLS files).
fn start_etcd_with(scheme: &str, extra: &[String]) -> EtcdProcess {
    EtcdProcess::start_with(&Launch {
        scheme: scheme.to_owned(),
        extra: extra.to_vec(),
        under: None,
    })
}

/// Connects with `opts`, retrying while etcd starts.
async fn connect_with(opts: &EtcdOptions) -> Etcd {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Etcd::connect(opts, Arc::new(Hub::new(1000, 1000))).await {
            Ok(e) => return e,
            Err(e) if Instant::now() >= deadline => panic!("etcd at {:?} never answered: {e}", opts.endpoints),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn connect(etcd: &EtcdProcess, prefix: &str) -> Etcd {
    let mut opts = EtcdOptions::parse(&format!("etcd://{}", etcd.endpoint)).unwrap();
    opts.prefix = prefix.into();
    opts.compaction_interval = Duration::ZERO;
    connect_with(&opts).await
}

fn put(key: &str, v: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: Arc::from(v.as_bytes()),
    }
}

#[tokio::test]
async fn the_conformance_suite_holds_on_etcd() {
    let etcd = start_etcd();
    let s = connect(&etcd, "/conformance").await;
    crate::storage::conformance::run_all(&s).await;
}

#[tokio::test]
async fn etcd_subtleties_are_pinned_down() {
    let etcd = start_etcd();
    let s = connect(&etcd, "/subtle").await;
    let create = |v: &str| Txn {
        compares: vec![Compare::ModRevision {
            key: "/k".into(),
            revision: 0,
        }],
        ops: vec![put("/k", v)],
    };
    // A compare on a deleted key sees revision 0: the key can be created again.
    assert!(matches!(
        s.txn(create("1")).await.unwrap(),
        TxnOutcome::Committed { .. }
    ));
    assert!(matches!(
        s.txn(create("2")).await.unwrap(),
        TxnOutcome::CompareFailed { .. }
    ));
    s.txn(Txn {
        compares: vec![],
        ops: vec![Op::Delete { key: "/k".into() }],
    })
    .await
    .unwrap();
    let TxnOutcome::Committed { revision: again } = s.txn(create("3")).await.unwrap() else {
        panic!("a deleted key must be creatable again");
    };
    let kv = s.get("/k").await.unwrap().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision),
        (again, again),
        "a new incarnation"
    );

    // A watch that starts exactly at a revision sees only what came after it.
    let TxnOutcome::Committed { revision: r1 } = s
        .txn(Txn {
            compares: vec![],
            ops: vec![put("/w/a", "1")],
        })
        .await
        .unwrap()
    else {
        panic!()
    };
    let TxnOutcome::Committed { revision: r2 } = s
        .txn(Txn {
            compares: vec![],
            ops: vec![put("/w/b", "2")],
        })
        .await
        .unwrap()
    else {
        panic!()
    };
    let mut w = s.watch("/w/", r1).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((e.kind, e.revision, e.key.as_str()), (EventKind::Put, r2, "/w/b"));

    // Across compaction: a list at a compacted revision is "too old" (the client lists again).
    let mut raw = etcd_client::Client::connect([etcd.endpoint.as_str()], None)
        .await
        .unwrap();
    raw.compact(i64::try_from(r2).unwrap(), None).await.unwrap();
    let old = s
        .list(ListRequest {
            prefix: "/w/".into(),
            revision: Some(r1),
            ..Default::default()
        })
        .await;
    assert!(matches!(old, Err(StorageError::Expired { .. })), "{old:?}");
    let now = s
        .list(ListRequest {
            prefix: "/w/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(now.items.len(), 2);
    assert!(now.revision >= r2);
    // Keys are kept apart by the prefix: another server's prefix sees none of these.
    let other = connect(&etcd, "/other").await;
    assert_eq!(other.count("/").await.unwrap(), 0);
    assert_eq!(s.count("/w/").await.unwrap(), 2);
}

#[tokio::test]
async fn tls_to_etcd_with_a_client_certificate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = kvcache_certs::Pki::ensure(pki_dir.path(), &["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let p = |f: &str| pki_dir.path().join(f).display().to_string();
    let tls: Vec<String> = [
        "--cert-file",
        &p("serving.crt"),
        "--key-file",
        &p("serving.key"),
        "--trusted-ca-file",
        &p("ca.crt"),
        "--client-cert-auth",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let etcd = start_etcd_with("https", &tls);
    let mut opts = EtcdOptions::parse(&format!("etcd://{}", etcd.endpoint)).unwrap();
    opts.compaction_interval = Duration::ZERO;
    opts.request_timeout = Duration::from_secs(3);
    opts.tls = Some(super::EtcdTls {
        ca: pki.ca.cert_pem.clone().into_bytes(),
        identity: Some((
            pki.admin.cert_pem.clone().into_bytes(),
            pki.admin.key_pem.clone().into_bytes(),
        )),
    });
    let s = connect_with(&opts).await;
    s.txn(Txn {
        compares: vec![],
        ops: vec![put("/tls", "yes")],
    })
    .await
    .unwrap();
    assert_eq!(&*s.get("/tls").await.unwrap().unwrap().value, b"yes");
    // Without the client certificate etcd refuses the connection.
    let mut anonymous = opts.clone();
    anonymous.tls = Some(super::EtcdTls {
        ca: pki.ca.cert_pem.clone().into_bytes(),
        identity: None,
    });
    assert!(Etcd::connect(&anonymous, Arc::new(Hub::new(100, 100))).await.is_err());
}
