//! A patch of a walkthrough object, as the patch handler reads it: the first byte picks the
//! kind, the patch type (JSON patch, merge patch, strategic merge patch, apply), the
//! subresource and whether apply forces; the rest is the body. Dry runs.

#![no_main]

#[path = "common.rs"]
mod common;

use kvcache_apiserver::decode::{FieldValidation, bounded};
use kvcache_apiserver::registry::fieldmanager::Part;
use kvcache_apiserver::registry::patch::{self, Patch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let w = common::world();
    let at = usize::from(pick) % w.resources.len();
    let p = match (pick >> 2) % 4 {
        0 => {
            let Ok(parsed) = bounded::json(body) else { return };
            let Ok(ops) = serde_json::from_value(parsed.value) else {
                return;
            };
            Patch::Json(ops)
        }
        1 => {
            let Ok(parsed) = bounded::json(body) else { return };
            Patch::Merge(parsed)
        }
        2 => {
            let Ok(parsed) = bounded::json(body) else { return };
            let Ok(p) = patch::strategic(parsed) else { return };
            p
        }
        _ => {
            let Ok(text) = std::str::from_utf8(body) else { return };
            let Ok(parsed) = bounded::yaml(text) else { return };
            Patch::Apply(parsed)
        }
    };
    let part = if pick & 0x10 != 0 { Part::Status } else { Part::Main };
    let mut params = common::params(true, FieldValidation::Strict);
    params.force = pick & 0x20 != 0;
    let (namespace, name) = &w.objects[at];
    let _ = w.rt.block_on(w.resources[at].patch(namespace, name, p, part, &params));
});
