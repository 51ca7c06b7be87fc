//! A MessagePack reader for what vLLM's KV events carry (`engine_events.rs`): nil, booleans,
//! integers, floats, strings, binary, arrays and maps; extension types are refused. Bounded, so
//! broken or hostile bytes give an [`Error`], never a panic, a stack overflow or an allocation
//! larger than the input: nesting stops at [`MAX_DEPTH`], and every declared length is checked
//! against the bytes left before anything is allocated.

/// Deepest nesting of arrays and maps read.
pub const MAX_DEPTH: usize = 32;

/// A decoded value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Every integer that fits an i64.
    Int(i64),
    /// Positive integers above `i64::MAX`.
    UInt(u64),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value under string key `key` of a map.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(m) => m.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why bytes are not one MessagePack value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the bytes end inside a value (at byte {0})")]
    Truncated(usize),
    #[error("byte {at}: 0x{byte:02x} starts no value this reader takes (an extension or a reserved byte)")]
    Unsupported { at: usize, byte: u8 },
    #[error("values nest deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("a string that is not UTF-8 (at byte {0})")]
    NotUtf8(usize),
    #[error("{0} bytes follow the value")]
    Trailing(usize),
}

/// Reads `bytes` as exactly one value.
pub fn decode(bytes: &[u8]) -> Result<Value, Error> {
    let mut r = Reader { bytes, at: 0 };
    let v = r.value(0)?;
    match bytes.len() - r.at {
        0 => Ok(v),
        n => Err(Error::Trailing(n)),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Error> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or(Error::Truncated(self.bytes.len()))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, Error> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// A length of `n` bytes, which at least `n * per_item` bytes must still follow.
    fn len(&mut self, n: usize, per_item: usize) -> Result<usize, Error> {
        let len = usize::try_from(self.be(n)?).map_err(|_| Error::Truncated(self.bytes.len()))?;
        let left = self.bytes.len() - self.at;
        if len.checked_mul(per_item).is_none_or(|need| need > left) {
            return Err(Error::Truncated(self.bytes.len()));
        }
        Ok(len)
    }

    fn value(&mut self, depth: usize) -> Result<Value, Error> {
        let at = self.at;
        let b = self.take(1)?[0];
        Ok(match b {
            0x00..=0x7f => Value::Int(i64::from(b)),
            0xe0..=0xff => Value::Int(i64::from(b as i8)),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xcc..=0xcf => {
                let u = self.be(1 << (b - 0xcc))?;
                i64::try_from(u).map_or(Value::UInt(u), Value::Int)
            }
            0xd0..=0xd3 => {
                let n = 1usize << (b - 0xd0);
                let u = self.be(n)?;
                let shift = 64 - 8 * n as u32;
                Value::Int(((u << shift) as i64) >> shift)
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xa0..=0xbf => self.str(usize::from(b & 0x1f), at)?,
            0xd9..=0xdb => {
                let n = self.len(1 << (b - 0xd9), 1)?;
                self.str(n, at)?
            }
            0xc4..=0xc6 => {
                let n = self.len(1 << (b - 0xc4), 1)?;
                Value::Bin(self.take(n)?.to_vec())
            }
            0x90..=0x9f => self.array(usize::from(b & 0x0f), depth)?,
            0xdc | 0xdd => {
                let n = self.len(if b == 0xdc { 2 } else { 4 }, 1)?;
                self.array(n, depth)?
            }
            0x80..=0x8f => self.map(usize::from(b & 0x0f), depth)?,
            0xde | 0xdf => {
                let n = self.len(if b == 0xde { 2 } else { 4 }, 2)?;
                self.map(n, depth)?
            }
            _ => return Err(Error::Unsupported { at, byte: b }),
        })
    }

    fn str(&mut self, n: usize, at: usize) -> Result<Value, Error> {
        let s = self.take(n)?;
        std::str::from_utf8(s)
            .map(|s| Value::Str(s.to_owned()))
            .map_err(|_| Error::NotUtf8(at))
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value, Error> {
        if depth >= MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        let mut items = Vec::with_capacity(n.min(self.bytes.len() - self.at));
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value, Error> {
        if depth >= MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        let mut entries = Vec::with_capacity(n.min(self.bytes.len() - self.at));
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            entries.push((k, v));
        }
        Ok(Value::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back() {
        let cases: &[(&[u8], Value)] = &[
            (&[0xc0], Value::Nil),
            (&[0xc3], Value::Bool(true)),
            (&[0x7f], Value::Int(127)),
            (&[0xff], Value::Int(-1)),
            (&[0xcc, 0xff], Value::Int(255)),
            (&[0xcd, 0x01, 0x00], Value::Int(256)),
            (&[0xd0, 0x80], Value::Int(-128)),
            (&[0xd1, 0xff, 0x00], Value::Int(-256)),
            (&[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe], Value::Int(-2)),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Value::UInt(u64::MAX),
            ),
            (&[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0], Value::Float(1.5)),
            (&[0xa2, b'h', b'i'], Value::Str("hi".into())),
            (&[0xd9, 0x01, b'x'], Value::Str("x".into())),
            (&[0xc4, 0x02, 1, 2], Value::Bin(vec![1, 2])),
            (&[0x92, 0x01, 0xc0], Value::Array(vec![Value::Int(1), Value::Nil])),
            (
                &[0x81, 0xa1, b'k', 0x02],
                Value::Map(vec![(Value::Str("k".into()), Value::Int(2))]),
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(decode(bytes).as_ref(), Ok(want), "{bytes:02x?}");
        }
    }

    #[test]
    fn broken_bytes_are_errors_not_panics() {
        assert_eq!(decode(&[]), Err(Error::Truncated(0)));
        assert_eq!(decode(&[0xcd, 0x01]), Err(Error::Truncated(2)));
        assert_eq!(decode(&[0xc0, 0xc0]), Err(Error::Trailing(1)));
        assert_eq!(decode(&[0xc1]), Err(Error::Unsupported { at: 0, byte: 0xc1 }));
        assert_eq!(
            decode(&[0xd4, 0x01, 0x02]),
            Err(Error::Unsupported { at: 0, byte: 0xd4 })
        );
        assert_eq!(decode(&[0xa1, 0xff]), Err(Error::NotUtf8(0)));
        // a declared length far past the bytes allocates nothing
        assert_eq!(decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]), Err(Error::Truncated(5)));
        assert_eq!(decode(&[0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0]), Err(Error::Truncated(6)));
        assert_eq!(decode(&[0xc6, 0xff, 0xff, 0xff, 0xff]), Err(Error::Truncated(5)));
        // nesting as deep as the input allows stops at the bound
        assert_eq!(decode(&vec![0x91; 100_000]), Err(Error::TooDeep));
        let mut ok = vec![0x91; MAX_DEPTH];
        ok.push(0xc0);
        assert!(decode(&ok).is_ok());
    }
}
