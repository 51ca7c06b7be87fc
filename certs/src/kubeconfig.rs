//! kubeconfig files: one cluster, one user with an embedded client certificate, one context.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::{CertError, CertPair};

/// The user of a kubeconfig.
#[derive(Clone, Debug)]
pub struct KubeconfigUser<'a> {
    /// The name of the user entry (and of the context).
    pub name: &'a str,
    pub credentials: &'a CertPair,
}

/// A kubeconfig with one cluster, user and context.
#[derive(Clone, Debug)]
pub struct Kubeconfig<'a> {
    /// `https://127.0.0.1:6443`.
    pub server: &'a str,
    pub ca_pem: &'a str,
    pub user: KubeconfigUser<'a>,
}

impl Kubeconfig<'_> {
    /// The YAML text. Every value is base64 or a plain name, so no quoting is needed.
    pub fn render(&self) -> String {
        let b64 = |s: &str| STANDARD.encode(s.as_bytes());
        let user = self.user.name;
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: kvcache\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
             users:\n\
             - name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
             contexts:\n\
             - name: {user}@kvcache\n  context:\n    cluster: kvcache\n    user: {user}\n    namespace: default\n\
             current-context: {user}@kvcache\n",
            server = self.server,
            ca = b64(self.ca_pem),
            cert = b64(&self.user.credentials.cert_pem),
            key = b64(&self.user.credentials.key_pem),
        )
    }

    /// Writes the file with mode 0600 (it holds a private key).
    pub fn write(&self, path: &Path) -> Result<(), CertError> {
        crate::write_file(path, self.render().as_bytes(), 0o600)
    }
}
