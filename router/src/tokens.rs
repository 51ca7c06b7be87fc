//! A request's prompt tokens, found at most once per request however many decisions need them:
//! the client's own token ids, else what an answering worker's vLLM `POST /tokenize` says (the
//! prompt as the engine will read it, chat template included).

use std::time::Duration;

use axum::http::{HeaderMap, Method};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::request::ClientRequest;
use crate::server::App;
use crate::upstream;
use crate::workers::Kind;

/// How long counting a prompt's tokens may take.
const TOKENIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// A prompt as the engine reads it.
#[derive(Debug, Clone)]
pub struct Tokenized {
    pub count: u64,
    /// the token ids, when known (vLLM's answer carries them)
    pub tokens: Option<Vec<i64>>,
}

/// The prompt's tokens, asked for once.
#[derive(Debug, Default)]
pub struct PromptTokens(OnceCell<Option<Tokenized>>);

impl PromptTokens {
    /// The prompt's tokens (`None`: a batch, or the tokenizer did not answer).
    pub async fn get(&self, app: &App, req: &ClientRequest, headers: &HeaderMap) -> Option<&Tokenized> {
        self.0
            .get_or_init(|| async {
                match req.prompt_token_ids() {
                    Some(ids) => Some(Tokenized {
                        count: ids.len() as u64,
                        tokens: Some(ids),
                    }),
                    None => tokenize(app, req, headers).await,
                }
            })
            .await
            .as_ref()
    }

    /// The tokens if they were already found.
    pub fn known(&self) -> Option<&[i64]> {
        self.0.get()?.as_ref()?.tokens.as_deref()
    }
}

/// The prompt's tokens from an answering worker's vLLM `POST /tokenize`.
async fn tokenize(app: &App, req: &ClientRequest, headers: &HeaderMap) -> Option<Tokenized> {
    let body = req.tokenize_body()?;
    let worker = app.pool.pick(&[Kind::Decode, Kind::Server], &[])?;
    let call = async {
        let response = app
            .upstream
            .send(Method::POST, &worker.url, "/tokenize", headers, body)
            .await
            .map_err(|e| e.to_string())?;
        let (status, bytes) = upstream::read_body(response, 16 << 20).await?;
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        let count = v.get("count").and_then(Value::as_u64).ok_or("no count".to_string())?;
        let tokens = v.get("tokens").and_then(Value::as_array).and_then(|a| {
            let ids: Option<Vec<i64>> = a.iter().map(Value::as_i64).collect();
            ids.filter(|ids| ids.len() as u64 == count)
        });
        Ok(Tokenized { count, tokens })
    };
    match tokio::time::timeout(TOKENIZE_TIMEOUT, call).await {
        Ok(Ok(t)) => {
            tracing::debug!(tokens = t.count, "counted the prompt");
            Some(t)
        }
        Ok(Err(why)) => {
            tracing::debug!(worker = %worker.url, error = %why, "counting the prompt failed");
            None
        }
        Err(_) => None,
    }
}
