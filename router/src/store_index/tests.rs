//! The index's state machine as tables, its predictions, and the store the environment names.

use kvcache_store::proto::{AllBlocksCleared, BlockRemoved, BlockStored};

use super::*;

fn ev(epoch: u64, id: u64, snapshot: bool, event: Event) -> BlockEvent {
    BlockEvent {
        epoch,
        id,
        snapshot,
        event: Some(event),
    }
}

fn cleared(epoch: u64, id: u64) -> BlockEvent {
    ev(epoch, id, true, Event::Cleared(AllBlocksCleared {}))
}

fn stored(epoch: u64, id: u64, snapshot: bool, keys: &[&str]) -> BlockEvent {
    let keys = keys.iter().map(|k| k.to_string()).collect();
    ev(epoch, id, snapshot, Event::Stored(BlockStored { keys, size: 64 }))
}

fn removed(epoch: u64, id: u64, keys: &[&str]) -> BlockEvent {
    let keys = keys.iter().map(|k| k.to_string()).collect();
    let reason = "evicted".into();
    ev(epoch, id, false, Event::Removed(BlockRemoved { keys, reason }))
}

fn run(events: &[BlockEvent]) -> (Index, Option<Gap>) {
    let mut i = Index::default();
    for e in events {
        if let Err(g) = i.apply(e) {
            return (i, Some(g));
        }
    }
    (i, None)
}

/// Which of the keys the tables name the index holds (and that it holds no other).
fn keys(i: &Index) -> Vec<&'static str> {
    let named = ["a", "b", "c", "y", "z"];
    let held: Vec<&str> = named.into_iter().filter(|k| i.contains(k)).collect();
    assert_eq!(held.len(), i.len(), "the index holds only keys the tables name");
    held
}

/// A stream, the keys it leaves, and the gap (last id, id got) it stops at.
type Case = (
    &'static str,
    Vec<BlockEvent>,
    &'static [&'static str],
    Option<(u64, u64)>,
);

/// Each stream as the leader sends it, and the index it leaves.
#[test]
fn streams_leave_the_index_the_leader_holds() {
    let cases: &[Case] = &[
        ("an empty tenant", vec![cleared(1, 0)], &[], None),
        (
            "a snapshot, then live puts and a removal",
            vec![
                cleared(1, 7),
                stored(1, 7, true, &["a", "b"]),
                stored(1, 8, false, &["c"]),
                removed(1, 9, &["a"]),
            ],
            &["b", "c"],
            None,
        ),
        (
            "a stream that starts over replaces what the first told",
            vec![
                cleared(1, 0),
                stored(1, 1, false, &["a"]),
                cleared(1, 40),
                stored(1, 40, true, &["z"]),
                stored(1, 41, false, &["y"]),
            ],
            &["y", "z"],
            None,
        ),
        (
            "a new leader's stream starts from what it adopted",
            vec![
                cleared(1, 0),
                stored(1, 1, false, &["a", "b"]),
                cleared(2, 0),
                stored(2, 0, true, &["b"]),
                stored(2, 1, false, &["a"]),
            ],
            &["a", "b"],
            None,
        ),
        (
            "a skipped live event is a gap",
            vec![cleared(1, 3), stored(1, 5, false, &["a"])],
            &[],
            Some((3, 5)),
        ),
        (
            "a live event of another epoch is a gap",
            vec![cleared(1, 3), stored(2, 4, false, &["a"])],
            &[],
            Some((3, 4)),
        ),
        (
            "live events before any snapshot are a gap",
            vec![stored(1, 1, false, &["a"])],
            &[],
            Some((0, 1)),
        ),
    ];
    for (name, events, want, gap) in cases {
        let (i, got) = run(events);
        assert_eq!(keys(&i), *want, "{name}");
        assert_eq!(got.map(|g| (g.last, g.got)), *gap, "{name}");
    }
}

#[test]
fn the_present_prefix_ends_at_the_first_missing_key() {
    let (i, _) = run(&[cleared(1, 0), stored(1, 0, true, &["k0", "k1", "k3"])]);
    assert_eq!(i.present_prefix(&["k0", "k1", "k2", "k3"]), 2);
    assert_eq!(i.present_prefix(&["k1", "k0"]), 2);
    assert_eq!(i.present_prefix(&["k2", "k0"]), 0);
    assert_eq!(i.present_prefix::<&str>(&[]), 0);
}

const LAYOUT: &str = "0123456789abcdef";

/// The keys a replica of `model` with `shards` shards saves for `tokens` (blocks of 4).
fn saved(model: &str, shards: u32, salt: &str, lora: &str, tokens: &[i64]) -> Vec<String> {
    let hashes = keys::chain(&keys::seed(model, salt, lora), tokens, 4);
    (0..shards)
        .flat_map(|s| {
            let ns = format!("vllm/{model}/{LAYOUT}/tp{s}of{shards}");
            hashes.iter().map(move |h| format!("{ns}/{h}"))
        })
        .collect()
}

fn holding(keys: &[String]) -> Index {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (mut i, gap) = run(&[cleared(1, 0), stored(1, 0, true, &keys)]);
    assert_eq!(gap, None);
    i.set_block_size(4);
    i
}

#[test]
fn stored_blocks_follow_the_connectors_chain() {
    let prompt: Vec<i64> = (0..18).collect();
    let i = holding(&saved("m", 1, "", "", &prompt[..12]));
    assert_eq!(i.stored_blocks("m", "", &prompt), 3, "12 of 18 tokens: 3 blocks");
    assert_eq!(
        i.stored_blocks("m", "", &prompt[..6]),
        1,
        "a shorter prompt: its 1 full block"
    );
    let mut other = prompt.clone();
    other[5] = 99;
    assert_eq!(i.stored_blocks("m", "", &other), 1, "a prompt that parts in block 1");
    assert_eq!(i.stored_blocks("m", "tenant-b", &prompt), 0, "another cache salt");
    assert_eq!(i.stored_blocks("sql-lora", "", &prompt), 0, "a LoRA adapter's request");
    let lora = holding(&saved("m", 1, "", "sql-lora", &prompt));
    assert_eq!(
        lora.stored_blocks("sql-lora", "", &prompt),
        4,
        "the adapter's own blocks"
    );
    assert_eq!(lora.stored_blocks("m", "", &prompt), 0, "not the base model's");
    let mut unknown = holding(&saved("m", 1, "", "", &prompt));
    unknown.set_block_size(0);
    assert_eq!(
        unknown.stored_blocks("m", "", &prompt),
        0,
        "no block size, no prediction"
    );
}

#[test]
fn a_block_counts_when_every_shard_holds_it() {
    let prompt: Vec<i64> = (0..16).collect();
    let mut both = saved("m", 2, "", "", &prompt);
    assert_eq!(holding(&both).stored_blocks("m", "", &prompt), 4);
    // shard 1 lacks block 2 (its keys come second): blocks 0 and 1 are whole
    let shard1_block2 = both.remove(4 + 2);
    assert_eq!(holding(&both).stored_blocks("m", "", &prompt), 2);
    both.push(shard1_block2);
    // a layout of which one shard holds nothing is no help
    let only_shard0: Vec<String> = both.iter().filter(|k| k.contains("/tp0of2/")).cloned().collect();
    assert_eq!(holding(&only_shard0).stored_blocks("m", "", &prompt), 0);
    // removing a namespace's last key forgets it
    let mut i = holding(&saved("m", 1, "", "", &prompt[..4]));
    let last = saved("m", 1, "", "", &prompt[..4]);
    let last: Vec<&str> = last.iter().map(String::as_str).collect();
    i.apply(&removed(1, 1, &last)).unwrap();
    assert!(i.namespaces.is_empty());
}

#[test]
fn the_environment_names_the_store_or_nothing() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    };
    assert!(Source::from_env(env(&[])).unwrap().is_none());
    let s = Source::from_env(env(&[
        ("KVSTORE_LEADER", "127.0.0.1:1"),
        ("KVSTORE_TENANT", "team-a"),
        ("KVSTORE_BLOCK_SIZE", "16"),
        ("KVSTORE_DTYPE", "bfloat16"),
        ("KVSTORE_CREDENTIAL", "secret"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        (s.leader.as_str(), s.scope.tenant.as_str(), s.scope.credential.as_str()),
        ("127.0.0.1:1", "team-a", "secret")
    );
    assert!(s.tls.is_none());
    let e = Source::from_env(env(&[("KVSTORE_LEADER", "127.0.0.1:1")])).unwrap_err();
    assert!(e.contains("KVSTORE_BLOCK_SIZE"), "{e}");
    let e = Source::from_env(env(&[
        ("KVSTORE_LEADER", "127.0.0.1:1"),
        ("KVSTORE_BLOCK_SIZE", "16"),
        ("KVSTORE_DTYPE", "bfloat16"),
        ("KVSTORE_TLS_CA", "/nonexistent/ca.pem"),
    ]))
    .unwrap_err();
    assert!(e.contains("KVSTORE_TLS_CA"), "{e}");
}
