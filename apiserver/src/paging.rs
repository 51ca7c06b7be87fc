//! Continue tokens of paged lists, the one format for every kind served (ours through the
//! registry, Events and Leases as plain JSON): the revision the first page was read at and the
//! storage key to start after. A later page reads at that same revision, so the pages of one
//! list are one consistent snapshot, as kube-apiserver's are; a token whose revision was
//! compacted since is answered 410 by the caller (a storage `Compacted` error).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// Where the next page starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    /// The revision every page of the list is read at.
    pub rv: u64,
    /// The last key of the previous page.
    pub start: String,
}

/// Why a token cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the continue token is not valid; start a new list without it")]
    Malformed,
    #[error("the continue token belongs to another list; start a new list without it")]
    OtherList,
}

impl ContinueToken {
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    /// The token of a list under `prefix`.
    pub fn decode(token: &str, prefix: &str) -> Result<ContinueToken, TokenError> {
        let t: ContinueToken = URL_SAFE_NO_PAD
            .decode(token)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        if !t.start.starts_with(prefix) {
            return Err(TokenError::OtherList);
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_for_its_own_list_only() {
        let t = ContinueToken {
            rv: 42,
            start: "/registry/events/ns/a".into(),
        };
        let s = t.encode();
        assert_eq!(ContinueToken::decode(&s, "/registry/events/"), Ok(t));
        assert_eq!(
            ContinueToken::decode(&s, "/registry/leases/"),
            Err(TokenError::OtherList)
        );
        assert_eq!(ContinueToken::decode("not base64!", "/"), Err(TokenError::Malformed));
    }
}
