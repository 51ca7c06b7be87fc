//! The only writer of `metav1.Status`: how every refusal reaches a client.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status, StatusCause, StatusDetails};
use kvcache_api::{GROUP, Kind};

/// A `Failure` Status with no details (errors outside any one resource: authentication,
/// authorization, negotiation, limits).
pub fn failure(code: u16, reason: &str, message: impl Into<String>) -> Status {
    Status {
        code: Some(i32::from(code)),
        details: None,
        message: Some(message.into()),
        metadata: ListMeta::default(),
        reason: Some(reason.to_owned()),
        status: Some("Failure".to_owned()),
    }
}

use crate::registry::RegistryError;

/// A refusal on its way to the client: its HTTP code and `Status` body. Every handler answers
/// refusals with one, whether they came from the registry ([`for_resource`]) or from the plain
/// kinds' own checks (Events, Leases: [`refuse`]).
#[derive(Debug)]
pub struct Refusal(pub u16, pub Box<Status>);

/// A refusal with no details beyond its reason and message.
pub fn refuse(code: u16, reason: &str, message: impl Into<String>) -> Refusal {
    Refusal(code, Box::new(failure(code, reason, message)))
}

/// The refusal of an operation on kind `K`.
pub fn from_error<K: Kind>(name: &str, e: &RegistryError) -> (u16, Status) {
    let Refusal(code, status) = for_resource(K::PLURAL, name, e);
    (code, *status)
}

/// The refusal of a registry operation on a resource known by its plural name at run time.
pub fn for_resource(plural: &str, name: &str, e: &RegistryError) -> Refusal {
    let (code, reason) = match e {
        RegistryError::BadRequest(_) => (400, "BadRequest"),
        RegistryError::TooLarge(_) => (413, "RequestEntityTooLarge"),
        RegistryError::TooLargeResourceVersion(_) => (504, "Timeout"),
        RegistryError::Invalid { .. } => (422, "Invalid"),
        RegistryError::NotFound { .. } => (404, "NotFound"),
        RegistryError::AlreadyExists { .. } => (409, "AlreadyExists"),
        RegistryError::Conflict { .. } | RegistryError::ApplyConflict { .. } => (409, "Conflict"),
        RegistryError::Expired(_) => (410, "Expired"),
        RegistryError::Unavailable(_) => (503, "ServiceUnavailable"),
        RegistryError::Internal(_) => (500, "InternalError"),
    };
    let causes = match e {
        RegistryError::Invalid { errors, .. } => Some(
            errors
                .iter()
                .map(|f| StatusCause {
                    field: Some(f.field.to_string()),
                    message: Some(f.message()),
                    reason: Some(f.kind.reason().to_owned()),
                })
                .collect(),
        ),
        RegistryError::ApplyConflict { conflicts, .. } => Some(
            conflicts
                .iter()
                .map(|(field, message)| StatusCause {
                    field: Some(field.clone()),
                    message: Some(message.clone()),
                    reason: Some("FieldManagerConflict".to_owned()),
                })
                .collect(),
        ),
        RegistryError::TooLargeResourceVersion(rv) => Some(vec![StatusCause {
            field: None,
            message: Some(format!("Too large resource version: {rv}")),
            reason: Some("ResourceVersionTooLarge".to_owned()),
        }]),
        _ => None,
    };
    let retry_after_seconds = matches!(e, RegistryError::TooLargeResourceVersion(_)).then_some(1);
    let kind = match e {
        RegistryError::Invalid { kind, .. } => (*kind).to_owned(),
        _ => plural.to_owned(),
    };
    let status = Status {
        code: Some(i32::from(code)),
        details: Some(StatusDetails {
            causes,
            group: Some(GROUP.to_owned()),
            kind: Some(kind),
            name: (!name.is_empty()).then(|| name.to_owned()),
            retry_after_seconds,
            uid: None,
        }),
        message: Some(e.to_string()),
        metadata: ListMeta::default(),
        reason: Some(reason.to_owned()),
        status: Some("Failure".to_owned()),
    };
    Refusal(code, Box::new(status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::{ErrorList, Path};
    use kvcache_api::backend::BackendSpec;

    #[test]
    fn invalid_carries_causes_with_field_paths() {
        let mut errs = ErrorList::new();
        errs.invalid(
            &Path::new("spec").child("size"),
            -1,
            "must be greater than or equal to 0",
        );
        let e = RegistryError::invalid::<BackendSpec>("a1", errs);
        let (code, status) = from_error::<BackendSpec>("a1", &e);
        assert_eq!(code, 422);
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["reason"], "Invalid");
        assert_eq!(
            json["message"],
            r#"KVCacheBackend.worker.gpustack.ai "a1" is invalid: spec.size: Invalid value: -1: must be greater than or equal to 0"#
        );
        assert_eq!(json["details"]["causes"][0]["reason"], "FieldValueInvalid");
        assert_eq!(json["details"]["causes"][0]["field"], "spec.size");
        assert_eq!(json["details"]["kind"], "KVCacheBackend");
    }

    #[test]
    fn not_found_names_the_resource() {
        let e = RegistryError::not_found::<BackendSpec>("a1");
        let (code, status) = from_error::<BackendSpec>("a1", &e);
        assert_eq!(code, 404);
        assert_eq!(
            status.message.as_deref(),
            Some(r#"kvcachebackends.worker.gpustack.ai "a1" not found"#)
        );
        assert_eq!(status.details.unwrap().kind.as_deref(), Some("kvcachebackends"));
    }
}
