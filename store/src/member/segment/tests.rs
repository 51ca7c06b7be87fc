use super::*;

#[test]
fn a_grant_kept_past_its_ranges_release_touches_nothing_of_the_next_owner() {
    let (seg, key, _dir) = mounted();
    // tenant A's reservation (allocation 5) is revoked; B's value (allocation 6) is placed
    // at the same offset and written
    let a_write = allocated(&key, Access::Write, 11, 3, 4096, 100, 5);
    let a_read = allocated(&key, Access::Read, 11, 3, 4096, 100, 5);
    seg.begin_write(a_write, 100, &[])
        .unwrap()
        .copy_from(&[1; 100])
        .unwrap();
    let b_write = allocated(&key, Access::Write, 11, 3, 4096, 100, 6);
    seg.begin_write(b_write, 100, &[])
        .unwrap()
        .copy_from(&[2; 100])
        .unwrap();
    let replayed = seg.begin_write(a_write, 100, &[]).map(drop).unwrap_err();
    assert_eq!(replayed.code, ErrorCode::PutExpired, "{replayed}");
    assert_eq!(
        seg.begin_read(a_read, 100).map(drop).unwrap_err().code,
        ErrorCode::LeaseExpired
    );
    let b_read = allocated(&key, Access::Read, 11, 3, 4096, 100, 6);
    assert_eq!(seg.begin_read(b_read, 100).unwrap().to_vec(), vec![2; 100]);
    // a new mount starts a new count: the old table is gone with the old mount's grants
    seg.set_mount(12);
    let fresh = allocated(&key, Access::Write, 12, 3, 4096, 100, 1);
    assert!(seg.begin_write(fresh, 100, &[]).is_ok());
}

#[test]
fn ranges_of_an_older_epoch_are_refused_before_the_mount_is_compared() {
    let (seg, key, _dir) = mounted();
    let write = |mount_id, epoch| signed(&key, Access::Write, mount_id, epoch, 0, 64);
    let read = |mount_id, epoch| signed(&key, Access::Read, mount_id, epoch, 0, 64);
    assert!(seg.begin_write(write(11, 3), 64, &[]).is_ok());
    let stale = seg.begin_write(write(11, 2), 64, &[]).map(drop).unwrap_err();
    assert_eq!(stale.code, ErrorCode::StaleEpoch);
    assert!(
        stale.message.contains("epoch 2") && stale.message.contains("epoch 3"),
        "{stale}"
    );
    assert_eq!(
        seg.begin_read(read(12, 3), 64).map(drop).unwrap_err().code,
        ErrorCode::StaleMount
    );
    // the epoch only rises: an older leader's mount is not accepted
    assert!(!seg.see_epoch(2));
    assert_eq!(seg.epoch(), 3);
    assert!(seg.see_epoch(4));
    assert_eq!(
        seg.begin_read(read(11, 3), 64).map(drop).unwrap_err().code,
        ErrorCode::StaleEpoch
    );
}

pub(crate) fn mounted() -> (Segment, GrantKey, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let seg = Segment::new(SharedMap::create(dir.path(), 1 << 16, false).unwrap());
    seg.set_mount(11);
    assert!(seg.see_epoch(3));
    let key = GrantKey::generate();
    seg.set_grant_key(key.clone());
    (seg, key, dir)
}

fn signed(key: &GrantKey, access: Access, mount_id: u64, epoch: u64, offset: u64, len: u64) -> Grant {
    allocated(key, access, mount_id, epoch, offset, len, 1)
}

pub(crate) fn allocated(
    key: &GrantKey,
    access: Access,
    mount_id: u64,
    epoch: u64,
    offset: u64,
    len: u64,
    allocation: u64,
) -> Grant {
    signed_with(key, access, mount_id, epoch, offset, len, allocation, &[])
}

/// A grant of `allocation`'s range whose MAC also covers `tag` (a write's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn signed_with(
    key: &GrantKey,
    access: Access,
    mount_id: u64,
    epoch: u64,
    offset: u64,
    len: u64,
    allocation: u64,
    tag: &[u8],
) -> Grant {
    let mac = key.sign(
        &Range {
            access,
            mount_id,
            epoch,
            allocation,
            offset,
            len,
            deadline_unix_ms: 0,
        },
        tag,
    );
    Grant {
        mount_id,
        epoch,
        offset,
        allocation,
        deadline_unix_ms: 0,
        mac: crate::grant::mac_from(&mac),
    }
}

#[tokio::test]
async fn a_map_waits_for_the_mount_in_flight_and_a_forged_one_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let seg = std::sync::Arc::new(Segment::new(SharedMap::create(dir.path(), 1 << 16, false).unwrap()));
    let key = GrantKey::generate();
    let granted = signed(&key, Access::Read, 11, 3, 0, 100);
    // nothing mounted and nothing in flight: refused without waiting
    let started = tokio::time::Instant::now();
    assert!(seg.check_map(&granted, 100, &[]).await.is_err());
    assert!(started.elapsed() < MOUNT_WAIT);
    // the leader answered (and handed the range to a client) before this member took the key
    let in_flight = seg.mounting();
    seg.set_mount(11);
    let waiter = {
        let seg = seg.clone();
        tokio::spawn(async move { seg.check_map(&granted, 100, &[]).await })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "a map during a mount in flight waits for it");
    assert!(seg.see_epoch(3));
    seg.set_grant_key(key.clone());
    drop(in_flight);
    waiter.await.unwrap().unwrap();
    // settled: a forged range is refused at once
    let forged = Grant {
        mac: [7; MAC_LEN],
        ..granted
    };
    let started = tokio::time::Instant::now();
    assert_eq!(
        seg.check_map(&forged, 100, &[]).await.unwrap_err().code,
        ErrorCode::Unauthenticated
    );
    assert!(started.elapsed() < MOUNT_WAIT);
}

#[tokio::test]
async fn a_transfer_during_the_mount_in_flight_waits_for_the_leaders_key() {
    let dir = tempfile::tempdir().unwrap();
    let seg = std::sync::Arc::new(Segment::new(SharedMap::create(dir.path(), 1 << 16, false).unwrap()));
    let key = GrantKey::generate();
    let granted = signed(&key, Access::Write, 11, 3, 0, 100);
    // the leader answered the mount and a client got a range before this member has the key
    let in_flight = seg.mounting();
    seg.set_mount(11);
    assert!(seg.see_epoch(3));
    assert_eq!(
        seg.begin_write(granted, 100, &[]).map(drop).unwrap_err().code,
        ErrorCode::StaleMount,
        "unsettled, the range cannot be checked yet"
    );
    let writer = {
        let seg = seg.clone();
        tokio::spawn(async move {
            seg.settle(&granted, Access::Write, 100, &[]).await;
            seg.begin_write(granted, 100, &[]).map(drop)
        })
    };
    tokio::task::yield_now().await;
    assert!(!writer.is_finished(), "the transfer waits for the mount in flight");
    seg.set_grant_key(key.clone());
    drop(in_flight);
    writer.await.unwrap().unwrap();
    // nothing in flight: settling costs nothing
    let started = tokio::time::Instant::now();
    seg.settle(&signed(&key, Access::Read, 12, 3, 0, 100), Access::Read, 100, &[])
        .await;
    assert!(started.elapsed() < MOUNT_WAIT);
}

#[test]
fn only_ranges_the_leader_signed_are_served() {
    let (seg, key, _dir) = mounted();
    let granted = signed(&key, Access::Write, 11, 3, 4096, 100);
    assert!(seg.begin_write(granted, 100, &[]).is_ok());
    let refused = |r: Result<Writing<'_>>| r.map(drop).unwrap_err().code;
    // a forged MAC, a longer range, another offset, a read grant used to write
    let forged = Grant {
        mac: [7; MAC_LEN],
        ..granted
    };
    assert_eq!(refused(seg.begin_write(forged, 100, &[])), ErrorCode::Unauthenticated);
    assert_eq!(refused(seg.begin_write(granted, 101, &[])), ErrorCode::Unauthenticated);
    let moved = Grant { offset: 0, ..granted };
    assert_eq!(refused(seg.begin_write(moved, 100, &[])), ErrorCode::Unauthenticated);
    let read = signed(&key, Access::Read, 11, 3, 4096, 100);
    assert_eq!(refused(seg.begin_write(read, 100, &[])), ErrorCode::Unauthenticated);
    assert!(seg.begin_read(read, 100).is_ok());
    let other_allocation = Grant { allocation: 2, ..read };
    assert_eq!(
        seg.begin_read(other_allocation, 100).map(drop).unwrap_err().code,
        ErrorCode::Unauthenticated,
        "the MAC covers the allocation"
    );
    // another term's key signs nothing this member serves
    let other = signed(&GrantKey::generate(), Access::Read, 11, 3, 4096, 100);
    assert_eq!(
        seg.begin_read(other, 100).map(drop).unwrap_err().code,
        ErrorCode::Unauthenticated
    );
}
