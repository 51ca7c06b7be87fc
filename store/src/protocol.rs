//! Which clients a leader serves. Every engine-facing call says which store protocol its client
//! speaks: over gRPC in the metadata [`PROTOCOL_HEADER`] (and [`CLIENT_HEADER`], the client's
//! release, for messages), on the fast port in the [`ClientHello`] that opens each connection.
//! A leader serves the protocols [`OLDEST_SERVED`]`..=`[`PROTOCOL`] and refuses anything else,
//! including a client that names none, with `CLIENT_VERSION_UNSUPPORTED`, a message naming both
//! sides and what to do. Nothing is guessed: a client that predates the check, or a hand-written
//! gRPC client that does not send the header, is told so instead of being served a protocol it
//! may not speak.
//!
//! Policy: [`PROTOCOL`] changes when a change to the calls, their messages, the grant format or
//! the data ports would make an older client misbehave silently; a leader keeps serving older
//! protocols for as long as it still can (then [`OLDEST_SERVED`] rises). The release (the
//! workspace version, also `kv-store --version` and `kvcache.__version__`) only labels messages.

use tonic::metadata::MetadataMap;

use crate::error::{ErrorCode, StoreError};
pub use crate::proto::{ClientHello, ServerHello};

/// The store protocol this build speaks. 2: grants name their allocation (`grant.rs`) and an
/// unknown tenant is refused as a wrong credential is. 3: a write carries its value's tag, which
/// its grant covers (the data port's `KVD3` header), so members can hand what they hold to the
/// next leader. 4: a caller shows its tenant credential before its request is read (gRPC
/// metadata [`CREDENTIAL_HEADER`], the fast port's `ClientHello.credential`), and a member's
/// `SegmentData.Read` answers a stream of pieces.
pub const PROTOCOL: u32 = 4;
/// The oldest client protocol a leader of this build serves: a protocol-3 client shows its
/// credential only inside its requests, which a leader would have to read before it could refuse
/// them.
pub const OLDEST_SERVED: u32 = 4;
/// How a member of this build hands over what it holds (`MountRequest.handover`): 2, adopted
/// values keep their seals (no new seal in the answer) and further pages come packed
/// (`HandoverRequest.packed`). A leader adopts memory holdings only from a member that says the
/// same: one of an older release (0) would not understand the answer and would drop what the
/// leader took it to hold.
pub const HANDOVER: u32 = 2;
/// This build's release.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");
/// gRPC metadata: the client's protocol, in decimal.
pub const PROTOCOL_HEADER: &str = "x-kvstore-protocol";
/// gRPC metadata: the client's name and release (`kvcache-python 0.1.0`).
pub const CLIENT_HEADER: &str = "x-kvstore-client";
/// gRPC metadata: the tenant credential the call's scope carries, shown again here so that the
/// leader can refuse a caller without one before it reads the request (`leader/front.rs`).
pub const CREDENTIAL_HEADER: &str = "x-kvstore-credential";

/// What a client says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientVersion {
    /// `None`: it named no protocol.
    pub protocol: Option<u32>,
    pub client: String,
}

impl ClientVersion {
    /// This build's client, named `client` (`kvcache-store`, `kvcache-python`).
    pub fn ours(client: &str) -> ClientVersion {
        ClientVersion {
            protocol: Some(PROTOCOL),
            client: format!("{client} {RELEASE}"),
        }
    }

    /// From a gRPC call's metadata.
    pub fn from_metadata(m: &MetadataMap) -> ClientVersion {
        let text = |k: &str| m.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
        ClientVersion {
            // a value that does not parse is a protocol this leader does not know: 0
            protocol: text(PROTOCOL_HEADER).map(|v| v.parse().unwrap_or(0)),
            client: text(CLIENT_HEADER).unwrap_or_default().to_owned(),
        }
    }

    /// From the fast port's opening frame.
    pub fn from_hello(h: &ClientHello) -> ClientVersion {
        ClientVersion {
            protocol: Some(h.protocol),
            client: h.client.clone(),
        }
    }

    /// The opening frame that says this, and shows `credential` (empty: none).
    pub fn hello(&self, credential: &str) -> ClientHello {
        ClientHello {
            protocol: self.protocol.unwrap_or(0),
            client: self.client.clone(),
            credential: credential.to_owned(),
        }
    }

    /// Adds the headers that say this to a gRPC request's metadata.
    pub fn attach(&self, m: &mut MetadataMap) {
        if let Some(p) = self.protocol
            && let Ok(v) = p.to_string().parse()
        {
            m.insert(PROTOCOL_HEADER, v);
        }
        if let Ok(v) = self.client.parse() {
            m.insert(CLIENT_HEADER, v);
        }
    }
}

/// Whether this leader serves `client`; the refusal says what to do.
pub fn check(client: &ClientVersion) -> Result<(), StoreError> {
    let server = format!("kv-store {RELEASE}, protocol {}", served());
    let who = if client.client.is_empty() {
        "this client".to_owned()
    } else {
        format!("this client ({})", client.client)
    };
    match client.protocol {
        Some(p) if (OLDEST_SERVED..=PROTOCOL).contains(&p) => Ok(()),
        None => Err(StoreError::new(
            ErrorCode::ClientVersionUnsupported,
            format!(
                "{who} did not say which store protocol it speaks and this leader ({server}) serves only clients that do: \
                 use the kvcache package of the store's release (the store image carries it), or send the gRPC metadata \
                 {PROTOCOL_HEADER}: {PROTOCOL}"
            ),
        )),
        Some(p) if p > PROTOCOL => Err(StoreError::new(
            ErrorCode::ClientVersionUnsupported,
            format!(
                "{who} speaks store protocol {p}, newer than this leader ({server}): upgrade the store, or use the kvcache \
                 package of the store's release"
            ),
        )),
        Some(p) => Err(StoreError::new(
            ErrorCode::ClientVersionUnsupported,
            format!(
                "{who} speaks store protocol {p}, which this leader ({server}) no longer serves: upgrade the client to the \
                 kvcache package of the store's release"
            ),
        )),
    }
}

/// `1`, or `1 to 3`: the protocols served.
fn served() -> String {
    if OLDEST_SERVED == PROTOCOL {
        PROTOCOL.to_string()
    } else {
        format!("{OLDEST_SERVED} to {PROTOCOL}")
    }
}

/// The leader's answer to a hello it serves.
pub fn server_hello() -> ServerHello {
    ServerHello {
        protocol: PROTOCOL,
        server: format!("kv-store {RELEASE}"),
    }
}

/// A tonic interceptor that adds this build's client headers to every call (for gRPC clients
/// of the `Store` service written with the generated stubs).
#[derive(Debug, Clone)]
pub struct SendVersion(pub ClientVersion);

impl tonic::service::Interceptor for SendVersion {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.0.attach(req.metadata_mut());
        Ok(req)
    }
}

/// [`SendVersion`] and the tenant credential ([`CREDENTIAL_HEADER`]): what every `Store` call of
/// a client acting for a tenant sends.
#[derive(Debug, Clone)]
pub struct SendCaller {
    pub version: ClientVersion,
    /// `None`: the scope carries no credential (or one that is not a header value, which the
    /// leader then refuses as it refuses none)
    pub credential: Option<tonic::metadata::AsciiMetadataValue>,
}

impl SendCaller {
    pub fn new(version: ClientVersion, credential: &str) -> Self {
        SendCaller {
            version,
            credential: (!credential.is_empty()).then(|| credential.parse().ok()).flatten(),
        }
    }
}

impl tonic::service::Interceptor for SendCaller {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.version.attach(req.metadata_mut());
        if let Some(c) = &self.credential {
            req.metadata_mut().insert(CREDENTIAL_HEADER, c.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(protocol: Option<u32>) -> ClientVersion {
        ClientVersion {
            protocol,
            client: "kvcache-python 9.9.9".into(),
        }
    }

    #[test]
    fn the_served_protocols_pass_and_everything_else_is_refused_with_both_sides_named() {
        assert!(check(&ClientVersion::ours("kvcache-store")).is_ok());
        for (client, says) in [
            (v(None), "did not say"),
            (v(Some(PROTOCOL + 1)), "upgrade the store"),
            (v(Some(0)), "no longer serves"),
        ] {
            let e = check(&client).unwrap_err();
            assert_eq!(e.code, ErrorCode::ClientVersionUnsupported);
            assert!(e.message.contains(says), "{e}");
            assert!(e.message.contains("kvcache-python 9.9.9"), "{e}");
            assert!(e.message.contains(&format!("kv-store {RELEASE}")), "{e}");
        }
    }

    #[test]
    fn metadata_round_trips_and_garbage_is_an_unknown_protocol() {
        let mut m = MetadataMap::new();
        ClientVersion::ours("kvcache-store").attach(&mut m);
        assert_eq!(ClientVersion::from_metadata(&m), ClientVersion::ours("kvcache-store"));
        m.insert(PROTOCOL_HEADER, "one".parse().unwrap());
        assert_eq!(ClientVersion::from_metadata(&m).protocol, Some(0));
        assert_eq!(ClientVersion::from_metadata(&MetadataMap::new()).protocol, None);
    }
}
