//! Bearer tokens between the store's own parts: the controllers' token on the leader's Control
//! API, and the backend's member token on its Membership API. A token is read from a file (a
//! mounted Secret in a cluster, a 0600 file under the data directory locally), sent as gRPC
//! metadata `authorization: Bearer <token>`, and kept by the checking side only as its SHA-256,
//! compared in constant time. Tenants prove themselves differently: with the credential in their
//! `Scope` (`leader/ledger.rs`), so that the fast port's frames carry it too.

use std::path::{Path, PathBuf};

use tonic::metadata::{MetadataMap, MetadataValue};

use crate::error::{ErrorCode, Result, StoreError};

/// The metadata key tokens travel in.
pub const AUTHORIZATION: &str = "authorization";

/// Reads a token file: its content without surrounding whitespace, which must not be empty.
pub fn read_token(path: &Path) -> std::result::Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{} is empty; write the token into it", path.display()));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{} holds characters other than printable ASCII; a token is one word, e.g. 64 hex digits",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// What a checking side keeps of a token.
#[derive(Clone, PartialEq, Eq)]
pub struct Expected {
    hash: [u8; 32],
    /// what the token guards, for messages ("the Control API")
    what: &'static str,
    /// the flag that gives the token, for messages ("--control-token-file")
    flag: &'static str,
}

impl std::fmt::Debug for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expected")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

/// Whether two hashes are equal, taking the same time whichever bytes differ.
pub fn same_hash(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The SHA-256 of `b`: what checking sides keep of tokens and credentials.
pub fn sha256(b: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    let mut h = [0u8; 32];
    h.copy_from_slice(d.as_ref());
    h
}

impl Expected {
    pub fn new(token: &str, what: &'static str, flag: &'static str) -> Self {
        Expected {
            hash: sha256(token.as_bytes()),
            what,
            flag,
        }
    }

    /// Loads `flag`'s file, if the flag was given.
    pub fn load(
        path: Option<&PathBuf>,
        what: &'static str,
        flag: &'static str,
    ) -> std::result::Result<Option<Self>, String> {
        path.map(|p| read_token(p).map(|t| Expected::new(&t, what, flag)))
            .transpose()
    }

    /// Refuses a call whose metadata does not carry the token.
    pub fn check(&self, metadata: &MetadataMap) -> Result<()> {
        let presented = metadata
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let Some(token) = presented else {
            return Err(StoreError::new(
                ErrorCode::Unauthenticated,
                format!(
                    "{} takes only calls that carry its token (metadata \"authorization: Bearer …\"), and this one \
                     carries none; callers read it from the file the leader's {} names",
                    self.what, self.flag
                ),
            ));
        };
        if !same_hash(&sha256(token.as_bytes()), &self.hash) {
            return Err(StoreError::new(
                ErrorCode::Unauthenticated,
                format!(
                    "the token this call carries is not the one {} takes ({})",
                    self.what, self.flag
                ),
            ));
        }
        Ok(())
    }
}

/// Adds `token` to a request's metadata.
pub fn attach<T>(req: &mut tonic::Request<T>, token: &str) -> Result<()> {
    let value = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|e| StoreError::new(ErrorCode::InvalidArgument, format!("the token cannot be sent: {e}")))?;
    req.metadata_mut().insert(AUTHORIZATION, value);
    Ok(())
}

/// `msg` as a request carrying `token`, if there is one.
pub fn request<T>(msg: T, token: Option<&str>) -> Result<tonic::Request<T>> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        attach(&mut r, t)?;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(token: Option<&str>) -> MetadataMap {
        let mut req = tonic::Request::new(());
        if let Some(t) = token {
            attach(&mut req, t).unwrap();
        }
        req.metadata().clone()
    }

    #[test]
    fn only_the_token_passes() {
        let e = Expected::new("s3cret", "the Control API", "--control-token-file");
        assert!(e.check(&with(Some("s3cret"))).is_ok());
        let none = e.check(&with(None)).unwrap_err();
        assert_eq!(none.code, ErrorCode::Unauthenticated);
        assert!(none.message.contains("carries none"), "{none}");
        let wrong = e.check(&with(Some("s3cret2"))).unwrap_err();
        assert_eq!(wrong.code, ErrorCode::Unauthenticated);
        assert!(wrong.message.contains("not the one"), "{wrong}");
        assert!(!format!("{e:?}").contains("hash"), "the hash stays out of logs");
    }

    #[test]
    fn token_files_are_one_printable_word() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "  abc123\n").unwrap();
        assert_eq!(read_token(&p).unwrap(), "abc123");
        std::fs::write(&p, "\n").unwrap();
        assert!(read_token(&p).unwrap_err().contains("empty"));
        std::fs::write(&p, "a b").unwrap();
        assert!(read_token(&p).unwrap_err().contains("printable"));
        assert!(read_token(&dir.path().join("absent")).unwrap_err().contains("reading"));
    }
}
