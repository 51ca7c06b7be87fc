//! Users from client certificates of the cluster's client CA (`client-ca-file` of the
//! extension-apiserver-authentication ConfigMap, reloaded with it): CN is the user, O the groups,
//! as kube-apiserver's own x509 authenticator.

use async_trait::async_trait;

use super::extension::Source;
use crate::auth::{AuthError, Authenticator, ConnectionInfo, User};

#[derive(Debug)]
pub struct ClientCa {
    source: Source,
}

impl ClientCa {
    pub fn new(source: Source) -> ClientCa {
        ClientCa { source }
    }
}

#[async_trait]
impl Authenticator for ClientCa {
    async fn authenticate(&self, _: &http::request::Parts, conn: &ConnectionInfo) -> Result<Option<User>, AuthError> {
        let ConnectionInfo::Tls { client: Some(cert), .. } = conn else {
            return Ok(None);
        };
        let auth = self.source.current();
        let Some(ca) = &auth.client_ca else {
            return Err(AuthError(
                "the cluster publishes no client CA (client-ca-file in kube-system/extension-apiserver-authentication), so client certificates cannot be verified".into(),
            ));
        };
        ca.verify(cert.chain()).map_err(|e| {
            AuthError(format!(
                "the client certificate is not one of the cluster's client CA: {e}"
            ))
        })?;
        let mut user = cert.user()?;
        super::authenticated(&mut user);
        Ok(Some(user))
    }
}
