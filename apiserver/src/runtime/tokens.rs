//! The tokens the store's own parts prove themselves with, in local mode: the controllers'
//! token (the leader's Control API takes only calls carrying it) and each backend's member token
//! (its leader mounts only members that show it). Each is a random 256-bit hex word in a file of
//! mode 0600 under `<data-dir>/store-tokens/`, made once and kept across restarts, so the processes
//! the runtime starts read the same files. Nothing here goes into the API.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The folder under the data directory.
pub const DIR: &str = "store-tokens";

/// The file holding token `name` under `data_dir` (made, with a fresh token, when missing) and the
/// token.
pub fn ensure(data_dir: &Path, name: &str) -> std::io::Result<(PathBuf, String)> {
    let dir = data_dir.join(DIR);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let path = dir.join(format!("{name}.token"));
    if let Ok(t) = kvcache_store::auth::read_token(&path) {
        return Ok((path, t));
    }
    let token = fresh();
    let tmp = dir.join(format!(".{name}.token.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(format!("{token}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok((path, token))
}

/// 256 random bits (the system's random source) as 64 hex digits.
pub fn fresh() -> String {
    let mut b = [0u8; 32];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        // uuid's v4 reads the same source; this only gives the failure a second try
        b[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        b[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (path, token) = ensure(dir.path(), "control").unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(dir.path().join(DIR)).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(ensure(dir.path(), "control").unwrap(), (path, token.clone()));
        assert_ne!(ensure(dir.path(), "member-b").unwrap().1, token);
    }
}
