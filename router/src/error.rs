//! The router's own refusals and failures, and the one place they become an OpenAI-style answer:
//! `{"error": {"message", "type", "code"}}` with 400/404/405/413 (the client's request) or
//! 502/503/504 (no engine could answer). Answers an engine gives are passed through untouched.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use thiserror::Error;

/// Why the router answers a request itself.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ApiError {
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the request body must be a JSON object")]
    NotAnObject,
    #[error("the request body has no \"model\": name the model to use")]
    MissingModel,
    #[error("\"model\" must be a non-empty string")]
    InvalidModel,
    #[error("\"{0}\" must be a boolean")]
    InvalidField(&'static str),
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("the request body could not be read: {0}")]
    BodyUnreadable(String),
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("{method} is not allowed here")]
    MethodNotAllowed { method: String },
    #[error("no healthy {0} worker")]
    NoWorker(&'static str),
    #[error("no engine answered: {0}")]
    Upstream(String),
    #[error("the request did not finish within {0} s")]
    Timeout(u64),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MalformedJson(_)
            | Self::NotAnObject
            | Self::MissingModel
            | Self::InvalidModel
            | Self::InvalidField(_)
            | Self::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::NoWorker(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// OpenAI's `type`: the client's mistake or the service's.
    pub fn kind(&self) -> &'static str {
        if self.status().is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        }
    }

    /// A stable code a client can match on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "invalid_json",
            Self::NotAnObject => "invalid_body",
            Self::MissingModel => "missing_model",
            Self::InvalidModel => "invalid_model",
            Self::InvalidField(_) => "invalid_value",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::BodyUnreadable(_) => "invalid_body",
            Self::NotFound { .. } => "not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::NoWorker(_) => "no_healthy_worker",
            Self::Upstream(_) => "upstream_unavailable",
            Self::Timeout(_) => "timeout",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::json!({
            "error": {"message": self.to_string(), "type": self.kind(), "code": self.code()}
        })
        .to_string()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), self.body()).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_openai_style() {
        let cases = [
            (
                ApiError::MalformedJson("x".into()),
                400,
                "invalid_request_error",
                "invalid_json",
            ),
            (ApiError::NotAnObject, 400, "invalid_request_error", "invalid_body"),
            (ApiError::MissingModel, 400, "invalid_request_error", "missing_model"),
            (
                ApiError::BodyTooLarge { limit: 5 },
                413,
                "invalid_request_error",
                "body_too_large",
            ),
            (
                ApiError::NotFound {
                    method: "GET".into(),
                    path: "/x".into(),
                },
                404,
                "invalid_request_error",
                "not_found",
            ),
            (ApiError::NoWorker("decode"), 503, "server_error", "no_healthy_worker"),
            (
                ApiError::Upstream("refused".into()),
                502,
                "server_error",
                "upstream_unavailable",
            ),
            (ApiError::Timeout(3), 504, "server_error", "timeout"),
        ];
        for (e, status, kind, code) in cases {
            assert_eq!(e.status().as_u16(), status, "{e}");
            let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
            let err = v["error"].as_object().unwrap();
            assert_eq!(err.len(), 3, "{v}");
            assert_eq!(err["type"], kind);
            assert_eq!(err["code"], code);
            assert_eq!(err["message"], e.to_string());
        }
    }
}
