//! The tokens, keys and certificate a backend's Pods mount: where each lives in the store's
//! fixed-name Secrets ([`TOKENS_SECRET`], [`TLS_SECRET`], keys `<backend>.<file>`), the projected
//! volumes that mount them read-only, and where the processes read them.

use serde_json::{Value, json};

/// Where the leader and members read their tokens in their Pods.
pub const TOKENS_DIR: &str = "/etc/gpustack/kvcache/tokens";

/// Where the leader and members read their certificate, key and the store's CA.
pub const TLS_DIR: &str = "/etc/gpustack/kvcache/tls";
/// The keys of a backend's certificate Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";
pub const TLS_CA_KEY: &str = "ca.crt";

/// The Secret (in the store's namespace) of every backend's certificate.
pub const TLS_SECRET: &str = "kvcache-store-tls";
/// The Secret (in the store's namespace) of every backend's tokens and seal key.
pub const TOKENS_SECRET: &str = "kvcache-store-tokens";

/// The key of `backend`'s `file` (a certificate file or a token's) in its Secret.
pub fn backend_key(backend: &str, file: &str) -> String {
    format!("{backend}.{file}")
}

pub(super) fn tls_file(key: &str) -> std::path::PathBuf {
    std::path::Path::new(TLS_DIR).join(key)
}

/// The volume of the backend's certificate, read-only to the owner and (`fsGroup`) the group.
pub(super) fn tls_volume(backend: &str) -> Value {
    let items: Vec<Value> = [TLS_CERT_KEY, TLS_KEY_KEY, TLS_CA_KEY]
        .iter()
        .map(|f| json!({"key": backend_key(backend, f), "path": f}))
        .collect();
    json!({"name": "store-tls", "projected": {"defaultMode": 0o400, "sources": [
        {"secret": {"name": TLS_SECRET, "items": items}},
    ]}})
}

pub(super) fn tls_mount() -> Value {
    json!({"name": "store-tls", "mountPath": TLS_DIR, "readOnly": true})
}

pub(super) fn serve_tls() -> kvcache_store::tls::ServeFlags {
    kvcache_store::tls::ServeFlags {
        tls_cert: Some(tls_file(TLS_CERT_KEY)),
        tls_key: Some(tls_file(TLS_KEY_KEY)),
    }
}

/// A backend's own tokens and keys, each a key `<backend>.<file>` of the Secret [`TOKENS_SECRET`]
/// (256 random bits each, made by the runtime, removed with the backend). None is shared between
/// backends, so a token read from one backend's Pods opens nothing of another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Token {
    /// what the leaders' Control API takes: the controllers read it back to call it
    Control,
    /// what `/metrics` shows the per-tenant series to (Prometheus' credentials file); it opens
    /// nothing else
    Metrics,
    /// what the leader mounts only members that show
    Member,
    /// what the leaders seal committed values with (theirs alone: no member Pod mounts it), so a
    /// leader that takes over adopts what the members hold
    Seal,
}

impl Token {
    pub const ALL: [Token; 4] = [Token::Control, Token::Metrics, Token::Member, Token::Seal];

    /// The file it is mounted as, under [`TOKENS_DIR`] (and, after the backend's name, its key).
    pub fn file(self) -> &'static str {
        match self {
            Token::Control => "control.token",
            Token::Metrics => "metrics.token",
            Token::Member => "member.token",
            Token::Seal => "seal.key",
        }
    }

    /// Its key in [`TOKENS_SECRET`].
    pub fn key(self, backend: &str) -> String {
        backend_key(backend, self.file())
    }
}

pub(super) fn token_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(TOKENS_DIR).join(name)
}

/// The group the store's Pods run with (`fsGroup`): the store image's user (65532, see
/// `deploy/images/store/Containerfile`) is in it, and the kubelet gives it read access to the
/// token files, which are otherwise root's alone.
pub const STORE_FS_GROUP: u32 = 65532;

/// The Pod's security context: the token files readable by [`STORE_FS_GROUP`].
pub(super) fn store_pod_security() -> Value {
    json!({"fsGroup": STORE_FS_GROUP})
}

/// The volume of the tokens: `(secret, file)` pairs, read-only to the owner (and, through
/// `fsGroup`, to the Pod's group).
pub(super) fn tokens_volume(backend: &str, tokens: &[Token]) -> Value {
    let items: Vec<Value> = tokens
        .iter()
        .map(|t| json!({"key": t.key(backend), "path": t.file()}))
        .collect();
    json!({"name": "store-tokens", "projected": {"defaultMode": 0o400, "sources": [
        {"secret": {"name": TOKENS_SECRET, "items": items}},
    ]}})
}

pub(super) fn tokens_mount() -> Value {
    json!({"name": "store-tokens", "mountPath": TOKENS_DIR, "readOnly": true})
}
