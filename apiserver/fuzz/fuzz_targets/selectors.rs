//! Label and field selectors: parsed, and matched against a fixed object.

#![no_main]

use std::collections::BTreeMap;

use kvcache_apiserver::selectors::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let labels: BTreeMap<String, String> = [("app", "vllm"), ("tier", "cache"), ("x", "")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    if let Ok(s) = LabelSelector::parse(text) {
        let _ = s.is_empty();
        let _ = s.matches(Some(&labels));
        let _ = s.matches(None);
    }
    if let Ok(s) = FieldSelector::parse(text) {
        let _ = s.matches("mooncake-dram", "default");
        let _ = s.exact_name();
    }
});
