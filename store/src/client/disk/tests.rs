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
    let v = value(3 * PIECE + 4321);
    let (f, loc) = record_in_a_file(&v, b"tenant/key", 8192, false);
    let (file, buffers) = (opened(&f), Buffers::default());
    let mut slice = vec![0u8; v.len()];
    assert!(
        read_copy(&file, &loc, &mut Sink::Slice(&mut slice), &buffers)
            .await
            .unwrap()
    );
    assert!(slice == v);
    let (mut a, mut b, mut c) = (vec![0u8; 10], vec![0u8; PIECE + 5], vec![0u8; v.len() - PIECE - 15]);
    let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
    assert!(
        read_copy(&file, &loc, &mut Sink::Parts(&mut parts), &buffers)
            .await
            .unwrap()
    );
    assert!([a, b, c].concat() == v);
    let mut fresh = bytes::BytesMut::new();
    assert!(
        read_copy(&file, &loc, &mut Sink::Fresh(&mut fresh), &buffers)
            .await
            .unwrap()
    );
    assert!(fresh[..] == v[..]);
    assert!(buffers.kept() <= KEPT_BUFFERS);
}

#[tokio::test]
async fn a_flipped_byte_another_tag_a_dead_record_or_another_length_is_not_the_value() {
    let v = value(PIECE + 100);
    let mut out = vec![0u8; v.len()];
    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, false);
    assert!(
        read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &Buffers::default())
            .await
            .unwrap()
    );

    // a byte of the value flipped behind the member's back
    let mut bytes = std::fs::read(f.path()).unwrap();
    bytes[4096 + 10] ^= 1;
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(
        !read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &Buffers::default())
            .await
            .unwrap()
    );

    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, false);
    let other = Location {
        tag: b"tenant/kez".to_vec().into(),
        ..loc.clone()
    };
    assert!(
        !read_copy(&opened(&f), &other, &mut Sink::Slice(&mut out), &Buffers::default())
            .await
            .unwrap()
    );
    let mut shorter = vec![0u8; v.len() - 1];
    let short = Location {
        len: loc.len - 1,
        ..loc
    };
    assert!(
        !read_copy(&opened(&f), &short, &mut Sink::Slice(&mut shorter), &Buffers::default())
            .await
            .unwrap()
    );

    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, true);
    assert!(
        !read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &Buffers::default())
            .await
            .unwrap()
    );

    // a header whose own checksum is wrong
    let (f, loc) = record_in_a_file(&v, b"tenant/key", 0, false);
    let mut bytes = std::fs::read(f.path()).unwrap();
    bytes[24] ^= 1;
    std::fs::write(f.path(), &bytes).unwrap();
    assert!(
        !read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &Buffers::default())
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
    let read = read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut out), &Buffers::default()).await;
    assert_eq!(read.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    let (f, loc) = record_in_a_file(&v, b"t/k", 0, false);
    let mut short = vec![0u8; 4000];
    let read = read_copy(&opened(&f), &loc, &mut Sink::Slice(&mut short), &Buffers::default()).await;
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
