//! The API server's PKI on disk: one CA, a serving certificate for the listen address, and
//! client certificates for the users the server knows in direct mode, plus the kubeconfig files
//! that hand those identities to kubectl.
//!
//! Everything lives in one directory (`<data-dir>/pki`). A missing file is created; an existing
//! one is reused, so a restart keeps every kubeconfig valid. The serving certificate is re-issued
//! (by the same CA) when the set of names it must cover changes. Private keys are written with
//! mode 0600.

mod kubeconfig;

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

pub use kubeconfig::{Kubeconfig, KubeconfigUser};

/// Why the PKI could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}; move the pki directory aside to start with a new CA")]
    Rcgen {
        what: String,
        #[source]
        source: rcgen::Error,
    },
}

/// A user certificate: who the server will see (CN = user, O = groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The file stem: `<name>.crt` and `<name>.key`.
    pub name: &'static str,
    pub user: &'static str,
    pub groups: &'static [&'static str],
}

/// The administrator: may do everything.
pub const ADMIN: Identity = Identity {
    name: "admin",
    user: "kvcache-admin",
    groups: &["system:masters"],
};

/// A read-only user: get, list and watch.
pub const VIEWER: Identity = Identity {
    name: "viewer",
    user: "kvcache-viewer",
    groups: &["gpustack:viewers"],
};

/// The store's processes: leaders campaign for their Lease, Lease-addressed members read it
/// (`coordination.k8s.io` Leases only).
pub const STORE: Identity = Identity {
    name: "store",
    user: "system:kvcache-store",
    groups: &[],
};

/// A certificate and its key, both PEM.
#[derive(Clone, Debug)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The loaded PKI.
#[derive(Clone, Debug)]
pub struct Pki {
    pub dir: PathBuf,
    pub ca: CertPair,
    pub serving: CertPair,
    pub admin: CertPair,
    pub viewer: CertPair,
    pub store: CertPair,
}

impl Pki {
    /// Loads the PKI in `dir`, creating what is missing. `serving_names` are the DNS names and
    /// IP addresses the serving certificate must cover.
    pub fn ensure(dir: &Path, serving_names: &[String]) -> Result<Pki, CertError> {
        fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
        let authority = Authority::from_pair(load_or_create_ca(dir)?)?;

        let mut names: Vec<String> = serving_names.to_vec();
        names.sort();
        names.dedup();
        let names_file = dir.join("serving.names");
        let recorded = fs::read_to_string(&names_file).unwrap_or_default();
        let serving = if recorded == names.join("\n") && dir.join("serving.crt").exists() {
            read_pair(dir, "serving")?
        } else {
            let pair = authority.serving(&names, "kvcache-apiserver")?;
            write_pair(dir, "serving", &pair)?;
            write_file(&names_file, names.join("\n").as_bytes(), 0o644)?;
            pair
        };
        let admin = ensure_client(dir, &ADMIN, &authority)?;
        let viewer = ensure_client(dir, &VIEWER, &authority)?;
        let store = ensure_client(dir, &STORE, &authority)?;
        Ok(Pki {
            dir: dir.to_owned(),
            ca: authority.pair,
            serving,
            admin,
            viewer,
            store,
        })
    }
}

/// A certificate authority in memory, for certificates outside the server's own PKI: an
/// aggregated install's serving certificate and `caBundle` (`kv-apiserver certs`), and the cluster
/// PKI of the test harness (client CA, front-proxy CA, users).
pub struct Authority {
    pub pair: CertPair,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    /// A new self-signed CA named `common_name`, valid for ten years.
    pub fn new(common_name: &str) -> Result<Authority, CertError> {
        Authority::from_pair(new_ca(common_name)?)
    }

    /// The CA in `pair` (PEM certificate and key).
    pub fn from_pair(pair: CertPair) -> Result<Authority, CertError> {
        let key = KeyPair::from_pem(&pair.key_pem).map_err(|e| rcgen_err("reading the CA key", e))?;
        let issuer =
            Issuer::from_ca_cert_pem(&pair.cert_pem, key).map_err(|e| rcgen_err("reading the CA certificate", e))?;
        Ok(Authority { pair, issuer })
    }

    /// A serving certificate for `names` (DNS names and IP addresses), valid for a year.
    pub fn serving(&self, names: &[String], common_name: &str) -> Result<CertPair, CertError> {
        let mut params = leaf_params(names, common_name, &[])?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        issue(&params, &self.issuer)
    }

    /// A client certificate for `user` in `groups` (CN and O), valid for a year.
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<CertPair, CertError> {
        let mut params = leaf_params(&[], user, groups)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        issue(&params, &self.issuer)
    }
}

/// The CA `<stem>.crt`/`<stem>.key` in `dir` (made once, named `common_name`, and kept), for
/// certificates of a PKI other than the server's: the store's (`apiserver/src/runtime/store_tls.rs`).
pub fn authority_in(dir: &Path, stem: &str, common_name: &str) -> Result<Authority, CertError> {
    fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
    Authority::from_pair(load_or_create(dir, stem, common_name)?)
}

/// Writes `pair` as `<stem>.crt` (0644) and `<stem>.key` (0600) in `dir`.
pub fn write_cert_pair(dir: &Path, stem: &str, pair: &CertPair) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
    write_pair(dir, stem, pair)
}

/// The files of an aggregated install, in one directory.
#[derive(Clone, Debug)]
pub struct Install {
    /// `ca.crt`: the APIService's `caBundle`.
    pub ca_pem: String,
    /// `tls.crt` and `tls.key`: the server's serving certificate.
    pub serving: CertPair,
}

/// Writes (or rotates) the certificates of an aggregated install in `dir`: the CA is created once
/// and kept (`ca.crt`, `ca.key`), so a second run issues a new serving certificate (`tls.crt`,
/// `tls.key`) that the same `caBundle` still verifies.
pub fn install(dir: &Path, names: &[String]) -> Result<Install, CertError> {
    fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
    let authority = Authority::from_pair(load_or_create_ca(dir)?)?;
    let serving = authority.serving(names, names.first().map_or("kvcache-apiserver", String::as_str))?;
    write_pair(dir, "tls", &serving)?;
    Ok(Install {
        ca_pem: authority.pair.cert_pem,
        serving,
    })
}

/// The files of the storage's TLS in an aggregated install, next to [`install`]'s: a CA of its
/// own (`etcd-ca.crt`, `etcd-ca.key`, created once and kept), etcd's serving certificate for
/// `names` (`etcd-server.crt`, `.key`) and the API server's client certificate
/// (`etcd-client.crt`, `.key`, CN `kvcache-apiserver`), issued again on every run. etcd takes
/// only clients whose certificate this CA signed.
pub fn install_etcd(dir: &Path, names: &[String]) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| io(dir, source))?;
    let authority = Authority::from_pair(load_or_create(dir, "etcd-ca", "kvcache-etcd-ca")?)?;
    let serving = authority.serving(names, names.first().map_or("kvcache-etcd", String::as_str))?;
    write_pair(dir, "etcd-server", &serving)?;
    write_pair(dir, "etcd-client", &authority.client("kvcache-apiserver", &[])?)?;
    Ok(())
}

/// The DNS names a Service's clients dial: `<service>.<namespace>.svc` is the one kube-apiserver's
/// aggregator verifies, the others are what Pods in the cluster use.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

fn load_or_create_ca(dir: &Path) -> Result<CertPair, CertError> {
    load_or_create(dir, "ca", "kvcache-apiserver-ca")
}

/// The CA `<stem>.crt`/`<stem>.key` in `dir`, created (named `common_name`) when missing.
fn load_or_create(dir: &Path, stem: &str, common_name: &str) -> Result<CertPair, CertError> {
    if dir.join(format!("{stem}.crt")).exists() && dir.join(format!("{stem}.key")).exists() {
        return read_pair(dir, stem);
    }
    let pair = new_ca(common_name)?;
    write_pair(dir, stem, &pair)?;
    Ok(pair)
}

fn new_ca(common_name: &str) -> Result<CertPair, CertError> {
    let key = KeyPair::generate().map_err(|e| rcgen_err("generating the CA key", e))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(common_name, &[]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(3650);
    let cert = params
        .self_signed(&key)
        .map_err(|e| rcgen_err("signing the CA certificate", e))?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn ensure_client(dir: &Path, id: &Identity, ca: &Authority) -> Result<CertPair, CertError> {
    if dir.join(format!("{}.crt", id.name)).exists() {
        return read_pair(dir, id.name);
    }
    let pair = ca.client(id.user, id.groups)?;
    write_pair(dir, id.name, &pair)?;
    Ok(pair)
}

fn leaf_params(names: &[String], common_name: &str, orgs: &[&str]) -> Result<CertificateParams, CertError> {
    let mut params =
        CertificateParams::new(names.to_vec()).map_err(|e| rcgen_err("building certificate parameters", e))?;
    params.distinguished_name = dn(common_name, orgs);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(365);
    Ok(params)
}

fn dn(common_name: &str, orgs: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for org in orgs {
        dn.push(DnType::OrganizationName, *org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

fn issue(params: &CertificateParams, issuer: &Issuer<'_, KeyPair>) -> Result<CertPair, CertError> {
    let key = KeyPair::generate().map_err(|e| rcgen_err("generating a key", e))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| rcgen_err("signing a certificate", e))?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn read_pair(dir: &Path, stem: &str) -> Result<CertPair, CertError> {
    let read = |ext: &str| {
        let path = dir.join(format!("{stem}.{ext}"));
        fs::read_to_string(&path).map_err(|source| io(&path, source))
    };
    Ok(CertPair {
        cert_pem: read("crt")?,
        key_pem: read("key")?,
    })
}

fn write_pair(dir: &Path, stem: &str, pair: &CertPair) -> Result<(), CertError> {
    write_file(&dir.join(format!("{stem}.key")), pair.key_pem.as_bytes(), 0o600)?;
    write_file(&dir.join(format!("{stem}.crt")), pair.cert_pem.as_bytes(), 0o644)
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a crash never leaves a
/// half-written file behind.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertError> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|source| io(&tmp, source))?;
    f.write_all(bytes).map_err(|source| io(&tmp, source))?;
    f.sync_all().map_err(|source| io(&tmp, source))?;
    fs::rename(&tmp, path).map_err(|source| io(path, source))
}

fn io(path: &Path, source: std::io::Error) -> CertError {
    CertError::Io {
        path: path.to_owned(),
        source,
    }
}

fn rcgen_err(what: &str, source: rcgen::Error) -> CertError {
    CertError::Rcgen {
        what: what.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_creates_once_and_reissues_serving_only_when_names_change() {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let a = Pki::ensure(dir.path(), &names).unwrap();
        let b = Pki::ensure(dir.path(), &names).unwrap();
        assert_eq!(a.ca.cert_pem, b.ca.cert_pem);
        assert_eq!(a.serving.cert_pem, b.serving.cert_pem);
        assert_eq!(a.admin.cert_pem, b.admin.cert_pem);
        let c = Pki::ensure(dir.path(), &["localhost".to_owned(), "127.0.0.2".to_owned()]).unwrap();
        assert_eq!(a.ca.cert_pem, c.ca.cert_pem);
        assert_ne!(a.serving.cert_pem, c.serving.cert_pem);
        assert_eq!(a.viewer.cert_pem, c.viewer.cert_pem);
        let mode = std::fs::metadata(dir.path().join("ca.key")).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    }
}
