use super::*;

#[test]
fn ranges_exclude_writers() {
    let dir = tempfile::tempdir().unwrap();
    let m = SharedMap::create(dir.path(), 1 << 16, true).unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a memfd leaves nothing in the directory"
    );
    let mut w = m.write_range(0, 100).unwrap();
    w.copy_from(&[7u8; 100]).unwrap();
    assert_eq!(w.copy_from(&[7u8; 99]).unwrap_err().code, ErrorCode::InvalidArgument);
    assert_eq!(m.write_range(50, 100).unwrap_err().code, ErrorCode::RangeBusy);
    assert_eq!(m.read_range(99, 1).unwrap_err().code, ErrorCode::RangeBusy);
    let r2 = m.read_range(100, 10).unwrap();
    // pieces stay inside their claim
    w.copy_part(90, &[8u8; 10]).unwrap();
    assert_eq!(w.copy_part(91, &[8u8; 10]).unwrap_err().code, ErrorCode::OutOfRange);
    assert_eq!(
        w.copy_part(u64::MAX, &[8u8; 1]).unwrap_err().code,
        ErrorCode::OutOfRange
    );
    w.copy_part(90, &[7u8; 10]).unwrap();
    let mut piece = [0u8; 10];
    assert_eq!(r2.copy_part(1, &mut piece).unwrap_err().code, ErrorCode::OutOfRange);
    drop(w);
    let r = m.read_range(0, 100).unwrap();
    let r3 = m.read_range(0, 100).unwrap();
    assert!(r.to_vec().iter().all(|b| *b == 7));
    r.copy_part(95, &mut piece[..5]).unwrap();
    assert_eq!(piece[..5], [7u8; 5]);
    assert_eq!(m.write_range(0, 1).unwrap_err().code, ErrorCode::RangeBusy);
    drop((r, r2, r3));
    assert!(m.write_range(0, 1 << 16).is_ok());
    assert_eq!(m.write_range(1, 1 << 16).unwrap_err().code, ErrorCode::OutOfRange);
    assert_eq!(m.write_range(u64::MAX, 2).unwrap_err().code, ErrorCode::OutOfRange);
    assert_eq!(m.read_range(0, 0).unwrap_err().code, ErrorCode::OutOfRange);
    assert_eq!(m.copy_in(u64::MAX, &[1]).unwrap_err().code, ErrorCode::OutOfRange);
    assert_eq!(
        m.copy_out(1 << 16, &mut [0u8; 1]).unwrap_err().code,
        ErrorCode::OutOfRange
    );
}

#[test]
fn a_segment_is_sealed_at_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let m = SharedMap::create(dir.path(), 1 << 16, false).unwrap();
    assert!(m.is_sealed());
    let fd = m.fd().try_clone_to_owned().unwrap();
    let other = File::from(fd);
    assert_eq!(other.set_len(0).unwrap_err().raw_os_error(), Some(libc::EPERM));
    assert_eq!(other.set_len(1 << 17).unwrap_err().raw_os_error(), Some(libc::EPERM));
    m.copy_in(100, b"still here").unwrap();
    let mut back = [0u8; 10];
    m.copy_out(100, &mut back).unwrap();
    assert_eq!(&back, b"still here");
}

#[test]
fn the_file_fallback_is_unlinked() {
    let dir = tempfile::tempdir().unwrap();
    let f = SharedMap::unlinked_file(dir.path()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    f.set_len(4096).unwrap();
    let m = SharedMap::map(f, 4096, false).unwrap();
    m.copy_in(4000, &[9u8; 96]).unwrap();
    let mut back = [0u8; 96];
    m.copy_out(4000, &mut back).unwrap();
    assert_eq!(back, [9u8; 96]);
}

#[test]
fn an_attached_mapping_sees_the_same_bytes_and_no_further() {
    let dir = tempfile::tempdir().unwrap();
    let m = SharedMap::create(dir.path(), 1 << 16, false).unwrap();
    let fd = m.fd().try_clone_to_owned().unwrap();
    let too_long = SharedMap::attach(fd.try_clone().unwrap(), 1 << 17, false);
    assert_eq!(too_long.unwrap_err().kind(), io::ErrorKind::InvalidData);
    let peer = SharedMap::attach(fd, 1 << 16, true).unwrap();
    m.write_range(512, 4).unwrap().copy_from(b"abcd").unwrap();
    let mut got = [0u8; 4];
    peer.copy_out(512, &mut got).unwrap();
    assert_eq!(&got, b"abcd");
    peer.copy_in(1024, b"wxyz").unwrap();
    assert_eq!(m.read_range(1024, 4).unwrap().to_vec(), b"wxyz");
}
