//! Units written by people: Kubernetes quantities (`8Gi`, `1e9`, `500m`) and durations (`10s`,
//! `500ms`). The API types and both binaries parse them here, so a value means the same thing in
//! a manifest and on a command line.
//!
//! | module | owns |
//! |---|---|
//! | [`quantity`] | the exact quantity parser, byte counts from quantities, the canonical binary-SI spelling |
//! | [`duration`] | the duration syntax of every flag, and its canonical spelling |

pub mod duration;
pub mod quantity;

pub use duration::{DurationError, format_duration, parse_duration};
pub use quantity::{BytesError, ParsedQuantity, QuantityError, approx_bytes, format_bytes, parse_bytes};
