//! Behaviour every `Storage` implementation must have. Each backend's tests call [`run_all`].

use std::sync::Arc;

use super::{Compare, EventKind, ListRequest, Op, Storage, StorageError, Txn, TxnOutcome, Value};

fn val(s: &str) -> Value {
    Value::from(s.as_bytes())
}

fn put(key: &str, v: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: val(v),
    }
}

async fn commit(s: &dyn Storage, txn: Txn) -> u64 {
    match s.txn(txn).await.expect("txn") {
        TxnOutcome::Committed { revision } => revision,
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// Runs every check against an empty storage.
pub async fn run_all(s: &dyn Storage) {
    create_if_absent(s).await;
    update_and_delete_with_preconditions(s).await;
    prefix_compare_detects_new_keys(s).await;
    list_is_consistent_and_pages(s).await;
    watch_replays_then_streams(s).await;
    concurrent_creates_of_one_key_admit_exactly_one(s).await;
}

async fn create_if_absent(s: &dyn Storage) {
    let create = |v: &str| Txn {
        compares: vec![Compare::ModRevision {
            key: "/c/a".into(),
            revision: 0,
        }],
        ops: vec![put("/c/a", v)],
    };
    let rev = commit(s, create("1")).await;
    let kv = s.get("/c/a").await.unwrap().unwrap();
    assert_eq!((&*kv.value, kv.mod_revision, kv.create_revision), (&b"1"[..], rev, rev));
    assert!(matches!(
        s.txn(create("2")).await.unwrap(),
        TxnOutcome::CompareFailed { .. }
    ));
    assert_eq!(&*s.get("/c/a").await.unwrap().unwrap().value, b"1");
    assert!(s.get("/c/missing").await.unwrap().is_none());
}

async fn update_and_delete_with_preconditions(s: &dyn Storage) {
    let r1 = commit(
        s,
        Txn {
            compares: vec![],
            ops: vec![put("/u/a", "1")],
        },
    )
    .await;
    let r2 = commit(
        s,
        Txn {
            compares: vec![Compare::ModRevision {
                key: "/u/a".into(),
                revision: r1,
            }],
            ops: vec![put("/u/a", "2")],
        },
    )
    .await;
    assert!(r2 > r1);
    let kv = s.get("/u/a").await.unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (r1, r2));
    // A stale precondition changes nothing.
    let stale = Txn {
        compares: vec![Compare::ModRevision {
            key: "/u/a".into(),
            revision: r1,
        }],
        ops: vec![put("/u/a", "3"), put("/u/b", "x")],
    };
    assert!(matches!(s.txn(stale).await.unwrap(), TxnOutcome::CompareFailed { .. }));
    assert!(
        s.get("/u/b").await.unwrap().is_none(),
        "a failed txn applies none of its ops"
    );
    // Multi-key atomic write and delete.
    commit(
        s,
        Txn {
            compares: vec![Compare::ModRevision {
                key: "/u/a".into(),
                revision: r2,
            }],
            ops: vec![Op::Delete { key: "/u/a".into() }, put("/u/b", "y")],
        },
    )
    .await;
    assert!(s.get("/u/a").await.unwrap().is_none());
    assert_eq!(&*s.get("/u/b").await.unwrap().unwrap().value, b"y");
    // Deleting a missing key is a no-op, not an error.
    s.txn(Txn {
        compares: vec![],
        ops: vec![Op::Delete { key: "/u/zzz".into() }],
    })
    .await
    .unwrap();
}

async fn prefix_compare_detects_new_keys(s: &dyn Storage) {
    let base = s.current_revision().await.unwrap();
    let guarded = |key: &str| Txn {
        compares: vec![Compare::NoneNewer {
            prefix: "/p/".into(),
            revision: base,
        }],
        ops: vec![put(key, "v")],
    };
    commit(s, guarded("/p/one")).await;
    assert!(matches!(
        s.txn(guarded("/p/two")).await.unwrap(),
        TxnOutcome::CompareFailed { .. }
    ));
    assert!(s.get("/p/two").await.unwrap().is_none());
}

async fn list_is_consistent_and_pages(s: &dyn Storage) {
    for i in 0..10 {
        commit(
            s,
            Txn {
                compares: vec![],
                ops: vec![put(&format!("/l/{i:02}"), &i.to_string())],
            },
        )
        .await;
    }
    commit(
        s,
        Txn {
            compares: vec![],
            ops: vec![put("/lz", "outside the prefix")],
        },
    )
    .await;
    let first = s
        .list(ListRequest {
            prefix: "/l/".into(),
            limit: Some(4),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(first.items.len(), 4);
    assert!(first.more);
    // A write between pages is not visible to the next page read at the first page's revision.
    commit(
        s,
        Txn {
            compares: vec![],
            ops: vec![put("/l/05", "changed"), put("/l/99", "new")],
        },
    )
    .await;
    let mut all = first.items.clone();
    let mut after = first.items.last().map(|kv| kv.key.clone());
    loop {
        let page = s
            .list(ListRequest {
                prefix: "/l/".into(),
                revision: Some(first.revision),
                start_after: after.clone(),
                limit: Some(4),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(page.revision, first.revision);
        all.extend(page.items.iter().cloned());
        after = page.items.last().map(|kv| kv.key.clone());
        if !page.more {
            break;
        }
    }
    let keys: Vec<_> = all.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, (0..10).map(|i| format!("/l/{i:02}")).collect::<Vec<_>>());
    assert_eq!(&*all[5].value, b"5");
    // A filter applies before the limit.
    let odd = s
        .list(ListRequest {
            prefix: "/l/".into(),
            limit: Some(2),
            filter: Some(Arc::new(|kv| kv.value.last().is_some_and(|b| (b - b'0') % 2 == 1))),
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: Vec<_> = odd.items.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/l/01", "/l/03"]);
    assert!(odd.more);
}

async fn watch_replays_then_streams(s: &dyn Storage) {
    let start = s.current_revision().await.unwrap();
    let r1 = commit(
        s,
        Txn {
            compares: vec![],
            ops: vec![put("/w/a", "1")],
        },
    )
    .await;
    let mut w = s.watch("/w/", start).await.unwrap();
    commit(
        s,
        Txn {
            compares: vec![],
            ops: vec![put("/other", "x")],
        },
    )
    .await;
    commit(
        s,
        Txn {
            compares: vec![],
            ops: vec![Op::Delete { key: "/w/a".into() }],
        },
    )
    .await;
    let e1 = w.next().await.unwrap();
    assert_eq!((e1.kind, e1.revision, &*e1.value), (EventKind::Put, r1, &b"1"[..]));
    let e2 = w.next().await.unwrap();
    assert_eq!(e2.kind, EventKind::Delete);
    assert_eq!(&*e2.value, b"1", "a delete event carries the last value");
    assert_eq!(e2.create_revision, r1);
}

async fn concurrent_creates_of_one_key_admit_exactly_one(s: &dyn Storage) {
    let results = futures::future::join_all((0..16).map(|i| {
        s.txn(Txn {
            compares: vec![Compare::ModRevision {
                key: "/race".into(),
                revision: 0,
            }],
            ops: vec![put("/race", &i.to_string())],
        })
    }))
    .await;
    let committed = results
        .iter()
        .filter(|r| matches!(r, Ok(TxnOutcome::Committed { .. })))
        .count();
    assert_eq!(committed, 1);
    assert!(results.iter().all(|r| !matches!(r, Err(StorageError::Unavailable(_)))));
}
