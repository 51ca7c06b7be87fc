//! The TLS flags (`--tls-cert`, `--tls-key`, `--tls-ca`, `--tls-server-name`) and a replica's
//! environment that stands for them, and the configurations they load (`mod.rs`).

use std::path::PathBuf;

use super::{ClientTls, ServerTls};
use crate::flags::ConfigError;

/// The TLS flags of a process that serves store ports (a leader, a member).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ServeFlags {
    /// PEM certificate chain this process serves its TCP ports with (with `--tls-key`); every
    /// port is then TLS only. Without it the ports are plaintext.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The TLS flags of whatever dials a leader or member (a member, `bench`, `tenants`).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct DialFlags {
    /// PEM certificates the leader's and members' certificates must chain to; connections to
    /// them then use TLS, and a peer whose certificate does not verify is refused.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// The name every leader's and member's certificate must carry (with `--tls-ca`); default:
    /// the host dialled.
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// The CA certificates themselves (PEM), instead of `--tls-ca`'s file: a replica's
    /// environment may carry them ([`CA_PEM_ENV`]). Not a flag.
    #[arg(skip)]
    pub tls_ca_pem: Option<String>,
}

/// The environment a replica's client reads TLS from: the CA as a file ([`CA_ENV`], as
/// `--tls-ca`) or inline ([`CA_PEM_ENV`], what injection sets: a CA certificate is public), and
/// the name ([`SERVER_NAME_ENV`], as `--tls-server-name`).
pub const CA_ENV: &str = "KVSTORE_TLS_CA";
pub const CA_PEM_ENV: &str = "KVSTORE_TLS_CA_PEM";
pub const SERVER_NAME_ENV: &str = "KVSTORE_TLS_SERVER_NAME";

impl ServeFlags {
    /// What a process serves with: `None` without `--tls-cert`.
    pub fn server(&self) -> Result<Option<ServerTls>, ConfigError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => ServerTls::load(cert, key).map(Some),
            (None, None) => Ok(None),
            (Some(_), None) => Err(ConfigError::new(
                "tls-key",
                "goes with --tls-cert; give both or neither",
            )),
            (None, Some(_)) => Err(ConfigError::new(
                "tls-cert",
                "goes with --tls-key; give both or neither",
            )),
        }
    }

    /// The flags as a command line (for runtimes that spawn processes).
    pub fn to_args(&self, out: &mut Vec<String>) {
        use crate::flags::push;
        if let Some(p) = &self.tls_cert {
            push(out, "tls-cert", p.display());
        }
        if let Some(p) = &self.tls_key {
            push(out, "tls-key", p.display());
        }
    }
}

impl DialFlags {
    /// What the dialler trusts: `None` without `--tls-ca`.
    pub fn client(&self) -> Result<Option<ClientTls>, ConfigError> {
        match (&self.tls_ca, &self.tls_ca_pem) {
            (Some(ca), _) => ClientTls::load(ca, self.tls_server_name.clone()).map(Some),
            (None, Some(pem)) => ClientTls::from_pem(pem.as_bytes(), self.tls_server_name.clone()).map(Some),
            (None, None) if self.tls_server_name.is_some() => {
                Err(ConfigError::new("tls-server-name", "goes with --tls-ca"))
            }
            (None, None) => Ok(None),
        }
    }

    pub fn to_args(&self, out: &mut Vec<String>) {
        use crate::flags::push;
        if let Some(p) = &self.tls_ca {
            push(out, "tls-ca", p.display());
        }
        if let Some(n) = &self.tls_server_name {
            push(out, "tls-server-name", n);
        }
    }

    /// The same from a replica's environment ([`CA_ENV`], [`SERVER_NAME_ENV`]); errors name the
    /// variable.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        Self {
            tls_ca: get(CA_ENV).map(PathBuf::from),
            tls_server_name: get(SERVER_NAME_ENV),
            tls_ca_pem: get(CA_PEM_ENV),
        }
    }

    /// [`client`](Self::client), with errors naming the environment's variables.
    pub fn client_from_env(&self) -> Result<Option<ClientTls>, String> {
        self.client().map_err(|e| {
            let var = match (e.flag, &self.tls_ca) {
                ("tls-server-name", _) => SERVER_NAME_ENV,
                (_, None) => CA_PEM_ENV,
                _ => CA_ENV,
            };
            format!("{var}: {}", e.message)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_that_cannot_work_are_refused_with_the_flag_named() {
        let (ca, cert, key) = crate::tls::testing::issue("x");
        let dir = tempfile::tempdir().unwrap();
        let write = |n: &str, s: &str| {
            let p = dir.path().join(n);
            std::fs::write(&p, s).unwrap();
            p
        };
        let (ca, cert, key) = (write("ca", &ca), write("cert", &cert), write("key", &key));
        let junk = write("junk", "not pem");
        let dial = DialFlags {
            tls_ca: Some(ca.clone()),
            tls_server_name: Some("x".into()),
            tls_ca_pem: None,
        };
        let ok = ServeFlags {
            tls_cert: Some(cert.clone()),
            tls_key: Some(key.clone()),
        };
        assert!(ok.server().unwrap().is_some() && dial.client().unwrap().is_some());
        assert!(ServeFlags::default().server().unwrap().is_none() && DialFlags::default().client().unwrap().is_none());
        let cases = [
            (
                ServeFlags {
                    tls_cert: Some(junk.clone()),
                    ..ok.clone()
                }
                .server()
                .unwrap_err(),
                "tls-cert",
            ),
            (
                ServeFlags {
                    tls_key: Some(cert.clone()),
                    ..ok.clone()
                }
                .server()
                .unwrap_err(),
                "tls-key",
            ),
            (
                ServeFlags {
                    tls_key: Some(dir.path().join("none")),
                    ..ok.clone()
                }
                .server()
                .unwrap_err(),
                "tls-key",
            ),
            (
                DialFlags {
                    tls_ca: Some(junk.clone()),
                    ..dial.clone()
                }
                .client()
                .unwrap_err(),
                "tls-ca",
            ),
            (
                DialFlags {
                    tls_server_name: Some("a b".into()),
                    ..dial.clone()
                }
                .client()
                .unwrap_err(),
                "tls-server-name",
            ),
        ];
        for (e, flag) in cases {
            assert_eq!(e.flag, flag, "{e}");
        }
        let mut args = Vec::new();
        ok.to_args(&mut args);
        assert_eq!(crate::flags::parse_flags::<ServeFlags, _, _>(&args).unwrap(), ok);
        let mut args = Vec::new();
        dial.to_args(&mut args);
        assert_eq!(crate::flags::parse_flags::<DialFlags, _, _>(&args).unwrap(), dial);
        // a replica's environment
        let env = |k: &str| match k {
            CA_ENV => Some(junk.display().to_string()),
            _ => None,
        };
        let e = DialFlags::from_env(env).client_from_env().unwrap_err();
        assert!(e.starts_with("KVSTORE_TLS_CA: holds no PEM certificate"), "{e}");
        assert_eq!(DialFlags::from_env(|_| Some(String::new())), DialFlags::default());
        // the CA inline, as injection gives it
        let pem = std::fs::read_to_string(&ca).unwrap();
        let inline = DialFlags::from_env(|k| match k {
            CA_PEM_ENV => Some(pem.clone()),
            SERVER_NAME_ENV => Some("x".into()),
            _ => None,
        });
        assert!(inline.client_from_env().unwrap().is_some());
        let e = DialFlags::from_env(|k| (k == CA_PEM_ENV).then(|| "junk".to_owned()))
            .client_from_env()
            .unwrap_err();
        assert!(e.starts_with("KVSTORE_TLS_CA_PEM: "), "{e}");
    }
}
