//! The flags of aggregated mode (`serve --auth delegated`), named as kube-apiserver's delegated
//! options, and what they resolve to. Flags of the other mode are refused, never ignored.

use std::path::PathBuf;
use std::time::Duration;

use kvcache_units::parse_duration;

use super::DelegatedOptions;

/// The serving certificate and key files.
pub type ServingFiles = (PathBuf, PathBuf);

/// Who may do what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Our own CA, client certificates and kubeconfig files, and a fixed policy.
    Direct,
    /// Aggregated mode, behind kube-apiserver: users come from its front proxy, the cluster's
    /// client CA and TokenReviews; permissions from SubjectAccessReviews (the cluster's RBAC).
    Delegated,
}

/// The flags of aggregated mode, named as kube-apiserver's delegated options.
#[derive(clap::Args)]
pub struct DelegatedFlags {
    #[arg(long, value_enum, default_value = "direct")]
    pub auth: AuthMode,
    /// With --auth delegated: the cluster, for every review and the authentication ConfigMap
    /// (default: the in-cluster configuration of a Pod).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// With --auth delegated: the cluster for TokenReviews and the ConfigMap (default: --kubeconfig).
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// With --auth delegated: the cluster for SubjectAccessReviews (default: --kubeconfig).
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// How long a TokenReview's answer is remembered.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// How long an allowing SubjectAccessReview is remembered.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long a denying SubjectAccessReview is remembered.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
    /// With --auth delegated: the serving certificate (PEM), reloaded when the file changes.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// With --auth delegated: the serving certificate's key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
}

impl DelegatedFlags {
    /// The delegated options and serving files, or `None` in direct mode; flags of the other
    /// mode are refused, never ignored.
    pub fn resolve(&self) -> Result<Option<(DelegatedOptions, ServingFiles)>, String> {
        let files = self.tls_cert_file.clone().zip(self.tls_private_key_file.clone());
        match self.auth {
            AuthMode::Direct => {
                if self.kubeconfig.is_some()
                    || self.authentication_kubeconfig.is_some()
                    || self.authorization_kubeconfig.is_some()
                    || files.is_some()
                {
                    return Err("--kubeconfig, --authentication-kubeconfig, --authorization-kubeconfig, --tls-cert-file and --tls-private-key-file go with --auth delegated (aggregated mode); direct mode makes its own certificates under --data-dir".into());
                }
                Ok(None)
            }
            AuthMode::Delegated => {
                let Some(files) = files else {
                    return Err("--auth delegated needs --tls-cert-file and --tls-private-key-file: a serving certificate valid for <service>.<namespace>.svc, whose CA is the APIService's caBundle (kv-apiserver certs writes both)".into());
                };
                let mut opts = DelegatedOptions::new();
                opts.authentication_kubeconfig = self.authentication_kubeconfig.clone().or(self.kubeconfig.clone());
                opts.authorization_kubeconfig = self.authorization_kubeconfig.clone().or(self.kubeconfig.clone());
                opts.token_ttl = self.authentication_token_webhook_cache_ttl;
                opts.allow_ttl = self.authorization_webhook_cache_authorized_ttl;
                opts.deny_ttl = self.authorization_webhook_cache_unauthorized_ttl;
                Ok(Some((opts, files)))
            }
        }
    }
}
