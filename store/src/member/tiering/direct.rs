//! Reads straight from the tier to a reader (op 7 on the data port, `dataport.rs`; the leader's
//! `--tier-reads direct`): a copy is opened under the tier's lock and read outside it, piece by
//! piece, hashed as it goes. A copy found missing, unreadable, damaged or another value's is
//! reported lost in the next heartbeat, and as a failed read (the leader counts it against its
//! tenant), as a failed load is, so the leader stops handing it out.

use std::future::Future;

use super::super::tier::{DiskId, Piece, ReadError, Stream};
use super::readers::Stopped;
use super::{TierCounts, Tiering};

/// Piece buffers kept between direct reads (each about a piece, 256 KiB: `dataport/disk.rs`): more
/// than the pieces read at once (`readers::READERS`) and waiting to be sent in a busy moment.
pub const KEPT_BUFFERS: usize = 16;
/// Most pieces of direct reads asked for at once, on all connections together (waiting their
/// turn, read, or waiting to be sent): what readers that do not read can pin is bounded (16 MiB
/// with 256 KiB pieces); past it, reads wait for pieces to be sent.
pub const MAX_PIECES: usize = 64;

impl Tiering {
    /// Opens the copy `disk_id` for a direct read, if its record is live, carries `tag` and holds
    /// `len` bytes (what the leader's grant says). `None` (reported and counted) otherwise: a
    /// record of another value stays (the leader is told only that this value's copy is not
    /// there).
    pub fn open_read(&self, disk_id: u64, tag: &[u8], len: u64) -> Option<Stream> {
        let id = DiskId(disk_id);
        // the tag and length as the record's header had them (the records are the tier's, kept
        // since its scan and each copy)
        let this_value = self.records.lock().get(&disk_id).map(|h| h.tag == tag && h.size == len);
        let opened = match this_value {
            Some(true) => self.tier.lock().stream_known(id),
            Some(false) => {
                // another value's record: the leader's copy is not here, and the record stays
                let failed = TierCounts {
                    failed: 1,
                    ..TierCounts::default()
                };
                self.report_failed(id, failed, false);
                return None;
            }
            None => Err(ReadError::Missing(id)),
        };
        match opened {
            Ok(s) => Some(s),
            Err(e) => {
                self.read_failed(id, e);
                None
            }
        }
    }

    /// Room for one more piece of a direct read in memory, once fewer than [`MAX_PIECES`] are
    /// held: keep it until the piece is sent. Wait for it only holding none (see
    /// [`Tiering::try_piece_room`]).
    pub async fn piece_room(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.pieces
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Room for one more piece now, if there is any and no read waits for room. A read that
    /// holds pieces takes more only this way: one that waited for room while holding some could
    /// wait forever, every piece held by reads waiting likewise, none of them sending (what a
    /// batch of 54 values of three pieces each did: 16 read, the rest stalled until their
    /// grants' deadline).
    pub fn try_piece_room(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.pieces.clone().try_acquire_owned().ok()
    }

    /// Reads a piece ([`Stream::read_piece`]) on the tier's reader threads, after the pieces
    /// asked for before it (`readers.rs`), into a buffer an earlier read gave back (or a new one)
    /// taken only then, so pieces waiting their turn hold none: asked for now, read when awaited.
    pub fn read_piece<F>(&self, read: F) -> impl Future<Output = Result<Result<Piece, ReadError>, Stopped>> + use<F>
    where
        F: FnOnce(Vec<u8>) -> Result<Piece, ReadError> + Send + 'static,
    {
        let kept = self.buffers.clone();
        self.readers.read(move || read(kept.take()))
    }

    /// Keeps a piece's buffer for the next read (at most [`KEPT_BUFFERS`]).
    pub fn give_back(&self, buf: Vec<u8>) {
        self.buffers.give_back(buf);
    }

    /// Counts a direct read of `id` that ended: intact, or what went wrong (reported).
    pub fn read_done(&self, id: DiskId, outcome: Result<(), ReadError>) {
        match outcome {
            Ok(()) => self.add(TierCounts {
                loaded: 1,
                ..TierCounts::default()
            }),
            Err(e) => self.read_failed(id, e),
        }
    }

    fn read_failed(&self, id: DiskId, e: ReadError) {
        let mut counts = TierCounts::default();
        let damaged = match e {
            ReadError::Missing(_) => false,
            ReadError::Damaged { why, .. } => {
                tracing::warn!(disk_id = id.0, %why, "a value on the disk tier is damaged: dropped");
                if let Err(e) = self.tier.lock().kill(id) {
                    tracing::warn!(error = %e, "a damaged copy could not be marked dead");
                }
                true
            }
            ReadError::Tier(e) => {
                tracing::warn!(disk_id = id.0, error = %e, "a value could not be read from the disk tier");
                false
            }
        };
        if damaged {
            counts.damaged += 1;
        } else {
            counts.failed += 1;
        }
        self.report_failed(id, counts, true);
    }

    /// Counts a read of `id` that failed and tells the leader in the next heartbeat (lost, and a
    /// failed read), the record forgotten with it when it was this value's.
    fn report_failed(&self, id: DiskId, counts: TierCounts, forget: bool) {
        self.add(counts);
        if forget {
            self.records.lock().remove(&id.0);
        }
        let mut r = self.report.lock();
        r.lost.push(id.0);
        r.failed_reads.push(id.0);
    }
}
