//! The engine-memory index as a table of event histories and the prompts they make hits of.

use super::*;

fn h(n: u8) -> BlockHash {
    BlockHash::Bytes(vec![n; 8])
}

fn stored(
    hashes: &[u8],
    parent: Option<u8>,
    tokens: std::ops::Range<i64>,
    salt: Option<&str>,
    lora: Option<&str>,
) -> EngineEvent {
    EngineEvent::Stored {
        hashes: hashes.iter().map(|n| h(*n)).collect(),
        parent: parent.map(h),
        tokens: tokens.collect(),
        block_size: 4,
        lora_name: lora.map(Into::into),
        salt: salt.map(Into::into),
    }
}

/// Leading blocks of a prompt of tokens 0..n the memory holds, for `salt` and `lora`.
fn held(m: &Memory, n: i64, salt: &str, lora: &str) -> usize {
    let tokens: Vec<i64> = (0..n).collect();
    m.held_prefix(&chain_from(chain_seed(salt, lora), &tokens, m.block_size().max(1)))
}

#[test]
fn histories_and_the_prefixes_they_hold() {
    let cases: Vec<(&str, Vec<EngineEvent>, [usize; 4])> = vec![
        // held for: (no salt, no LoRA), salt "a", LoRA "l", and a 6-token prompt
        ("nothing", vec![], [0, 0, 0, 0]),
        (
            "two blocks",
            vec![stored(&[1, 2], None, 0..8, None, None)],
            [2, 0, 0, 1],
        ),
        (
            "a child extends its parent's chain",
            vec![
                stored(&[1, 2], None, 0..8, None, None),
                stored(&[3], Some(2), 8..12, None, None),
            ],
            [3, 0, 0, 1],
        ),
        (
            "a removed block ends the prefix there",
            vec![
                stored(&[1, 2], None, 0..8, None, None),
                stored(&[3], Some(2), 8..12, None, None),
                EngineEvent::Removed { hashes: vec![h(2)] },
            ],
            [1, 0, 0, 1],
        ),
        (
            "a salted tenant's blocks count for that salt only",
            vec![stored(&[1, 2], None, 0..8, Some("a"), None)],
            [0, 2, 0, 0],
        ),
        (
            "an adapter's blocks count for that adapter only",
            vec![stored(&[1, 2], None, 0..8, None, Some("l"))],
            [0, 0, 2, 0],
        ),
        (
            "a block whose parent was never seen is not named",
            vec![stored(&[3], Some(2), 8..12, None, None)],
            [0, 0, 0, 0],
        ),
        (
            "cleared",
            vec![stored(&[1, 2], None, 0..8, None, None), EngineEvent::Cleared],
            [0, 0, 0, 0],
        ),
        (
            "two engine blocks with one name: removing one keeps the other",
            vec![
                stored(&[1], None, 0..4, None, None),
                stored(&[9], None, 0..4, None, None),
                EngineEvent::Removed { hashes: vec![h(1)] },
            ],
            [1, 0, 0, 1],
        ),
        (
            "a hash stored again under other tokens is renamed",
            vec![
                stored(&[1], None, 0..4, None, None),
                stored(&[1], None, 4..8, None, None),
            ],
            [0, 0, 0, 0],
        ),
    ];
    for (name, events, want) in cases {
        let mut m = Memory::default();
        for e in &events {
            m.apply(e);
        }
        let got = [
            held(&m, 12, "", ""),
            held(&m, 12, "a", ""),
            held(&m, 12, "", "l"),
            held(&m, 6, "", ""),
        ];
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn integer_hashes_and_sizes() {
    let mut m = Memory::default();
    m.apply(&EngineEvent::Stored {
        hashes: vec![BlockHash::Int(-5), BlockHash::Int(7)],
        parent: None,
        tokens: (0..8).collect(),
        block_size: 4,
        lora_name: None,
        salt: None,
    });
    assert_eq!((m.len(), m.block_size(), m.is_empty()), (2, 4, false));
    m.apply(&EngineEvent::Removed {
        hashes: vec![BlockHash::Int(-5), BlockHash::Int(99)],
    });
    assert_eq!(m.len(), 1);
    assert!(chain_from(1, &[1, 2, 3], 0).is_empty());
    assert_eq!(chain_from(1, &[1, 2, 3], 2).len(), 1);
}
