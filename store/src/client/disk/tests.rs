use std::io::Write;

use super::*;
use crate::member::tier::format::ALIGN;

/// A tier file holding, at `record` (a multiple of 4096, zeros before it), the record of `value`
/// under `tag` as the tier writes it; and the Location of a read of it from file number 7.
fn record_in_a_file(value: &[u8], tag: &[u8], record: u64, dead: bool) -> (tempfile::NamedTempFile, Location) {
    let header = Header {
        dead,
        len: value.len() as u64,
        checksum: format::value_checksum(value),
        epoch: 3,
        seal_offset: 0,
        seal: [0; crate::grant::MAC_LEN],
        written_ms: 1,
        tag: tag.to_vec(),
    };
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&vec![0u8; record as usize]).unwrap();
    f.write_all(&header.encode()).unwrap();
    f.write_all(value).unwrap();
    let padded = (header.payload_at() + value.len() as u64).next_multiple_of(ALIGN);
    f.write_all(&vec![0u8; (padded - header.payload_at()) as usize - value.len()])
        .unwrap();
    let loc = Location {
        offset: (7 << 32) | (record / ALIGN),
        len: value.len() as u64,
        tag: tag.to_vec().into(),
        on_disk: true,
        ..Location::default()
    };
    (f, loc)
}

fn value(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn opened(f: &tempfile::NamedTempFile) -> TierFile {
    TierFile {
        file: Arc::new(f.reopen().unwrap()),
        direct: false,
    }
}

#[tokio::test]
async fn a_record_of_several_pieces_lands_whole_in_each_kind_of_sink() {
    let piece = PIECE as usize;
    let v = value(3 * piece + 4321);
    let (f, loc) = record_in_a_file(&v, b"tenant/key", 8192, false);
    let (file, reads) = (opened(&f), DiskReads::default());
    let mut slice = vec![0u8; v.len()];
    assert!(
        read_copy(&file, &loc, &mut Sink::Slice(&mut slice), &reads)
            .await
            .unwrap()
    );
    assert!(slice == v);
    let (mut a, mut b, mut c) = (vec![0u8; 10], vec![0u8; piece + 5], vec![0u8; v.len() - piece - 15]);
    let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
    assert!(
        read_copy(&file, &loc, &mut Sink::Parts(&mut parts), &reads)
            .await
            .unwrap()
    );
    assert!([a, b, c].concat() == v);
    let mut fresh = bytes::BytesMut::new();
    assert!(
        read_copy(&file, &loc, &mut Sink::Fresh(&mut fresh), &reads)
            .await
            .unwrap()
    );
    assert!(fresh[..] == v[..]);
    assert!(reads.buffers.kept() <= KEPT_BUFFERS);
}

/// The file of `f` opened with `O_DIRECT` where its file system allows it (so its reads take the
/// aligned spans the member's do), otherwise as it is.
fn opened_direct(f: &tempfile::NamedTempFile) -> TierFile {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(f.path())
    {
        Ok(file) => TierFile {
            file: Arc::new(file),
            direct: true,
        },
        Err(_) => opened(f),
    }
}

#[tokio::test]
async fn values_ending_on_either_side_of_a_pieces_end_land_whole() {
    let tag = b"tenant/binding/layout/key";
    let header_len = format::payload_at(tag.len()) as usize;
    let piece = PIECE as usize;
    let reads = DiskReads::default();
    for len in [
        0,
        1,
        piece - header_len - 1,
        piece - header_len,
        piece - header_len + 1,
        2 * piece - header_len,
        (WINDOW + 3) * piece + 17,
    ] {
        let v = value(len);
        let (f, loc) = record_in_a_file(&v, tag, 3 * 4096, false);
        for file in [opened(&f), opened_direct(&f)] {
            let mut out = vec![0u8; len];
            assert!(
                read_copy(&file, &loc, &mut Sink::Slice(&mut out), &reads)
                    .await
                    .unwrap(),
                "{len} bytes, O_DIRECT {}",
                file.direct
            );
            assert!(out == v, "{len} bytes, O_DIRECT {}", file.direct);
        }
        // the last byte flipped is seen, whichever piece holds it
        if len > 0 {
            let mut bytes = std::fs::read(f.path()).unwrap();
            bytes[3 * 4096 + header_len + len - 1] ^= 1;
            std::fs::write(f.path(), &bytes).unwrap();
            let mut out = vec![0u8; len];
            assert!(
                !read_copy(&opened_direct(&f), &loc, &mut Sink::Slice(&mut out), &reads)
                    .await
                    .unwrap(),
                "{len} bytes"
            );
        }
    }
    assert!(reads.buffers.kept() <= KEPT_BUFFERS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_at_once_share_the_window_and_each_lands_whole() {
    let reads = DiskReads::default();
    let values: Vec<Vec<u8>> = (0..6).map(|i| value((WINDOW + i) * PIECE as usize + i)).collect();
    let records: Vec<_> = values
        .iter()
        .map(|v| record_in_a_file(v, b"tenant/key", 4096, false))
        .collect();
    let read = records.iter().zip(&values).map(|((f, loc), v)| {
        let reads = &reads;
        async move {
            let mut out = vec![0u8; v.len()];
            let found = read_copy(&opened_direct(f), loc, &mut Sink::Slice(&mut out), reads)
                .await
                .unwrap();
            found && out == *v
        }
    });
    assert!(futures::future::join_all(read).await.into_iter().all(|whole| whole));
    assert_eq!(
        reads.window.available_permits(),
        WINDOW,
        "every piece gave its turn back"
    );
}

#[tokio::test]
async fn a_flipped_byte_another_tag_a_dead_record_or_another_length_is_not_the_value() {
    let v = value(PIECE as usize + 100);
    let mut out = vec![0u8; v.len()];
    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, false);
    assert!(
        read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &DiskReads::default())
            .await
            .unwrap()
    );

    // a byte of the value flipped behind the member's back
    let mut bytes = std::fs::read(f.path()).unwrap();
    bytes[4096 + 10] ^= 1;
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(
        !read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &DiskReads::default())
            .await
            .unwrap()
    );

    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, false);
    let other = Location {
        tag: b"tenant/kez".to_vec().into(),
        ..loc.clone()
    };
    assert!(
        !read_copy(&opened(&f), &other, &mut Sink::Slice(&mut out), &DiskReads::default())
            .await
            .unwrap()
    );
    let mut shorter = vec![0u8; v.len() - 1];
    let short = Location {
        len: loc.len - 1,
        ..loc
    };
    assert!(
        !read_copy(
            &opened(&f),
            &short,
            &mut Sink::Slice(&mut shorter),
            &DiskReads::default()
        )
        .await
        .unwrap()
    );

    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, true);
    assert!(
        !read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &DiskReads::default())
            .await
            .unwrap()
    );

    // a header whose own checksum is wrong
    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, false);
    let mut bytes = std::fs::read(f.path()).unwrap();
    bytes[24] ^= 1;
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(
        !read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &DiskReads::default())
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_file_that_ends_inside_the_record_is_an_error_and_a_short_buffer_too() {
    let v = value(5000);
    let (f, loc) = record_in_a_file(&v, b"t/k", 0, false);
    f.as_file().set_len(format::payload_at(3) + 4000).unwrap();
    let mut out = vec![0u8; 5000];
    let read = read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &DiskReads::default()).await;
    assert_eq!(read.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    let (f, loc) = record_in_a_file(&v, b"t/k", 0, false);
    let mut short = vec![0u8; 4000];
    let read = read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut short), &DiskReads::default()).await;
    assert_eq!(read.unwrap_err().kind(), io::ErrorKind::InvalidData);
}

#[tokio::test(start_paused = true)]
async fn files_are_kept_a_while_from_when_they_were_handed_over_and_at_most_so_many() {
    let f = tempfile::NamedTempFile::new().unwrap();
    let files = TierFiles::default();
    files.keep("@m", 1, opened(&f));
    tokio::time::sleep(FILE_KEEP / 2).await;
    files.keep("@m", 2, opened(&f));
    assert!(files.get("@m", 1).is_some() && files.get("@m", 2).is_some());
    assert!(files.get("@m", 3).is_none() && files.get("@n", 1).is_none());
    tokio::time::sleep(FILE_KEEP / 2).await;
    assert!(
        files.get("@m", 1).is_none(),
        "handed over FILE_KEEP ago: asked for again, however read"
    );
    assert!(files.get("@m", 2).is_some());
    tokio::time::sleep(FILE_KEEP / 2 + Duration::from_secs(2)).await;
    assert_eq!(files.len(), 0, "closed by the task");

    // the task ended with the last file, and starts again with the next
    files.keep("@m", 3, opened(&f));
    tokio::time::sleep(FILE_KEEP + Duration::from_secs(2)).await;
    assert_eq!(files.len(), 0);

    for n in 0..MOST_FILES as u32 {
        files.keep("@m", n, opened(&f));
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    files.keep("@other", 0, opened(&f));
    assert_eq!(files.len(), MOST_FILES);
    assert!(
        files.get("@m", 0).is_none(),
        "the one handed over first is closed first"
    );
    assert!(files.get("@m", 1).is_some() && files.get("@other", 0).is_some());
    files.forget("@m");
    assert_eq!(files.len(), 1);
}
