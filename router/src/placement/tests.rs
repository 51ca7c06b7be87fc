//! The placement decision as a table.

use super::*;

fn c(memory: u64, outstanding: u64) -> Candidate {
    Candidate { memory, outstanding }
}

/// (name, candidates, prompt, stored, weight, start, chosen, reason)
type Case = (&'static str, Vec<Candidate>, u64, u64, u64, usize, usize, Reason);

#[test]
fn the_decision_table() {
    use Reason::{EngineMemory, Load};
    let cases: Vec<Case> = vec![
        (
            "idle, nothing held: round robin from start",
            vec![c(0, 0), c(0, 0), c(0, 0)],
            1000,
            0,
            512,
            1,
            1,
            Load,
        ),
        (
            "the one holding the prefix",
            vec![c(0, 0), c(960, 0), c(0, 0)],
            1000,
            0,
            512,
            0,
            1,
            EngineMemory,
        ),
        (
            "the longest prefix",
            vec![c(320, 0), c(960, 0), c(640, 0)],
            1000,
            0,
            512,
            2,
            1,
            EngineMemory,
        ),
        (
            "held, but loaded beyond what it spares",
            vec![c(0, 0), c(960, 2), c(0, 0)],
            1000,
            0,
            512,
            0,
            0,
            Load,
        ),
        (
            "held, and load worth less than it spares",
            vec![c(0, 1), c(960, 1), c(0, 0)],
            1000,
            0,
            512,
            2,
            1,
            EngineMemory,
        ),
        (
            "the store holds more than any memory: by load",
            vec![c(0, 1), c(320, 1), c(0, 0)],
            1000,
            640,
            512,
            0,
            2,
            Load,
        ),
        (
            "weight 0: memory alone",
            vec![c(0, 0), c(64, 9)],
            1000,
            0,
            0,
            0,
            1,
            EngineMemory,
        ),
        (
            "ties among holders go round robin",
            vec![c(960, 0), c(0, 0), c(960, 0)],
            1000,
            0,
            512,
            1,
            2,
            EngineMemory,
        ),
        ("one candidate", vec![c(0, 5)], 10, 0, 512, 7, 0, Load),
    ];
    for (name, candidates, prompt, stored, weight, start, want, why) in cases {
        assert_eq!(
            decide(&candidates, prompt, stored, weight, start),
            (want, why),
            "{name}"
        );
    }
}

#[test]
fn hits_are_whole_blocks_short_of_the_last_token() {
    assert_eq!(
        hit_tokens(4, 16, 64),
        48,
        "a prompt of exactly 4 blocks computes its last"
    );
    assert_eq!(hit_tokens(4, 16, 65), 64);
    assert_eq!(hit_tokens(2, 16, 65), 32);
    assert_eq!(hit_tokens(0, 16, 65), 0);
    assert_eq!(hit_tokens(3, 16, 0), 0);
}
