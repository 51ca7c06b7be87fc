//! Tests of the embedded storage: conformance, persistence, recovery, group commit, and faults of
//! the disk (full, failing writes, failing syncs).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::log_io::LogFile;
use super::log_io::tests::{Faults, FrozenAfter};
use super::{Embedded, Options};
use crate::storage::{Compare, ListRequest, Op, Storage, StorageError, Txn, TxnOutcome, Value};

fn small() -> Options {
    Options {
        initial_file_bytes: 64 << 10,
        compact_min_bytes: 32 << 10,
        ..Options::default()
    }
}

fn put(key: &str, v: &[u8]) -> Txn {
    Txn {
        compares: vec![],
        ops: vec![Op::Put {
            key: key.into(),
            value: Value::from(v),
        }],
    }
}

async fn committed(s: &Embedded, txn: Txn) -> u64 {
    match s.txn(txn).await.unwrap() {
        TxnOutcome::Committed { revision } => revision,
        other => panic!("{other:?}"),
    }
}

fn wal(dir: &Path) -> PathBuf {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.pop().expect("a log file")
}

#[tokio::test]
async fn passes_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let s = Embedded::open(dir.path(), small()).unwrap();
    crate::storage::conformance::run_all(&s).await;
}

#[tokio::test]
async fn state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (rev, create) = {
        let s = Embedded::open(dir.path(), small()).unwrap();
        let c = committed(&s, put("/a", b"one")).await;
        committed(&s, put("/b", b"gone")).await;
        committed(
            &s,
            Txn {
                compares: vec![],
                ops: vec![Op::Delete { key: "/b".into() }],
            },
        )
        .await;
        let r = committed(&s, put("/a", b"two")).await;
        (r, c)
    };
    let s = Embedded::open(dir.path(), small()).unwrap();
    let kv = s.get("/a").await.unwrap().unwrap();
    assert_eq!(
        (&*kv.value, kv.mod_revision, kv.create_revision),
        (&b"two"[..], rev, create)
    );
    assert!(s.get("/b").await.unwrap().is_none());
    assert_eq!(s.current_revision().await.unwrap(), rev);
    assert_eq!(committed(&s, put("/c", b"x")).await, rev + 1, "revisions continue");
}

#[tokio::test]
async fn waiting_for_a_revision_committed_while_nobody_waited_returns() {
    // Regression: the durable revision must be recorded even when no reader is subscribed, or a
    // later wait for an already-durable revision hangs.
    let dir = tempfile::tempdir().unwrap();
    let s = Embedded::open(dir.path(), small()).unwrap();
    let r = committed(&s, put("/a", b"1")).await;
    committed(&s, put("/b", b"2")).await;
    tokio::time::timeout(std::time::Duration::from_secs(10), s.wait_for_revision(r + 1))
        .await
        .expect("an already-durable revision is waited for without blocking")
        .unwrap();
}

#[tokio::test]
async fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _s = Embedded::open(dir.path(), small()).unwrap();
    let err = Embedded::open(dir.path(), small()).err().expect("locked");
    assert!(err.to_string().contains("in use by another process"), "{err}");
}

#[tokio::test]
async fn torn_tail_is_discarded_and_writing_continues() {
    let dir = tempfile::tempdir().unwrap();
    let good_rev = {
        let s = Embedded::open(dir.path(), small()).unwrap();
        committed(&s, put("/kept", b"acknowledged")).await
    };
    // A crash mid-commit: half of the next frame reached the file.
    let path = wal(dir.path());
    let f = OpenOptions::new().write(true).read(true).open(&path).unwrap();
    let end = {
        let s = Embedded::open(dir.path(), small()).unwrap();
        let _ = committed(&s, put("/torn", &[7u8; 300])).await;
        drop(s);
        // Find where the last frame starts: scan for the second frame magic.
        let bytes = std::fs::read(&path).unwrap();
        let magic = super::format::FRAME_MAGIC.to_le_bytes();
        let starts: Vec<usize> = (64..bytes.len() - 4)
            .step_by(8)
            .filter(|i| bytes[*i..*i + 4] == magic)
            .collect();
        assert_eq!(starts.len(), 2, "two frames written");
        starts[1]
    };
    // Keep the header and the first 100 bytes of the second frame, zero the rest of it.
    f.write_all_at(&[0u8; 300], (end + 100) as u64).unwrap();
    drop(f);

    let s = Embedded::open(dir.path(), small()).unwrap();
    assert_eq!(&*s.get("/kept").await.unwrap().unwrap().value, b"acknowledged");
    assert!(s.get("/torn").await.unwrap().is_none(), "the torn write is dropped");
    assert_eq!(s.current_revision().await.unwrap(), good_rev);
    let r = committed(&s, put("/after", b"x")).await;
    drop(s);
    let s = Embedded::open(dir.path(), small()).unwrap();
    assert_eq!(s.get("/after").await.unwrap().unwrap().mod_revision, r);
    assert!(s.get("/torn").await.unwrap().is_none());
}

#[tokio::test]
async fn torn_frame_whose_value_holds_a_frame_is_still_a_torn_tail() {
    // A value may be any bytes, including a valid frame. When the frame carrying it is torn by a
    // crash, recovery must not take that value for an intact frame following the damage.
    let mut enc = super::format::BatchEncoder::new();
    enc.push_txn(999, [("/inner", Some(&b"inner value"[..]))].into_iter());
    let (inner, _) = enc.finish();
    let mut value = inner.clone();
    value.extend_from_slice(&[0xAA; 300]);
    let dir = tempfile::tempdir().unwrap();
    let good_rev = {
        let s = Embedded::open(dir.path(), small()).unwrap();
        let rev = committed(&s, put("/kept", b"acknowledged")).await;
        // A 3-byte key puts the value 56 bytes into its frame: 8-aligned, where frames start.
        committed(&s, put("/ab", &value)).await;
        rev
    };
    let path = wal(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    let last = 64 + super::format::FrameHeader::decode(&bytes[64..96]).unwrap().frame_len() as usize;
    assert_eq!(
        &bytes[last + 56..last + 56 + inner.len()],
        &inner[..],
        "the value sits 8-aligned"
    );
    // The crash cut the last frame short after the embedded frame.
    let f = OpenOptions::new().write(true).read(true).open(&path).unwrap();
    f.write_all_at(&[0u8; 200], (last + 56 + inner.len() + 50) as u64)
        .unwrap();
    drop(f);

    let s = Embedded::open(dir.path(), small()).unwrap();
    assert_eq!(&*s.get("/kept").await.unwrap().unwrap().value, b"acknowledged");
    assert!(s.get("/ab").await.unwrap().is_none(), "the torn write is dropped");
    assert!(
        s.get("/inner").await.unwrap().is_none(),
        "a value is never replayed as a frame"
    );
    assert_eq!(s.current_revision().await.unwrap(), good_rev);
    let r = committed(&s, put("/after", b"x")).await;
    drop(s);
    let s = Embedded::open(dir.path(), small()).unwrap();
    assert_eq!(s.get("/after").await.unwrap().unwrap().mod_revision, r);
}

#[tokio::test]
async fn corrupt_middle_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Embedded::open(dir.path(), small()).unwrap();
        for i in 0..5 {
            committed(&s, put(&format!("/k{i}"), b"value")).await;
        }
    }
    let path = wal(dir.path());
    // Flip one byte inside the first frame's payload.
    let f = OpenOptions::new().write(true).read(true).open(&path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 64 + 40).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], 64 + 40).unwrap();
    drop(f);
    let err = Embedded::open(dir.path(), small()).err().expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, StorageError::Corrupt(_)), "{msg}");
    assert!(
        msg.contains("offset 64") && msg.contains("intact frame follows"),
        "{msg}"
    );
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

#[tokio::test]
async fn group_commit_shares_syncs_across_concurrent_writers() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Embedded::open(dir.path(), Options::default()).unwrap());
    let tasks: Vec<_> = (0..64)
        .map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let key = format!("/g/{w}/{i}");
                    let create = Txn {
                        compares: vec![Compare::ModRevision {
                            key: key.clone(),
                            revision: 0,
                        }],
                        ops: vec![Op::Put {
                            key,
                            value: Value::from(&[1u8; 1024][..]),
                        }],
                    };
                    assert!(matches!(s.txn(create).await.unwrap(), TxnOutcome::Committed { .. }));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let all = s
        .list(ListRequest {
            prefix: "/g/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.items.len(), 64 * 20);
    // Every frame holds one group commit; with 64 writers there must be far fewer frames than
    // transactions.
    let bytes = std::fs::read(wal(dir.path())).unwrap();
    let magic = super::format::FRAME_MAGIC.to_le_bytes();
    let frames = (64..bytes.len() - 32)
        .step_by(8)
        .filter(|i| bytes[*i..*i + 4] == magic && super::format::FrameHeader::decode(&bytes[*i..*i + 32]).is_some())
        .count();
    assert!(frames < 64 * 20, "{frames} frames for {} transactions", 64 * 20);
}

#[tokio::test]
async fn compaction_bounds_the_log_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let s = Embedded::open(dir.path(), small()).unwrap();
    let mut last = 0;
    for i in 0..400 {
        last = committed(&s, put(&format!("/c/{}", i % 10), &[i as u8; 1000])).await;
    }
    let before_delete = committed(&s, put("/c/deleted", b"x")).await;
    committed(
        &s,
        Txn {
            compares: vec![],
            ops: vec![Op::Delete {
                key: "/c/deleted".into(),
            }],
        },
    )
    .await;
    let size = std::fs::metadata(wal(dir.path())).unwrap().len();
    assert!(size < 400 * 1000, "the log was compacted: {size} bytes");
    let page = s
        .list(ListRequest {
            prefix: "/c/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 10);
    assert!(page.items.iter().any(|kv| kv.mod_revision == last));
    // A paged read at a revision older than the compaction answers Expired.
    let old = s
        .list(ListRequest {
            prefix: "/c/".into(),
            revision: Some(1),
            ..Default::default()
        })
        .await;
    assert!(matches!(old, Err(StorageError::Expired { .. })), "{old:?}");
    drop(s);
    let s = Embedded::open(dir.path(), small()).unwrap();
    let page = s
        .list(ListRequest {
            prefix: "/c/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 10);
    for kv in &page.items {
        let i: usize = kv.key.rsplit('/').next().unwrap().parse().unwrap();
        assert_eq!(kv.value[0], (390 + i) as u8, "latest value of {}", kv.key);
    }
    assert!(s.get("/c/deleted").await.unwrap().is_none());
    assert!(s.current_revision().await.unwrap() > before_delete);
}

#[tokio::test]
async fn a_power_cut_loses_nothing_that_was_acknowledged() {
    // The disk stops syncing after the 6th sync (the first ones create and grow the file); then
    // every unsynced write is thrown away, as after a power cut.
    let dir = tempfile::tempdir().unwrap();
    let frozen: Arc<parking_lot::Mutex<Option<Arc<FrozenAfter>>>> = Arc::default();
    let slot = frozen.clone();
    let options = Options {
        wrap_file: Some(Arc::new(move |f| {
            let ff = Arc::new(FrozenAfter::new(f, 6));
            *slot.lock() = Some(ff.clone());
            ff as Arc<dyn LogFile>
        })),
        ..small()
    };
    let s = Arc::new(Embedded::open(dir.path(), options).unwrap());
    let tasks: Vec<_> = (0..8)
        .map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..50 {
                    let key = format!("/p/{w}/{i}");
                    match s.txn(put(&key, key.as_bytes())).await {
                        Ok(TxnOutcome::Committed { revision }) => acked.push((key, revision)),
                        Ok(other) => panic!("{other:?}"),
                        Err(StorageError::Unavailable(_)) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                acked
            })
        })
        .collect();
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    assert!(!acked.is_empty());
    assert!(acked.len() < 400, "writes stopped once syncing failed");
    assert!(s.health().is_err(), "a failed sync is reported to /readyz");
    let lost = frozen.lock().as_ref().unwrap().lose_unsynced().unwrap();
    drop(s);
    let s = Embedded::open(dir.path(), small()).unwrap();
    assert!(s.health().is_ok());
    for (key, revision) in &acked {
        let kv = s
            .get(key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key} was acknowledged and lost"));
        assert_eq!(kv.mod_revision, *revision);
        assert_eq!(&*kv.value, key.as_bytes());
    }
    let _ = lost;
}

const ENOSPC: i32 = 28;
const EIO: i32 = 5;

fn faulty(faults: &Arc<Faults>) -> Options {
    Options {
        wrap_file: Some(faults.wrapper()),
        ..small()
    }
}

/// Eight writers at once; every one must be refused with an error `ok` accepts.
async fn all_refused(s: &Arc<Embedded>, tag: &str, ok: fn(&StorageError) -> bool) {
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            let key = format!("/refused/{tag}/{i}");
            tokio::spawn(async move { s.txn(put(&key, &[7u8; 2048])).await })
        })
        .collect();
    for t in tasks {
        match t.await.unwrap() {
            Err(e) if ok(&e) => {}
            other => panic!("a write must be refused, got {other:?}"),
        }
    }
}

async fn until_healthy(s: &Embedded) {
    let within = std::time::Duration::from_secs(10);
    crate::eventually::eventually_async(within, "writing resumed", || std::future::ready(s.health().is_ok())).await
}

#[tokio::test]
async fn a_full_disk_refuses_writes_keeps_reads_and_resumes_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let s = Arc::new(Embedded::open(dir.path(), faulty(&faults)).unwrap());
    let a = committed(&s, put("/k/a", b"a")).await;
    let b = committed(&s, put("/k/b", b"b")).await;
    *faults.write.lock() = Some(ENOSPC);
    // the first round fails in the committer, the rest at admission or behind it
    all_refused(&s, "first", |e| matches!(e, StorageError::NoSpace(_))).await;
    let health = s.health().unwrap_err();
    assert!(
        matches!(&health, StorageError::NoSpace(m) if m.contains("resume by themselves") && m.contains("No space left")),
        "{health}"
    );
    // reads still serve what is durable; nothing refused is visible
    assert_eq!(&*s.get("/k/a").await.unwrap().unwrap().value, b"a");
    let listed = s
        .list(ListRequest {
            prefix: "/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 2);
    assert_eq!(listed.revision, b);
    all_refused(&s, "again", |e| matches!(e, StorageError::NoSpace(_))).await;
    // space returns: writing resumes by itself, at the next revision (nothing refused took one)
    *faults.write.lock() = None;
    until_healthy(&s).await;
    assert_eq!(committed(&s, put("/k/c", b"c")).await, b + 1);
    assert_eq!(s.get("/k/a").await.unwrap().unwrap().mod_revision, a);
    drop(s);
    let s = Embedded::open(dir.path(), small()).unwrap();
    let keys: Vec<String> = s
        .list(ListRequest {
            prefix: "/".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(
        keys,
        ["/k/a", "/k/b", "/k/c"],
        "acknowledged writes only, after a reopen"
    );
}

#[tokio::test]
async fn a_full_disk_while_the_log_grows_is_refused_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let s = Arc::new(Embedded::open(dir.path(), faulty(&faults)).unwrap());
    committed(&s, put("/k/small", b"x")).await;
    *faults.write.lock() = Some(ENOSPC);
    // larger than the 64 KiB file: the log must grow first, and growing fails
    let big = vec![9u8; 200 << 10];
    assert!(matches!(
        s.txn(put("/k/big", &big)).await,
        Err(StorageError::NoSpace(_))
    ));
    *faults.write.lock() = None;
    until_healthy(&s).await;
    committed(&s, put("/k/big", &big)).await;
    assert_eq!(&*s.get("/k/big").await.unwrap().unwrap().value, &big[..]);
    drop(s);
    let s = Embedded::open(dir.path(), small()).unwrap();
    assert_eq!(&*s.get("/k/big").await.unwrap().unwrap().value, &big[..]);
}

#[tokio::test]
async fn a_failed_sync_or_a_failed_write_stops_writes_for_good() {
    for (what, errno) in [("sync", EIO), ("sync", ENOSPC), ("write", EIO)] {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let s = Arc::new(Embedded::open(dir.path(), faulty(&faults)).unwrap());
        let acked = committed(&s, put("/k/acked", b"kept")).await;
        let slot = if what == "sync" { &faults.sync } else { &faults.write };
        *slot.lock() = Some(errno);
        all_refused(&s, what, |e| matches!(e, StorageError::Unavailable(_))).await;
        *slot.lock() = None;
        // the disk looks fine again, but after a failed sync the page cache cannot be trusted:
        // this is the failure that no probe lifts (a full disk would answer NoSpace instead)
        let e = s.txn(put("/k/later", b"no")).await.unwrap_err();
        assert!(
            matches!(&e, StorageError::Unavailable(m) if m.contains("for good")),
            "{what} errno {errno}: {e}"
        );
        assert!(s.health().is_err(), "/readyz keeps failing");
        assert_eq!(&*s.get("/k/acked").await.unwrap().unwrap().value, b"kept");
        drop(s);
        let s = Embedded::open(dir.path(), small()).unwrap();
        assert_eq!(s.get("/k/acked").await.unwrap().unwrap().mod_revision, acked);
        assert!(s.health().is_ok(), "a restart writes again");
        committed(&s, put("/k/after-restart", b"ok")).await;
    }
}
