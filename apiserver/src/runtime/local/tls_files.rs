//! The store's TLS in local mode (`runtime/store_tls.rs`): the store's CA in
//! `<data-dir>/store-tls/ca.crt` and `ca.key` (made once, kept), and each backend's certificate in
//! `<data-dir>/store-tls/<backend>/`, issued at the backend's first plan in this process.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::runtime::store_tls::StoreCa;

/// A backend's certificate, its key and the CA, as files its processes are given.
#[derive(Clone, Debug)]
pub struct BackendFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The CA and the certificates issued so far.
#[derive(Debug)]
pub struct TlsFiles {
    root: PathBuf,
    /// `None` if the CA could not be made (logged: the stores then run in plaintext)
    ca: Option<StoreCa>,
    /// the backends whose certificate this process issued
    issued: Mutex<HashSet<String>>,
}

impl TlsFiles {
    /// The CA under `root`, made when missing.
    pub fn new(root: &Path) -> TlsFiles {
        let ca = kvcache_certs::authority_in(root, "ca", "kvcache-store-ca")
            .inspect_err(|e| tracing::error!(error = %e, "cannot make the store's CA; stores will run in plaintext"))
            .ok()
            .map(StoreCa::new);
        TlsFiles {
            root: root.to_owned(),
            ca,
            issued: Mutex::default(),
        }
    }

    /// `backend`'s files, its certificate issued first if this process has not yet (`None`,
    /// logged, if they cannot be written: the store then runs in plaintext).
    pub fn backend(&self, backend: &str) -> Option<BackendFiles> {
        let ca = self.ca.as_ref()?;
        let dir = self.root.join(backend);
        let files = BackendFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: self.root.join("ca.crt"),
        };
        if self.issued.lock().contains(backend) {
            return Some(files);
        }
        let written = ca
            .issue(backend)
            .and_then(|pair| kvcache_certs::write_cert_pair(&dir, "tls", &pair));
        match written {
            Ok(()) => {
                self.issued.lock().insert(backend.to_owned());
                Some(files)
            }
            Err(e) => {
                tracing::error!(%backend, error = %e, "cannot write the store's certificate; it will run in plaintext");
                None
            }
        }
    }

    /// What dials `backend`'s store.
    pub fn client(&self, backend: &str) -> Option<kvcache_store::tls::ClientTls> {
        self.ca.as_ref()?.client(backend)
    }

    /// The CA certificate, which engines trust.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca.as_ref().map(|c| c.ca_pem().to_owned())
    }
}
