//! The member's data-port and same-host headers (`wire`), and what the member does with a
//! decoded one: check the grant against a real mounted segment and, if it is granted, copy into or
//! out of the range. Bounds and grants must hold for any header; a refusal must parse as one.
//! A header whose MAC starts with an even byte is signed here with the segment's key, as if the
//! leader had granted exactly that range (and the write's tag after it), so the bounds, claim and
//! record checks behind the MAC are reached too (a leader never grants a range outside a
//! segment; the member checks anyway). A header with `epoch` 0 remounts the segment first, so
//! what was written is reported and adopted back (or not) as after a failover.

#![no_main]

use std::sync::OnceLock;

use kvcache_store::grant::{Access, GrantKey, Range};
use kvcache_store::member::mmap::SharedMap;
use kvcache_store::member::segment::{Grant, Segment};
use kvcache_store::wire::{self, REQUEST_LEN, RESPONSE_LEN, Request, Response};
use libfuzzer_sys::fuzz_target;

const CAPACITY: u64 = 1 << 20;
const MOUNT: u64 = 3;
const EPOCH: u64 = 2;

fn segment() -> &'static (Segment, GrantKey) {
    static SEGMENT: OnceLock<(Segment, GrantKey)> = OnceLock::new();
    SEGMENT.get_or_init(|| {
        let dir = std::env::temp_dir();
        let s = Segment::new(SharedMap::create(&dir, CAPACITY, false).expect("a segment"));
        s.set_mount(MOUNT);
        s.see_epoch(EPOCH);
        let key = GrantKey::generate();
        s.set_grant_key(key.clone());
        (s, key)
    })
}

fuzz_target!(|data: &[u8]| {
    let (segment, key) = segment();
    let mut rest = data;
    while rest.len() >= REQUEST_LEN {
        let (head, tail) = rest.split_at(REQUEST_LEN);
        rest = tail;
        let Ok(req) = Request::decode(head.try_into().expect("a whole header")) else {
            continue;
        };
        let access = match req.op {
            wire::Op::Write | wire::Op::ClaimWrite => Access::Write,
            _ => Access::Read,
        };
        // a write's tag follows its header (as much of it as there is)
        let tag: &[u8] = if access == Access::Write {
            let n = usize::from(req.tag_len).min(rest.len());
            let (tag, tail) = rest.split_at(n);
            rest = tail;
            tag
        } else {
            &[]
        };
        let _ = kvcache_store::grant::Tag::decode(tag);
        let mac = if req.mac[0] % 2 == 0 {
            Grant::mac_from(&key.sign(
                &Range {
                    access,
                    mount_id: req.mount_id,
                    epoch: req.epoch,
                    allocation: req.allocation,
                    offset: req.offset,
                    len: req.len,
                    deadline_unix_ms: req.deadline_unix_ms,
                },
                tag,
            ))
        } else {
            req.mac
        };
        let grant = Grant {
            mount_id: req.mount_id,
            epoch: req.epoch,
            offset: req.offset,
            allocation: req.allocation,
            deadline_unix_ms: req.deadline_unix_ms,
            mac,
        };
        if req.epoch == 0 {
            segment.set_mount(MOUNT + 1);
            let (report, _) = segment.report(1 << 16);
            let answer: Vec<u64> = report
                .iter()
                .enumerate()
                .map(|(i, _)| (req.allocation >> (i % 64)) & 1)
                .collect();
            let seals: Vec<bytes::Bytes> = answer.iter().map(|a| bytes::Bytes::from(vec![*a as u8; 32])).collect();
            segment.adopt(&answer, &seals, EPOCH);
            segment.set_mount(MOUNT);
        }
        match req.op {
            wire::Op::Write | wire::Op::ClaimWrite => {
                if let Ok(mut range) = segment.begin_write(grant, req.len, tag) {
                    assert!(req.offset.checked_add(req.len).is_some_and(|end| end <= CAPACITY));
                    let n = (range.len() as usize).min(rest.len());
                    if n as u64 == range.len() {
                        range.copy_from(&rest[..n]).expect("a granted range takes its bytes");
                        range.finish();
                        // the leader committed it (or not): its seal comes with a heartbeat answer
                        if req.mac[1] % 2 == 0 {
                            let seal = bytes::Bytes::from(vec![req.mac[2]; 32]);
                            segment.seal(req.mount_id, &[req.offset], &[req.allocation], &[seal]);
                        }
                    }
                }
            }
            wire::Op::Read | wire::Op::ClaimRead => {
                if let Ok(range) = segment.begin_read(grant, req.len) {
                    assert!(req.offset.checked_add(req.len).is_some_and(|end| end <= CAPACITY));
                    assert_eq!(range.to_vec().len() as u64, req.len);
                }
            }
            wire::Op::Map | wire::Op::Release => {}
        }
    }
    for head in data.chunks_exact(RESPONSE_LEN) {
        let _ = Response::decode(head.try_into().expect("16 bytes"));
    }
    // a refusal's body, "CODE: message", from a member that may not be ours
    let _ = wire::refusal(data);
});
