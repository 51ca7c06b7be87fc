//! The keys a replica's vLLM connector stores a prompt's blocks under
//! (clients/python/python/kvcache/vllm/keys.py), computed the same way from the same tokens, so
//! what the router predicts about the store is exact by construction:
//!
//! - a chain `h0 = sha256(scheme ␀ model ␀ "salt=" salt ␀ "lora=" lora)`,
//!   `h(i) = sha256(h(i-1) ‖ the tokens of full block i, each a little-endian i64)`;
//! - block `i`'s key in a namespace: `<namespace>/<the first 32 hex digits of h(i)>`;
//! - a namespace, `vllm/<model>/<16 hex digits of the layout>/tp<shard>of<shards>`, names what
//!   only the replicas know (their KV layout and page format): the router reads the namespaces
//!   from the store's own keys (`store_index.rs`).
//!
//! Pinned by the same vector as the connector's `test_vllm.KeysTest`.

use ring::digest::{Context, SHA256};

/// The connector's `KEY_SCHEME`: a new one names other keys.
pub const KEY_SCHEME: &str = "kvcache-vllm-3";

/// What a chain starts from: the scheme, the model (the connector's, as its namespaces name
/// it), the request's cache salt and its LoRA adapter's name (empty for none).
pub fn seed(model: &str, salt: &str, lora: &str) -> Vec<u8> {
    [KEY_SCHEME, model, &format!("salt={salt}"), &format!("lora={lora}")]
        .join("\0")
        .into_bytes()
}

/// The hashes of `tokens`' full blocks of `block_size` tokens, each covering its whole prefix.
pub fn chain(seed: &[u8], tokens: &[i64], block_size: usize) -> Vec<String> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut h = ring::digest::digest(&SHA256, seed);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let mut c = Context::new(&SHA256);
            c.update(h.as_ref());
            for t in block {
                c.update(&t.to_le_bytes());
            }
            h = c.finish();
            hex32(h.as_ref())
        })
        .collect()
}

fn hex32(digest: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(32);
    for b in &digest[..16] {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A namespace the connector names its keys in, read back from a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace {
    /// The whole prefix, `vllm/<model>/<layout>/tp<shard>of<shards>`.
    pub name: String,
    pub model: String,
    /// The 16 hex digits of the layout and page format.
    pub layout: String,
    pub shard: u32,
    pub shards: u32,
}

impl Namespace {
    /// The namespace of a block's `key`, if it is one a vLLM connector made.
    pub fn of_key(key: &str) -> Option<Namespace> {
        let (name, hash) = key.rsplit_once('/')?;
        if hash.len() != 32 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let rest = name.strip_prefix("vllm/")?;
        let mut parts = rest.rsplitn(3, '/');
        let (tp, layout, model) = (parts.next()?, parts.next()?, parts.next()?);
        if model.is_empty() || layout.len() != 16 || !layout.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (shard, shards) = tp.strip_prefix("tp")?.split_once("of")?;
        let (shard, shards) = (shard.parse().ok()?, shards.parse().ok()?);
        if shard >= shards {
            return None;
        }
        Some(Namespace {
            name: name.to_owned(),
            model: model.to_owned(),
            layout: layout.to_owned(),
            shard,
            shards,
        })
    }

    /// Block `hash`'s key in this namespace.
    pub fn key(&self, hash: &str) -> String {
        format!("{}/{hash}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connector's own vector (`test_vllm.KeysTest`): a change here is a change there.
    #[test]
    fn a_chain_is_the_connectors() {
        let tokens: Vec<i64> = (-3..37).chain([151_643, 1 << 40]).collect();
        let model = "Qwen/Qwen2.5-0.5B-Instruct";
        assert_eq!(
            chain(&seed(model, "", ""), &tokens, 16),
            ["9bfcbae53e9d0ddc6ce6c83cede95c1f", "0c3f6bc208308c53ff0950b1d31837cf"]
        );
        assert_eq!(
            chain(&seed(model, "tenant-a", "sql-lora"), &tokens, 16),
            ["bf697588ff2f804c88fa754545d6a22c", "f1e666bb50d91c5911ae9ae565d06e5f"]
        );
        assert!(chain(&seed(model, "", ""), &tokens[..15], 16).is_empty());
        assert!(chain(&seed(model, "", ""), &tokens, 0).is_empty());
    }

    #[test]
    fn namespaces_are_read_back_from_keys() {
        let ns = Namespace::of_key("vllm/Qwen/Qwen2.5-0.5B/0123456789abcdef/tp1of2/9bfcbae53e9d0ddc6ce6c83cede95c1f")
            .unwrap();
        assert_eq!(
            (
                ns.name.as_str(),
                ns.model.as_str(),
                ns.layout.as_str(),
                ns.shard,
                ns.shards
            ),
            (
                "vllm/Qwen/Qwen2.5-0.5B/0123456789abcdef/tp1of2",
                "Qwen/Qwen2.5-0.5B",
                "0123456789abcdef",
                1,
                2
            )
        );
        assert_eq!(ns.key("ab"), "vllm/Qwen/Qwen2.5-0.5B/0123456789abcdef/tp1of2/ab");
        let h = "9bfcbae53e9d0ddc6ce6c83cede95c1f";
        for not_ours in [
            format!("sglang/m/0123456789abcdef/tp0of1/{h}"),
            format!("vllm/m/0123456789abcdef/tp2of2/{h}"),
            format!("vllm/m/0123456789abcdef/tp0of1/{}", &h[..31]),
            format!("vllm/m/0123456789abcdeg/tp0of1/{h}"),
            format!("vllm//0123456789abcdef/tp0of1/{h}"),
            format!("vllm/0123456789abcdef/tp0of1/{h}"),
            "vllm/m/0123456789abcdef/tp0of1".to_owned(),
            "a key".to_owned(),
        ] {
            assert_eq!(Namespace::of_key(&not_ours), None, "{not_ours}");
        }
    }
}
