//! Memory the caller registered (`Store.register_buffer(ptr, size)`): the host buffers an engine
//! moves KV blocks from and into. This is the crate's only `unsafe` code: it lends registered
//! ranges to one call as slices, so the store's client sends straight from them and receives
//! straight into them (no copy through memory of ours).
//!
//! Invariant: a slice covers `[ptr, ptr + len)` only when that range lies inside one registered
//! buffer, and a buffer is registered by the caller who owns it with the promise the reference
//! client asks for too: it stays allocated, and nobody else writes it (or, for a range being
//! received into, reads it) while a call that names it runs. Slices live only for that call;
//! ranges received into in one call never overlap, so each byte has at most one `&mut`. A caller
//! that breaks the promise races with the kernel's copy of its own bytes.

use parking_lot::Mutex;

/// A registered range: its start address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    start: usize,
    len: usize,
}

/// Why a range cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unregistered {
    pub ptr: usize,
    pub len: usize,
}

impl std::fmt::Display for Unregistered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes at {:#x} are not inside a buffer registered with register_buffer(ptr, size)",
            self.len, self.ptr
        )
    }
}

/// The registered buffers.
#[derive(Debug, Default)]
pub struct Buffers {
    ranges: Mutex<Vec<Range>>,
}

impl Buffers {
    /// Registers `[ptr, ptr + len)`; a zero pointer, an empty range or one that wraps around is
    /// refused.
    pub fn register(&self, ptr: usize, len: usize) -> Result<(), String> {
        if ptr == 0 || len == 0 || ptr.checked_add(len).is_none() {
            return Err(format!(
                "cannot register {len} bytes at {ptr:#x}: give a live buffer's address and size"
            ));
        }
        self.ranges.lock().push(Range { start: ptr, len });
        Ok(())
    }

    /// Forgets the buffer starting at `ptr`; `false` if none did.
    pub fn unregister(&self, ptr: usize) -> bool {
        let mut r = self.ranges.lock();
        let before = r.len();
        r.retain(|b| b.start != ptr);
        r.len() != before
    }

    fn check(&self, ptr: usize, len: usize) -> Result<(), Unregistered> {
        let end = ptr.checked_add(len).ok_or(Unregistered { ptr, len })?;
        let inside = self
            .ranges
            .lock()
            .iter()
            .any(|b| ptr >= b.start && end <= b.start + b.len);
        if inside && ptr != 0 {
            Ok(())
        } else {
            Err(Unregistered { ptr, len })
        }
    }

    /// The registered bytes at each `(ptr, len)`, to send from, for the length of one call
    /// (a range outside every registered buffer is refused alone).
    pub fn sources(&self, ranges: &[(usize, usize)]) -> Vec<Result<&[u8], Unregistered>> {
        ranges
            .iter()
            .map(|&(ptr, len)| {
                self.check(ptr, len)?;
                // SAFETY: `check` found `[ptr, ptr + len)` inside a registered buffer, which its
                // owner keeps allocated and unwritten while the call naming it runs (module
                // invariant); the slice does not outlive `&self`, and the caller drops it before
                // the call returns to Python.
                #[allow(unsafe_code)]
                Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
            })
            .collect()
    }

    /// The registered bytes at each `(ptr, len)`, to receive into, for the length of one call.
    /// A range outside every registered buffer, or overlapping an earlier range of the same
    /// call, is refused alone, so no byte is reachable through two slices.
    // The memory is not `self`'s: the `&mut`s come from the owner's promise (module invariant)
    // and the overlap check, not from borrowing `self`.
    #[allow(clippy::mut_from_ref)]
    pub fn sinks(&self, ranges: &[(usize, usize)]) -> Vec<Result<&mut [u8], Unregistered>> {
        let mut lent: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
        ranges
            .iter()
            .map(|&(ptr, len)| {
                self.check(ptr, len)?;
                if lent.iter().any(|&(p, l)| ptr < p + l && p < ptr + len) {
                    return Err(Unregistered { ptr, len });
                }
                lent.push((ptr, len));
                // SAFETY: the range lies inside a registered buffer, which its owner keeps
                // allocated and untouched by others while the call runs (module invariant), and
                // it overlaps no other range lent in this call (checked above), so each byte has
                // one `&mut`. The slices do not outlive `&self` and are dropped before the call
                // returns.
                #[allow(unsafe_code)]
                Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) })
            })
            .collect()
    }
}
