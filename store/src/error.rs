//! Store errors and the one seam where they become `tonic::Status` (and are read back by the
//! client). Every refusal names a stable upper-case code, first in the status message
//! (`"TENANT_QUOTA_EXCEEDED: ..."`) and again in the `x-kvstore-error` metadata entry.

use thiserror::Error;
use tonic::{Code, Status};

/// Metadata key carrying the error code of a refusal.
pub const ERROR_CODE_HEADER: &str = "x-kvstore-error";

/// Stable codes callers can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    TenantQuotaExceeded,
    TenantLayoutMismatch,
    TenantLayoutImmutable,
    InvalidTenantLedger,
    InvalidArgument,
    ValueTooLarge,
    NoSpace,
    ObjectHasLease,
    PutInProgress,
    PutExpired,
    UnknownMember,
    MemberNameTaken,
    StaleMount,
    StaleEpoch,
    RangeBusy,
    OutOfRange,
    LeaseExpired,
    NotServing,
    Transport,
    Internal,
    /// The call does not prove who it acts for: a tenant the ledger has with one of its
    /// credentials (an unknown tenant gets the same answer as a wrong credential), the controllers' token on
    /// the Control API, the backend's member token on Membership, or a grant's MAC on a data port.
    Unauthenticated,
    /// The client speaks a store protocol this leader does not serve, or did not say which
    /// (`protocol.rs`).
    ClientVersionUnsupported,
    /// A member reports what it holds to a leader that has no tenant ledger yet this term (the
    /// controllers send it within moments): mounting now would free every value for want of its
    /// tenant, so the member is asked to retry shortly.
    LedgerPending,
}

impl ErrorCode {
    /// The spelling on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TenantQuotaExceeded => "TENANT_QUOTA_EXCEEDED",
            Self::TenantLayoutMismatch => "TENANT_LAYOUT_MISMATCH",
            Self::TenantLayoutImmutable => "TENANT_LAYOUT_IMMUTABLE",
            Self::InvalidTenantLedger => "INVALID_TENANT_LEDGER",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::ValueTooLarge => "VALUE_TOO_LARGE",
            Self::NoSpace => "NO_SPACE",
            Self::ObjectHasLease => "OBJECT_HAS_LEASE",
            Self::PutInProgress => "PUT_IN_PROGRESS",
            Self::PutExpired => "PUT_EXPIRED",
            Self::UnknownMember => "UNKNOWN_MEMBER",
            Self::MemberNameTaken => "MEMBER_NAME_TAKEN",
            Self::StaleMount => "STALE_MOUNT",
            Self::StaleEpoch => "STALE_EPOCH",
            Self::RangeBusy => "RANGE_BUSY",
            Self::OutOfRange => "OUT_OF_RANGE",
            Self::LeaseExpired => "LEASE_EXPIRED",
            Self::NotServing => "NOT_SERVING",
            Self::Transport => "TRANSPORT",
            Self::Internal => "INTERNAL",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::ClientVersionUnsupported => "CLIENT_VERSION_UNSUPPORTED",
            Self::LedgerPending => "LEDGER_PENDING",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// The gRPC code a refusal with this store code is sent with.
    pub fn grpc_code(self) -> Code {
        match self {
            Self::TenantQuotaExceeded | Self::NoSpace => Code::ResourceExhausted,
            Self::TenantLayoutMismatch
            | Self::TenantLayoutImmutable
            | Self::ObjectHasLease
            | Self::StaleMount
            | Self::StaleEpoch
            | Self::LeaseExpired => Code::FailedPrecondition,
            Self::InvalidTenantLedger | Self::InvalidArgument | Self::ValueTooLarge => Code::InvalidArgument,
            Self::PutInProgress | Self::RangeBusy => Code::Aborted,
            Self::PutExpired | Self::UnknownMember => Code::NotFound,
            Self::MemberNameTaken => Code::AlreadyExists,
            Self::OutOfRange => Code::OutOfRange,
            Self::NotServing | Self::Transport | Self::LedgerPending => Code::Unavailable,
            Self::Internal => Code::Internal,
            Self::Unauthenticated => Code::Unauthenticated,
            Self::ClientVersionUnsupported => Code::FailedPrecondition,
        }
    }
}

/// Every code, in a fixed order (clients that number codes, such as the Python package, number
/// them by their place here; append new codes at the end).
pub const ALL: &[ErrorCode] = &[
    ErrorCode::TenantQuotaExceeded,
    ErrorCode::TenantLayoutMismatch,
    ErrorCode::TenantLayoutImmutable,
    ErrorCode::InvalidTenantLedger,
    ErrorCode::InvalidArgument,
    ErrorCode::ValueTooLarge,
    ErrorCode::NoSpace,
    ErrorCode::ObjectHasLease,
    ErrorCode::PutInProgress,
    ErrorCode::PutExpired,
    ErrorCode::UnknownMember,
    ErrorCode::MemberNameTaken,
    ErrorCode::StaleMount,
    ErrorCode::StaleEpoch,
    ErrorCode::RangeBusy,
    ErrorCode::OutOfRange,
    ErrorCode::LeaseExpired,
    ErrorCode::NotServing,
    ErrorCode::Transport,
    ErrorCode::Internal,
    ErrorCode::Unauthenticated,
    ErrorCode::ClientVersionUnsupported,
    ErrorCode::LedgerPending,
];

/// A refusal or failure, with a message that says what to do.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("{}: {message}", code.as_str())]
pub struct StoreError {
    pub code: ErrorCode,
    pub message: String,
}

impl StoreError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Reads a status produced by [`From<StoreError> for Status`]; other statuses (transport
    /// failures, statuses from something that is not our server) map to `Transport`/`Internal`.
    pub fn from_status(status: &Status) -> Self {
        let from_meta = status
            .metadata()
            .get(ERROR_CODE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorCode::parse);
        let msg = status.message();
        let from_msg = msg
            .split_once(": ")
            .and_then(|(c, rest)| ErrorCode::parse(c).map(|c| (c, rest)));
        match (from_meta, from_msg) {
            (_, Some((code, rest))) => Self::new(code, rest),
            (Some(code), None) => Self::new(code, msg),
            (None, None) => {
                let code = match status.code() {
                    Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                        ErrorCode::Transport
                    }
                    _ => ErrorCode::Internal,
                };
                let msg = match std::error::Error::source(status) {
                    Some(src) => format!("{msg}: {}", chain(src)),
                    None => msg.to_string(),
                };
                Self::new(code, format!("{:?}: {msg}", status.code()))
            }
        }
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Self {
        let mut status = Status::new(e.code.grpc_code(), e.to_string());
        if let Ok(v) = e.code.as_str().parse() {
            status.metadata_mut().insert(ERROR_CODE_HEADER, v);
        }
        status
    }
}

/// `e` and its sources, joined by ": " on one line (tonic's transport errors keep the cause, such
/// as "connection refused", in their sources).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let s_text = s.to_string();
        if !out.ends_with(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        next = s.source();
    }
    out
}

/// Shorthand for results in the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_a_status() {
        for code in ALL {
            let e = StoreError::new(*code, "do this");
            let status = Status::from(e.clone());
            assert!(status.message().starts_with(code.as_str()));
            assert_eq!(StoreError::from_status(&status), e);
        }
    }

    #[test]
    fn chains_join_causes_on_one_line() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let outer = std::io::Error::other(ChainTest(inner));
        assert_eq!(chain(&outer), "cannot connect: connection refused");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect")]
    struct ChainTest(#[source] std::io::Error);

    #[test]
    fn foreign_statuses_become_transport_or_internal() {
        assert_eq!(
            StoreError::from_status(&Status::unavailable("down")).code,
            ErrorCode::Transport
        );
        assert_eq!(
            StoreError::from_status(&Status::internal("x")).code,
            ErrorCode::Internal
        );
    }
}
