//! Replay of a log file at start-up.
//!
//! Frames are read in order until the first one that is not intact (bad magic, header checksum,
//! length or payload checksum). What follows decides what that means:
//! - nothing valid after it: a **torn tail** (the last group commit was cut short by a crash; it
//!   was never acknowledged). The damaged bytes are reported so the caller zeroes them;
//! - a valid frame after it (past its payload when its header is intact: values inside a torn
//!   frame may look like frames), or damage inside the snapshot region: a **corrupt middle**.
//!   Records that were acknowledged are unreadable, so the log is refused with an error saying
//!   where.

use super::format::{
    self, DecodedOp, FRAME_ALIGN, FRAME_BATCH, FRAME_HEADER_LEN, FRAME_SNAPSHOT, FileHeader, FrameHeader,
};
use super::index::{Index, Loc};
use super::mmap::LogMap;
use crate::storage::StorageError;

/// The state a log file describes.
pub struct Recovered {
    pub index: Index,
    /// Revision of the last transaction (or of the snapshot when no batch follows it).
    pub revision: u64,
    pub snapshot_revision: u64,
    /// Where the next frame goes.
    pub write_offset: u64,
    /// Bytes of a torn tail to zero: `[start, end)`.
    pub torn: Option<(u64, u64)>,
    pub frames: u64,
}

/// Replays `map` (the whole file). `path` is only for messages.
pub fn replay(map: &LogMap, header: &FileHeader, path: &str) -> Result<Recovered, StorageError> {
    let mut index = Index::default();
    let mut pos = format::FILE_HEADER_LEN;
    let mut revision = header.snapshot_revision;
    let mut frames = 0u64;
    let corrupt = |at: u64, what: String| {
        StorageError::Corrupt(format!(
            "{path}: {what} at offset {at}. Acknowledged writes after this point cannot be read, so \
             the server refuses to start rather than drop them. Restore the data directory from a \
             backup, or move this file aside to start empty"
        ))
    };

    while let Some(h) = intact_frame(map, pos) {
        replay_frame(map, header, &h, pos, &mut index, &mut revision).map_err(|e| corrupt(pos, e))?;
        frames += 1;
        pos += h.frame_len();
    }

    if pos < header.snapshot_end {
        return Err(corrupt(pos, "a damaged frame inside the snapshot region".into()));
    }

    // Anything non-zero from here on is either a torn tail or damage followed by good data.
    let torn = torn_tail(map, pos).map_err(|e| corrupt(pos, e))?;

    Ok(Recovered {
        index,
        revision,
        snapshot_revision: header.snapshot_revision,
        write_offset: pos,
        torn,
        frames,
    })
}

/// Recovers the intact frame `h` at `pos` into `index` (a batch advances `revision`); the error
/// says what is corrupt there.
fn replay_frame(
    map: &LogMap,
    header: &FileHeader,
    h: &FrameHeader,
    pos: u64,
    index: &mut Index,
    revision: &mut u64,
) -> Result<(), String> {
    let payload = map
        .slice(pos + FRAME_HEADER_LEN as u64, h.payload_len as usize)
        .expect("intact_frame checked the bounds");
    let value_base = pos + FRAME_HEADER_LEN as u64;
    match h.kind {
        FRAME_SNAPSHOT => {
            if pos >= header.snapshot_end || h.revision != header.snapshot_revision {
                return Err("a snapshot frame outside the snapshot region".into());
            }
            replay_snapshot(payload, value_base, index)
        }
        FRAME_BATCH => {
            if pos < header.snapshot_end {
                return Err("a batch frame inside the snapshot region".into());
            }
            replay_batch(payload, value_base, index, revision)
        }
        _ => unreachable!("FrameHeader::decode accepts known kinds only"),
    }
}

/// Recovers a snapshot frame's entries (`value_base`: where its payload starts in the file).
fn replay_snapshot(payload: &[u8], value_base: u64, index: &mut Index) -> Result<(), String> {
    format::decode_snapshot(payload, |e| {
        index.recover(
            e.key,
            e.mod_revision,
            Some(e.create_revision),
            Loc::Disk {
                offset: value_base + u64::from(e.value.0),
                len: e.value.1,
            },
        );
    })
}

/// Recovers a batch frame's transactions, each of whose revisions must follow `revision`.
fn replay_batch(payload: &[u8], value_base: u64, index: &mut Index, revision: &mut u64) -> Result<(), String> {
    let mut order_error = None;
    format::decode_batch(payload, |rev, ops: Vec<DecodedOp<'_>>| {
        if rev <= *revision {
            order_error.get_or_insert(format!("revision {rev} does not follow {revision}"));
            return;
        }
        *revision = rev;
        for op in ops {
            let loc = match op.value {
                Some((at, n)) => Loc::Disk {
                    offset: value_base + u64::from(at),
                    len: n,
                },
                None => Loc::Tombstone,
            };
            index.recover(op.key, rev, None, loc);
        }
    })?;
    match order_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The torn tail from `pos` to zero (`[start, end)`), if any byte there is non-zero; an intact
/// frame past the damage is an error instead: a corrupt middle.
fn torn_tail(map: &LogMap, pos: u64) -> Result<Option<(u64, u64)>, String> {
    let Some(first_dirty) = first_nonzero(map, pos) else {
        return Ok(None);
    };
    let len = map.len();
    let mut probe = next_frame_candidate(map, pos);
    let mut dirty_end = pos;
    while probe + FRAME_HEADER_LEN as u64 <= len {
        if intact_frame(map, probe).is_some() {
            return Err(format!("a damaged frame (an intact frame follows at offset {probe})"));
        }
        probe += FRAME_ALIGN;
    }
    if let Some(last) = last_nonzero(map, first_dirty) {
        dirty_end = last + 1;
    }
    Ok(Some((pos, dirty_end.max(first_dirty + 1))))
}

/// Where a frame could next start after the damaged one at `pos`. If its header is intact (a
/// write cut short keeps it: the header goes first), its payload holds values, which may be any
/// bytes, even a valid frame, so the search starts past that payload; else at the next aligned
/// offset.
fn next_frame_candidate(map: &LogMap, pos: u64) -> u64 {
    map.slice(pos, FRAME_HEADER_LEN)
        .and_then(FrameHeader::decode)
        .map_or(pos + FRAME_ALIGN, |h| pos + h.frame_len())
}

/// The header of the frame at `pos` if the whole frame is intact.
fn intact_frame(map: &LogMap, pos: u64) -> Option<FrameHeader> {
    let h = FrameHeader::decode(map.slice(pos, FRAME_HEADER_LEN)?)?;
    let payload = map.slice(pos + FRAME_HEADER_LEN as u64, h.payload_len as usize)?;
    (crc32c::crc32c(payload) == h.payload_crc).then_some(h)
}

fn first_nonzero(map: &LogMap, from: u64) -> Option<u64> {
    const STEP: usize = 1 << 16;
    let mut at = from;
    while at < map.len() {
        let n = ((map.len() - at) as usize).min(STEP);
        let chunk = map.slice(at, n)?;
        if let Some(i) = chunk.iter().position(|b| *b != 0) {
            return Some(at + i as u64);
        }
        at += n as u64;
    }
    None
}

fn last_nonzero(map: &LogMap, from: u64) -> Option<u64> {
    let n = (map.len() - from) as usize;
    let tail = map.slice(from, n)?;
    tail.iter().rposition(|b| *b != 0).map(|i| from + i as u64)
}
