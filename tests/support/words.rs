//! The words real-engine prompts are made of, shared by the e2e tests (`engines.rs`) and the
//! router's placement benchmark.

/// `n` words drawn from a vocabulary of 400 five-letter words the model's tokenizer splits into
/// about 3.2 tokens each, vocabulary and draws both from one stream seeded by `seed`: the same
/// seed gives the same words.
pub fn generated_words(seed: u64, n: usize) -> Vec<String> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    let vocabulary: Vec<String> = (0..400)
        .map(|_| (0..5).map(|_| (b'a' + (next() % 10) as u8) as char).collect())
        .collect();
    (0..n).map(|_| vocabulary[next() % vocabulary.len()].clone()).collect()
}
