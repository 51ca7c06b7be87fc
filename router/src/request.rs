//! A client's request body: what the router reads of it (an object with a string `model`, and
//! `stream`), the prompt's size for the disaggregation threshold, and the two rewrites of the
//! handoff (issue 40's design, "The handoff through kv_transfer_params"). Everything else in the
//! body is the engines' to validate; the router passes it on as it came.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The OpenAI endpoints the router proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

impl Endpoint {
    /// The path on an engine.
    pub fn path(self) -> &'static str {
        match self {
            Self::Completions => "/v1/completions",
            Self::ChatCompletions => "/v1/chat/completions",
        }
    }

    /// The `endpoint` label of the request metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Completions => "completions",
            Self::ChatCompletions => "chat_completions",
        }
    }
}

/// Special tokens a completion prompt may gain on top of its text (BOS and the like).
const SPECIAL_TOKENS: usize = 8;
/// What a chat template may add per message (role markers, separators) and once (the
/// generation prompt, BOS).
const TEMPLATE_TOKENS_PER_MESSAGE: usize = 16;

/// How big a prompt is, as far as the router can tell without a tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptSize {
    /// The client sent token ids: exactly this many.
    Tokens(u64),
    /// Text: the engine's token count is at most this. Byte-level BPE and SentencePiece with
    /// byte fallback (the tokenizers vLLM serves) never make more tokens than the text has
    /// bytes; the template's and special tokens are bounded on top.
    AtMost(u64),
    /// Several prompts in one request (a batch): one handoff cannot describe them, so the
    /// request goes straight to decode.
    Batch,
    /// A shape the router does not read; the engine will judge it.
    Unknown,
}

/// A client's request, read once.
#[derive(Debug, Clone)]
pub struct ClientRequest {
    pub endpoint: Endpoint,
    /// The bytes as the client sent them: what an engine gets when nothing is added.
    pub raw: Bytes,
    pub body: Map<String, Value>,
    pub model: String,
    pub stream: bool,
}

impl ClientRequest {
    /// Reads `raw`: a JSON object with a non-empty string `model`. Nothing else is checked.
    pub fn parse(endpoint: Endpoint, raw: Bytes) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(&raw).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
        let Value::Object(body) = value else {
            return Err(ApiError::NotAnObject);
        };
        let model = match body.get("model") {
            None | Some(Value::Null) => return Err(ApiError::MissingModel),
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            Some(_) => return Err(ApiError::InvalidModel),
        };
        let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        Ok(Self {
            endpoint,
            raw,
            body,
            model,
            stream,
        })
    }

    /// The body for prefill: one token, not streamed, and the handoff asked for.
    pub fn prefill_body(&self) -> Bytes {
        let mut body = self.body.clone();
        body.insert("max_tokens".into(), json!(1));
        if self.endpoint == Endpoint::ChatCompletions && body.contains_key("max_completion_tokens") {
            body.insert("max_completion_tokens".into(), json!(1));
        }
        body.insert("stream".into(), json!(false));
        body.remove("stream_options");
        body.insert("kv_transfer_params".into(), json!({"do_remote_decode": true}));
        to_bytes(body)
    }

    /// The body for decode: the client's own, plus prefill's `kv_transfer_params` when there is
    /// a handoff (the client's bytes untouched when there is none).
    pub fn decode_body(&self, kv_transfer_params: Option<&Value>) -> Bytes {
        match kv_transfer_params {
            None => self.raw.clone(),
            Some(params) => {
                let mut body = self.body.clone();
                body.insert("kv_transfer_params".into(), params.clone());
                to_bytes(body)
            }
        }
    }

    /// The prompt's size, read cheaply.
    pub fn prompt_size(&self) -> PromptSize {
        match self.endpoint {
            Endpoint::Completions => completion_prompt_size(self.body.get("prompt")),
            Endpoint::ChatCompletions => chat_prompt_size(self.body.get("messages")),
        }
    }

    /// The prompt's token ids, when the client sent them (one completion prompt).
    pub fn prompt_token_ids(&self) -> Option<Vec<i64>> {
        if self.endpoint != Endpoint::Completions {
            return None;
        }
        let ids = match self.body.get("prompt")? {
            Value::Array(a) if a.len() == 1 && a[0].is_array() => a[0].as_array()?,
            Value::Array(a) => a,
            _ => return None,
        };
        ids.iter()
            .map(|v| v.as_u64().and_then(|t| i64::try_from(t).ok()))
            .collect()
    }

    /// The request's `cache_salt` (vLLM's: a prefix is shared only among requests with the
    /// same one), empty when it has none.
    pub fn cache_salt(&self) -> &str {
        self.body.get("cache_salt").and_then(Value::as_str).unwrap_or("")
    }

    /// The body of vLLM's `POST /tokenize` for this prompt, when it is text.
    pub fn tokenize_body(&self) -> Option<Bytes> {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        match self.endpoint {
            Endpoint::Completions => {
                let prompt = match self.body.get("prompt")? {
                    Value::String(s) => s.clone(),
                    Value::Array(a) if a.len() == 1 => a[0].as_str()?.to_string(),
                    _ => return None,
                };
                body.insert("prompt".into(), json!(prompt));
            }
            Endpoint::ChatCompletions => {
                body.insert("messages".into(), self.body.get("messages")?.clone());
                for key in [
                    "tools",
                    "chat_template",
                    "chat_template_kwargs",
                    "add_generation_prompt",
                ] {
                    if let Some(v) = self.body.get(key) {
                        body.insert(key.into(), v.clone());
                    }
                }
            }
        }
        Some(to_bytes(body))
    }
}

fn to_bytes(body: Map<String, Value>) -> Bytes {
    // Serializing a `Value` cannot fail: its keys are strings.
    Bytes::from(Value::Object(body).to_string())
}

fn completion_prompt_size(prompt: Option<&Value>) -> PromptSize {
    let text = |s: &str| PromptSize::AtMost((s.len() + SPECIAL_TOKENS) as u64);
    let ids = |a: &[Value]| {
        a.iter()
            .all(Value::is_u64)
            .then_some(PromptSize::Tokens(a.len() as u64))
    };
    match prompt {
        Some(Value::String(s)) => text(s),
        Some(Value::Array(a)) if a.is_empty() => PromptSize::Unknown,
        Some(Value::Array(a)) => {
            if let Some(size) = ids(a) {
                return size;
            }
            if a.len() > 1 {
                return PromptSize::Batch;
            }
            match &a[0] {
                Value::String(s) => text(s),
                Value::Array(inner) => ids(inner).unwrap_or(PromptSize::Unknown),
                _ => PromptSize::Unknown,
            }
        }
        _ => PromptSize::Unknown,
    }
}

fn chat_prompt_size(messages: Option<&Value>) -> PromptSize {
    let Some(Value::Array(messages)) = messages else {
        return PromptSize::Unknown;
    };
    let mut bytes = TEMPLATE_TOKENS_PER_MESSAGE;
    for m in messages {
        bytes += TEMPLATE_TOKENS_PER_MESSAGE;
        bytes += m.get("role").and_then(Value::as_str).map_or(0, str::len);
        match m.get("content") {
            Some(Value::String(s)) => bytes += s.len(),
            Some(Value::Array(parts)) => {
                for part in parts {
                    match part.get("text") {
                        Some(Value::String(s)) => bytes += s.len(),
                        // an image or audio part: its tokens are not the text's
                        _ if part.get("type").and_then(Value::as_str) != Some("text") => {
                            return PromptSize::Unknown;
                        }
                        _ => {}
                    }
                }
            }
            Some(Value::Null) | None => {}
            Some(_) => return PromptSize::Unknown,
        }
    }
    PromptSize::AtMost(bytes as u64)
}

#[cfg(test)]
mod tests;
