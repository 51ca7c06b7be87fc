//! The rules of a member group's disk tier (`members[].localDisks`): the entry's own fields, what
//! it asks of the group (one tier group per backend, a segment of at least 16Mi, no host path
//! mounted over it), and on update its presence and path, which are frozen per position.

use kvcache_api::backend::{LocalDisk, Managed, MemberGroup, TierEviction};

use super::validation::overlaps;
use crate::field::{ErrorList, Path};
use crate::registry::validation;

/// The longest tier path.
const MAX_PATH: usize = 4096;
/// The smallest segment a group with a tier runs, and the smallest tier capacity.
const FLOOR: i64 = 16 << 20;
/// The smallest key limit.
const MIN_KEY_LIMIT: i64 = 64;

/// A group's `localDisks`: at most one entry, each by its rules; a group with one needs a segment
/// of at least 16Mi, and no host path of the group may be mounted over the tier.
pub fn validate(g: &MemberGroup, p: &Path, errs: &mut ErrorList) {
    let pl = p.child("localDisks");
    if g.local_disks.len() > 1 {
        errs.too_many(&pl, g.local_disks.len(), 1);
    }
    for (i, d) in g.local_disks.iter().enumerate() {
        validate_disk(d, &pl.index(i), errs);
    }
    let Some(disk) = g.local_disks.first() else { return };
    if let Some(q) = &g.capacity_per_member
        && let Some(bytes) = kvcache_units::parse_bytes(q.as_str())
            .ok()
            .and_then(|b| i64::try_from(b).ok())
        && bytes > 0
        && bytes < FLOOR
    {
        errs.invalid(
            &p.child("capacityPerMember"),
            q.as_str(),
            "must be at least 16Mi in a group with a disk tier: the segment holds what is copied to disk and read back",
        );
    }
    if path_problem(&disk.path).is_some() {
        return;
    }
    for (j, hp) in g.host_paths.iter().enumerate() {
        if hp.mount_path.starts_with('/') && overlaps(&hp.mount_path, &disk.path) {
            errs.invalid(
                &p.child("hostPaths").index(j).child("mountPath"),
                &hp.mount_path,
                format!(
                    "overlaps localDisks[0].path {:?}: the tier is mounted there; mount elsewhere",
                    disk.path
                ),
            );
        }
    }
}

fn validate_disk(d: &LocalDisk, p: &Path, errs: &mut ErrorList) {
    let pp = p.child("path");
    if d.path.trim().is_empty() {
        errs.required(&pp, "give the tier's directory on the nodes, e.g. /mnt/nvme/kvcache");
    } else if validation::max_len(&d.path, MAX_PATH, &pp, errs)
        && let Some(why) = path_problem(&d.path)
    {
        errs.invalid(&pp, &d.path, why);
    }
    let mut capacity = 0;
    if let Some(q) = &d.capacity {
        let pc = p.child("capacity");
        if let Some(bytes) = validation::byte_quantity(q, &pc, true, errs) {
            capacity = bytes;
            if bytes > 0 && bytes < FLOOR {
                errs.invalid(
                    &pc,
                    q.as_str(),
                    "must be 0 (the file system's free space) or at least 16Mi",
                );
            }
        }
    }
    if let Some(n) = d.key_limit {
        if n < 0 {
            errs.invalid(&p.child("keyLimit"), n, "must be greater than or equal to 0");
        } else if n > 0 && n < MIN_KEY_LIMIT {
            errs.invalid(&p.child("keyLimit"), n, "must be 0 (no limit) or at least 64");
        }
    }
    if let Some(e) = &d.eviction {
        validate_eviction(e, capacity, p, errs);
    }
}

/// Why a tier path is refused (`None`: it is fine). The path is mounted as typed, so surrounding
/// whitespace is refused rather than trimmed.
fn path_problem(path: &str) -> Option<&'static str> {
    if path.trim().is_empty() {
        return Some("give the tier's directory");
    }
    if path != path.trim_matches([' ', '\t', '\n', '\r']) {
        return Some("must not start or end with whitespace (it is mounted as typed)");
    }
    if !path.starts_with('/') {
        return Some("must be an absolute path");
    }
    if path.split('/').any(|c| c == "..") {
        return Some("must not contain a '..' element");
    }
    if path.split('/').all(|c| c.is_empty() || c == ".") {
        return Some("must not be the root directory");
    }
    if overlaps(path, "/dev/infiniband") {
        return Some("must not be in, be, or contain /dev/infiniband: the operator owns the fabric devices");
    }
    None
}

fn validate_eviction(e: &TierEviction, capacity: i64, p: &Path, errs: &mut ErrorList) {
    let pe = p.child("eviction");
    let off = e.enabled == Some(false);
    if off && e.policy.is_some() {
        errs.forbidden(
            &pe.child("policy"),
            "a policy says what eviction drops; with enabled: false nothing is dropped",
        );
    }
    let Some(w) = &e.watermark else { return };
    let pw = pe.child("watermark");
    if off {
        errs.forbidden(
            &pw,
            "a watermark starts eviction; with enabled: false nothing is dropped",
        );
        return;
    }
    if capacity <= 0 {
        errs.required(
            &p.child("capacity"),
            "a watermark is a share of the capacity: give the tier's capacity",
        );
    }
    let mut marks = [None, None];
    for (slot, (name, v)) in marks.iter_mut().zip([("high", w.high), ("low", w.low)]) {
        match v {
            None => errs.required(&pw.child(name), "give a percentage from 1 to 100"),
            Some(v) if !(1..=100).contains(&v) => {
                errs.invalid(&pw.child(name), v, "must be a percentage from 1 to 100")
            }
            Some(v) => *slot = Some(v),
        }
    }
    if let [Some(high), Some(low)] = marks
        && low >= high
    {
        errs.invalid(
            &pw.child("low"),
            low,
            format!("must be below high ({high}): eviction runs from high down to low"),
        );
    }
}

/// At most one group of a backend has a disk tier: the second one is refused, naming both.
pub fn one_tier_group(m: &Managed, p: &Path, errs: &mut ErrorList) {
    let with: Vec<usize> = (0..m.members.len())
        .filter(|&i| !m.members[i].local_disks.is_empty())
        .collect();
    for &i in with.iter().skip(1) {
        errs.forbidden(
            &p.index(i).child("localDisks"),
            format!(
                "only one member group of a backend may have a disk tier, and members[{}] has one",
                with[0]
            ),
        );
    }
}

/// Presence and path of a group's tier are frozen per position: adding one, removing one and
/// changing its path are refused (a reordering of groups reaches this rule too).
pub fn frozen(new: &Managed, old: &Managed, p: &Path, errs: &mut ErrorList) {
    for (i, (n, o)) in new.members.iter().zip(&old.members).enumerate() {
        let pl = p.index(i).child("localDisks");
        let reorder = "(moving groups reaches this rule too: a group's position is its identity)";
        match (n.local_disks.first(), o.local_disks.first()) {
            (Some(_), None) => errs.forbidden(
                &pl,
                format!("a disk tier cannot be added to an existing member group; append a new group with it {reorder}"),
            ),
            (None, Some(_)) => errs.forbidden(
                &pl,
                format!("a disk tier cannot be removed from a member group; remove the group (the last one) instead {reorder}"),
            ),
            (Some(nd), Some(od)) if nd.path != od.path => errs.forbidden(
                &pl.index(0).child("path"),
                format!(
                    "the tier's path cannot change (it is {:?}): its contents are on the nodes there {reorder}",
                    od.path
                ),
            ),
            _ => {}
        }
    }
}
