//! The threads that read direct reads' pieces off the disk: [`READERS`] of them for the whole
//! member, taking pieces in the order they were asked for.
//!
//! Why a few threads of our own rather than one blocking task per piece: the device reads fastest
//! with a few requests in flight, not dozens (measured on this VM's disk, `O_DIRECT`, 1 MiB
//! requests: 2 to 4 in flight read 1.90 to 2.10 GB/s, 16 to 32 in flight 1.66 to 1.86). Eight
//! readers of 4 MiB values, each asking for eight pieces at once, would put 64 in flight, all
//! eight values finishing together at the end; through these threads the device sees at most
//! [`READERS`], and the values come off it one after the other, each sent while the next is read.
//! A single read has up to `dataport::disk::IN_FLIGHT` of its pieces in flight. A piece takes its
//! buffer only when its turn comes (`direct.rs`), so the pieces waiting hold none.
//!
//! Why pieces of 256 KiB, eight asked for by a read (`dataport/disk.rs`): the device completes
//! requests asked for together in bursts (about 1 MiB every half millisecond here), so a 4 MiB
//! value read as four 1 MiB pieces had a whole 1 MiB piece to send once the device was done. In
//! small pieces, all but the last few go out while the device reads the rest. A probe of 4 MiB
//! reads straight into memory and hashed (this VM, against `dd` in the same run, six rounds
//! each): 1 MiB pieces four at a time 84%, 256 KiB pieces six or eight at a time 92 to 97%. Over
//! TCP, one get at a time went from a median of 64% of `dd` to 87% (30 turns of 8 gets, `dd`
//! reading 32 MiB between turns) with eight threads, and to 96 and 97% with four (87 and 91%
//! with eight in the same alternation: fewer threads wake on two vCPUs, and four 256 KiB
//! requests keep this device busy).
//!
//! The threads end once the [`Readers`] is dropped and the pieces asked for before are read.

use std::future::Future;
use std::sync::Arc;
#[cfg(test)]
use std::sync::Weak;
use std::sync::mpsc;

/// Pieces read at once, on all connections together.
pub const READERS: usize = 4;

type Job = Box<dyn FnOnce() + Send>;

/// A member's disk readers (see the module's doc).
#[derive(Debug)]
pub struct Readers {
    jobs: mpsc::Sender<Job>,
    /// each thread holds a clone until it returns
    #[cfg(test)]
    running: Weak<()>,
}

/// A piece was not read: the readers have stopped (the member is stopping), or its read panicked.
#[derive(Debug, thiserror::Error)]
#[error("the disk tier's readers did not read the piece (stopping, or the read failed)")]
pub struct Stopped;

impl Readers {
    /// Starts `n` reader threads.
    pub fn start(n: usize) -> std::io::Result<Readers> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(parking_lot::Mutex::new(rx));
        let running = Arc::new(());
        for i in 0..n.max(1) {
            let (rx, running) = (rx.clone(), running.clone());
            std::thread::Builder::new()
                .name(format!("kv-tier-read-{i}"))
                .spawn(move || {
                    let _running = running;
                    loop {
                        // the lock is held only while waiting for the next piece
                        let job = rx.lock().recv();
                        match job {
                            // a read that panics loses its answer (its reader sees
                            // `Stopped`), not the thread
                            Ok(read) => {
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
                            }
                            Err(mpsc::RecvError) => return,
                        }
                    }
                })?;
        }
        Ok(Readers {
            jobs: tx,
            #[cfg(test)]
            running: Arc::downgrade(&running),
        })
    }

    /// Asks for `read` to run on a reader thread once the pieces asked for before it are taken
    /// (it is queued now, not when the answer is awaited): its result.
    pub fn read<T, F>(&self, read: F) -> impl Future<Output = Result<T, Stopped>> + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // a reader that gave up waiting does not want the piece
            let _ = tx.send(read());
        });
        let queued = self.jobs.send(job).map_err(|_| Stopped);
        async move {
            queued?;
            rx.await.map_err(|_| Stopped)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_reader_takes_pieces_in_the_order_they_were_asked_for() {
        let readers = Readers::start(1).unwrap();
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let asked: Vec<_> = (0..16)
            .map(|i| {
                let order = order.clone();
                readers.read(move || order.lock().push(i))
            })
            .collect();
        futures::future::try_join_all(asked).await.unwrap();
        assert_eq!(*order.lock(), (0..16).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn no_more_than_the_readers_read_at_once() {
        let readers = Readers::start(READERS).unwrap();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let asked: Vec<_> = (0..4 * READERS)
            .map(|i| {
                let (now, most) = (now.clone(), most.clone());
                readers.read(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    now.fetch_sub(1, Ordering::SeqCst);
                    i
                })
            })
            .collect();
        let got = futures::future::try_join_all(asked).await.unwrap();
        assert_eq!(
            got,
            (0..4 * READERS).collect::<Vec<_>>(),
            "each answer is its own piece's"
        );
        let most = most.load(Ordering::SeqCst);
        assert!((1..=READERS).contains(&most), "{most} read at once");
    }

    #[tokio::test]
    async fn a_read_that_panics_loses_its_answer_and_the_thread_reads_on() {
        let readers = Readers::start(1).unwrap();
        let failed = readers.read(|| -> u32 { panic!("a bug in a read") });
        assert!(matches!(failed.await, Err(Stopped)));
        assert_eq!(readers.read(|| 7).await.unwrap(), 7);
        assert_eq!(readers.running.strong_count(), 1);
    }

    #[tokio::test]
    async fn a_piece_asked_for_before_the_drop_is_read_then_the_threads_end() {
        let readers = Readers::start(2).unwrap();
        let running = readers.running.clone();
        assert_eq!(running.strong_count(), 2);
        let asked = readers.read(|| {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        drop(readers);
        assert_eq!(asked.await.unwrap(), 7);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while running.strong_count() > 0 {
            assert!(std::time::Instant::now() < deadline, "the reader threads did not end");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
