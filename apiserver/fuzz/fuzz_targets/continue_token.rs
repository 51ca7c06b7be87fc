//! A `continue` token from a client, on a paged list of every kind.

#![no_main]

#[path = "common.rs"]
mod common;

use kvcache_apiserver::registry::dynamic::ListParams;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, token)) = data.split_first() else {
        return;
    };
    let Ok(token) = std::str::from_utf8(token) else { return };
    let w = common::world();
    let at = usize::from(pick) % w.resources.len();
    let params = ListParams {
        limit: Some(1 + usize::from(pick >> 4)),
        continue_token: Some(token.to_owned()),
        ..ListParams::default()
    };
    let namespace = if w.objects[at].0.is_empty() {
        None
    } else {
        Some(w.objects[at].0.as_str())
    };
    let _ = w.rt.block_on(w.resources[at].list(namespace, params));
});
