//! Tenant credentials: the secret each KVCachePoolBinding's replicas prove their tenant with on
//! every store call, and where a runtime keeps it. Credentials never enter the API (not in
//! status, not in a spec): the local runtime keeps them in files of mode 0600 under
//! `<data-dir>/tenant-credentials/`, the Kubernetes runtime in a Secret in the Binding's
//! namespace. The leader's ledger holds only their SHA-256 (`controller/ledger.rs`).
//!
//! A rotation moves through three states so that no replica is ever refused and no block is
//! lost (the tenant's name, and so its blocks, never change):
//! 1. [`Rotation::Staged`]: the next credential is minted and put in the ledger beside the
//!    current one; replicas still receive the current one.
//! 2. [`Rotation::Retiring`]: once the leader's ledger holds the next one it becomes current;
//!    replicas roll onto it while the previous one stays in the ledger.
//! 3. [`Rotation::Steady`]: once no replica runs with the previous one, it leaves the ledger.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The environment variable a replica receives its credential in.
pub const ENV: &str = "KVSTORE_CREDENTIAL";

/// The annotation whose new value asks for a Binding's credential to be rotated.
pub const ROTATE_ANNOTATION: &str = "gpustack.ai/credential-rotation";

/// A Binding's credentials, as a runtime keeps them.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantCredentials {
    /// The UID of the Binding they were minted for: a Binding deleted and created again under
    /// the same name gets new ones.
    pub uid: String,
    /// What replicas receive.
    pub current: String,
    /// Where a rotation stands.
    #[serde(default)]
    pub rotation: Rotation,
    /// The value of [`ROTATE_ANNOTATION`] the last rotation answered.
    #[serde(default)]
    pub rotation_request: String,
}

/// Where a rotation stands (see the module's documentation).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Rotation {
    #[default]
    Steady,
    /// Minted and in the ledger; not yet given to replicas.
    Staged { next: String },
    /// Rotated out; in the ledger until no replica runs with it.
    Retiring { previous: String },
}

impl std::fmt::Debug for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rotation::Steady => "Steady",
            Rotation::Staged { .. } => "Staged",
            Rotation::Retiring { .. } => "Retiring",
        })
    }
}

impl std::fmt::Debug for TenantCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCredentials")
            .field("uid", &self.uid)
            .field("current", &fingerprint(&self.current))
            .field("rotation", &self.rotation)
            .field("rotation_request", &self.rotation_request)
            .finish_non_exhaustive()
    }
}

impl TenantCredentials {
    /// Fresh credentials for the Binding `uid`, answering `request`.
    pub fn mint(uid: &str, request: &str) -> TenantCredentials {
        TenantCredentials {
            uid: uid.to_owned(),
            current: super::tokens::fresh(),
            rotation: Rotation::Steady,
            rotation_request: request.to_owned(),
        }
    }

    /// The SHA-256 of every credential a call for this tenant may carry now.
    pub fn hashes(&self) -> Vec<[u8; 32]> {
        let mut out = vec![kvcache_store::auth::sha256(self.current.as_bytes())];
        match &self.rotation {
            Rotation::Steady => {}
            Rotation::Staged { next: other } | Rotation::Retiring { previous: other } => {
                out.push(kvcache_store::auth::sha256(other.as_bytes()));
            }
        }
        out
    }
}

/// A short public name of a credential (the first 8 bytes of its SHA-256, in hex): what a
/// replica is labelled with, so that a runtime can tell which credential it runs with without
/// the credential itself.
pub fn fingerprint(credential: &str) -> String {
    kvcache_store::auth::sha256(credential.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A credential as a replica receives it: the value (an environment variable of the process
/// locally), the Binding whose Secret holds it (in a cluster) and its fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub struct ReplicaCredential {
    pub binding: String,
    pub value: String,
    pub fingerprint: String,
}

impl ReplicaCredential {
    pub fn new(binding: &str, value: &str) -> ReplicaCredential {
        ReplicaCredential {
            binding: binding.to_owned(),
            value: value.to_owned(),
            fingerprint: fingerprint(value),
        }
    }
}

impl std::fmt::Debug for ReplicaCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaCredential")
            .field("binding", &self.binding)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// A Binding, as credentials are keyed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BindingKey {
    pub namespace: String,
    pub name: String,
}

impl BindingKey {
    pub fn new(namespace: &str, name: &str) -> BindingKey {
        BindingKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl std::fmt::Display for BindingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why credentials could not be read or kept.
#[derive(Debug, thiserror::Error)]
#[error("tenant credentials of {binding}: {message}")]
pub struct KeeperError {
    pub binding: String,
    pub message: String,
}

impl KeeperError {
    pub fn new(binding: impl std::fmt::Display, message: impl std::fmt::Display) -> KeeperError {
        KeeperError {
            binding: binding.to_string(),
            message: message.to_string(),
        }
    }
}

/// Where a runtime keeps tenant credentials, outside the API.
#[async_trait]
pub trait Keeper: Send + Sync {
    /// The credentials kept for each of `bindings` (those with none are left out).
    async fn of(&self, bindings: &[BindingKey]) -> Result<HashMap<BindingKey, TenantCredentials>, KeeperError>;
    /// One Binding's.
    async fn get(&self, binding: &BindingKey) -> Result<Option<TenantCredentials>, KeeperError>;
    /// Keeps `c` as the Binding's, replacing what was kept.
    async fn put(&self, binding: &BindingKey, c: &TenantCredentials) -> Result<(), KeeperError>;
    /// Forgets the Binding's credentials (its deletion completes).
    async fn remove(&self, binding: &BindingKey) -> Result<(), KeeperError>;
}

/// Credentials in files: `<dir>/<namespace>/<binding>.json`, mode 0600 in folders of mode 0700,
/// replaced whole (written aside, synced, renamed).
#[derive(Debug)]
pub struct FileKeeper {
    dir: PathBuf,
}

/// The folder under the data directory.
pub const DIR: &str = "tenant-credentials";

impl FileKeeper {
    pub fn new(data_dir: &std::path::Path) -> FileKeeper {
        FileKeeper {
            dir: data_dir.join(DIR),
        }
    }

    fn path(&self, b: &BindingKey) -> PathBuf {
        self.dir.join(&b.namespace).join(format!("{}.json", b.name))
    }

    fn private_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
    }

    fn read(&self, path: &std::path::Path, b: &BindingKey) -> Result<Option<TenantCredentials>, KeeperError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| KeeperError::new(b, format!("{} does not parse: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(KeeperError::new(b, format!("reading {}: {e}", path.display()))),
        }
    }
}

#[async_trait]
impl Keeper for FileKeeper {
    async fn of(&self, bindings: &[BindingKey]) -> Result<HashMap<BindingKey, TenantCredentials>, KeeperError> {
        let mut out = HashMap::new();
        for b in bindings {
            if let Some(c) = self.read(&self.path(b), b)? {
                out.insert(b.clone(), c);
            }
        }
        Ok(out)
    }

    async fn get(&self, binding: &BindingKey) -> Result<Option<TenantCredentials>, KeeperError> {
        self.read(&self.path(binding), binding)
    }

    async fn put(&self, binding: &BindingKey, c: &TenantCredentials) -> Result<(), KeeperError> {
        let path = self.path(binding);
        let write = || -> std::io::Result<()> {
            self.private_dir(&self.dir)?;
            let dir = path.parent().unwrap_or(&self.dir);
            self.private_dir(dir)?;
            let tmp = dir.join(format!(".{}.json.tmp", binding.name));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&serde_json::to_vec(c).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| KeeperError::new(binding, format!("writing {}: {e}", path.display())))
    }

    async fn remove(&self, binding: &BindingKey) -> Result<(), KeeperError> {
        let path = self.path(binding);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(KeeperError::new(binding, format!("removing {}: {e}", path.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_are_private_replaced_whole_and_read_by_binding() {
        let dir = tempfile::tempdir().unwrap();
        let k = FileKeeper::new(dir.path());
        let b = BindingKey::new("team-a", "cache");
        assert!(k.get(&b).await.unwrap().is_none());
        let mut c = TenantCredentials::mint("uid-1", "");
        k.put(&b, &c).await.unwrap();
        let file = dir.path().join(DIR).join("team-a").join("cache.json");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        c.rotation = Rotation::Staged { next: "n".into() };
        k.put(&b, &c).await.unwrap();
        assert_eq!(k.get(&b).await.unwrap(), Some(c.clone()));
        let other = BindingKey::new("team-b", "cache");
        assert_eq!(
            k.of(&[b.clone(), other.clone()]).await.unwrap(),
            HashMap::from([(b.clone(), c)])
        );
        k.remove(&b).await.unwrap();
        k.remove(&b).await.unwrap();
        assert!(k.of(&[b, other]).await.unwrap().is_empty());
    }

    #[test]
    fn a_rotation_puts_both_credentials_in_the_ledger_and_debug_shows_neither() {
        let mut c = TenantCredentials::mint("u", "");
        assert_eq!(c.hashes().len(), 1);
        c.rotation = Rotation::Retiring { previous: "old".into() };
        assert_eq!(c.hashes()[1], kvcache_store::auth::sha256(b"old"));
        assert!(!format!("{c:?}").contains(&c.current));
        assert_eq!(fingerprint("x").len(), 16);
    }
}
