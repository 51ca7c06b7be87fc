//! A request body, decoded into a kind and admitted as a dry-run create: the first byte picks
//! the kind, JSON or YAML, and the field validation; the rest is the body.

#![no_main]

#[path = "common.rs"]
mod common;

use kvcache_apiserver::decode::bounded;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let w = common::world();
    let at = usize::from(pick) % w.resources.len();
    let parsed = if pick & 0x10 != 0 {
        let Ok(text) = std::str::from_utf8(body) else { return };
        bounded::yaml(text)
    } else {
        bounded::json(body)
    };
    let Ok(parsed) = parsed else { return };
    let namespace = w.objects[at].0.clone();
    let params = common::params(true, common::validation(pick >> 5));
    let _ = w.rt.block_on(w.resources[at].create(&namespace, parsed, &params));
});
