//! Users from client certificates. TLS verified the chain against our client CA; the leaf's
//! common name (CN) names the user and its organizations (O) are its groups, plus
//! `system:authenticated`, as kube-apiserver's x509 authenticator. The certificate is parsed once
//! per connection and the user kept with it.

use std::sync::OnceLock;

use async_trait::async_trait;
use rustls_pki_types::CertificateDer;

use super::{AuthError, Authenticator, ConnectionInfo, User};

/// A verified client certificate chain, and the user it names once parsed.
#[derive(Debug)]
pub struct ClientCertificate {
    chain: Vec<CertificateDer<'static>>,
    user: OnceLock<Result<User, AuthError>>,
}

impl ClientCertificate {
    pub fn new(chain: Vec<CertificateDer<'static>>) -> ClientCertificate {
        ClientCertificate {
            chain,
            user: OnceLock::new(),
        }
    }

    /// The chain as the client sent it, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The user the leaf certificate names.
    pub fn user(&self) -> Result<User, AuthError> {
        self.user.get_or_init(|| user_of(self.chain.first())).clone()
    }
}

fn user_of(leaf: Option<&CertificateDer<'static>>) -> Result<User, AuthError> {
    let leaf = leaf.ok_or_else(|| AuthError("the client presented an empty certificate chain".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| AuthError(format!("the client certificate cannot be parsed: {e}")))?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| AuthError("the client certificate has no common name (CN), which names the user".into()))?
        .to_owned();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    groups.push("system:authenticated".to_owned());
    Ok(User {
        name,
        groups,
        ..User::default()
    })
}

/// The x509 authenticator.
#[derive(Debug, Default)]
pub struct X509;

#[async_trait]
impl Authenticator for X509 {
    async fn authenticate(&self, _: &http::request::Parts, conn: &ConnectionInfo) -> Result<Option<User>, AuthError> {
        match conn {
            ConnectionInfo::Tls { client: Some(cert), .. } => cert.user().map(Some),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_groups_come_from_the_subject() {
        let pki = tempfile::tempdir().unwrap();
        let p = kvcache_certs::Pki::ensure(pki.path(), &["localhost".to_owned()]).unwrap();
        let der: Vec<CertificateDer<'static>> =
            rustls_pki_types::pem::PemObject::pem_slice_iter(p.admin.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let user = ClientCertificate::new(der).user().unwrap();
        assert_eq!(user.name, "kvcache-admin");
        assert!(user.in_group("system:masters") && user.in_group("system:authenticated"));
        assert!(ClientCertificate::new(Vec::new()).user().is_err());
    }
}
