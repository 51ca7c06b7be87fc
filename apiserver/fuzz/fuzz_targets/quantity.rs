//! Quantities (`8Gi`, `1.5e3`, `100m`): parsed, converted and compared.

#![no_main]

use kvcache_api::quantity::{ParsedQuantity, Quantity};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(q) = Quantity::new(text).parse() {
        let _ = (q.is_zero(), q.is_negative(), q.is_positive());
        let _ = q.to_i64_ceil();
        let _ = q.to_whole_i64();
        let _ = q.as_f64();
        let one = ParsedQuantity::parse("1Gi").expect("a quantity");
        let _ = q.cmp_value(&one);
        if let Some(bytes) = q.to_whole_i64() {
            let _ = Quantity::from_bytes(bytes).parse();
        }
    }
    let _ = kvcache_units::quantity::parse_bytes(text);
});
