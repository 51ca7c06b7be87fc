//! The embedded storage opening a log of arbitrary bytes (`wal-…1.log`): it must recover,
//! repair a torn tail or refuse with an error, never panic; once open it must read and write.

#![no_main]

use kvcache_apiserver::storage::embedded::{Embedded, Options};
use kvcache_apiserver::storage::{ListRequest, Op, Storage, Txn};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("wal-0000000000000001.log"), data).expect("write the log");
    let options = Options {
        initial_file_bytes: 64 << 10,
        ..Options::default()
    };
    let Ok(s) = Embedded::open(dir.path(), options) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let listed = s
            .list(ListRequest {
                prefix: "/".into(),
                ..Default::default()
            })
            .await;
        if let Ok(page) = listed {
            for kv in page.items.iter().take(8) {
                let _ = s.get(&kv.key).await;
            }
        }
        let put = Txn {
            compares: vec![],
            ops: vec![Op::Put {
                key: "/fuzz/after".into(),
                value: b"v".as_slice().into(),
            }],
        };
        let _ = s.txn(put).await;
    });
});
