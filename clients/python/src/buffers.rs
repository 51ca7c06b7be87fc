//! Memory the caller registered (`Store.register_buffer(ptr, size)`): the host buffers an engine
//! moves KV blocks from and into. This is the crate's only `unsafe` code, and all of it is two
//! raw copies.
//!
//! Invariant: a copy touches `[ptr, ptr + len)` only when that range lies inside one registered
//! buffer, and a buffer is registered by the caller who owns it with the promise the reference
//! client asks for too: it stays allocated and is not written by anyone else while a call that
//! names it runs. The copies are `ptr::copy_nonoverlapping` between that foreign memory and
//! memory this crate owns; no Rust reference to the foreign memory is ever made, so a caller
//! breaking the promise can corrupt its own bytes but not this process's references.

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

    /// A copy of `len` registered bytes at `ptr`.
    pub fn read(&self, ptr: usize, len: usize) -> Result<Vec<u8>, Unregistered> {
        self.check(ptr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: `check` found `[ptr, ptr + len)` inside a registered buffer, which the caller
        // keeps allocated and unwritten during the call (module invariant); `out` is ours, `len`
        // bytes long, and cannot overlap foreign memory.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), len);
        }
        Ok(out)
    }

    /// Copies `bytes` to the registered memory at `ptr` (at most `capacity` bytes there).
    pub fn write(&self, ptr: usize, capacity: usize, bytes: &[u8]) -> Result<(), Unregistered> {
        if bytes.len() > capacity {
            return Err(Unregistered { ptr, len: bytes.len() });
        }
        self.check(ptr, bytes.len())?;
        // SAFETY: `check` found `[ptr, ptr + bytes.len())` inside a registered buffer, which the
        // caller keeps allocated and untouched by others during the call (module invariant);
        // `bytes` is memory this crate owns and cannot overlap it.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len());
        }
        Ok(())
    }
}
