//! Reading a request body and the handoff's two rewrites.

use super::*;

fn parse(endpoint: Endpoint, v: Value) -> Result<ClientRequest, ApiError> {
    ClientRequest::parse(endpoint, Bytes::from(v.to_string()))
}

fn json_of(b: &Bytes) -> Value {
    serde_json::from_slice(b).unwrap()
}

#[test]
fn refusals() {
    let raw = |s: &'static str| ClientRequest::parse(Endpoint::Completions, Bytes::from_static(s.as_bytes()));
    assert!(matches!(raw("{\"model\":"), Err(ApiError::MalformedJson(_))));
    assert!(matches!(raw(""), Err(ApiError::MalformedJson(_))));
    assert_eq!(raw("[1,2]").unwrap_err(), ApiError::NotAnObject);
    assert_eq!(raw("\"m\"").unwrap_err(), ApiError::NotAnObject);
    assert_eq!(raw("{\"prompt\":\"x\"}").unwrap_err(), ApiError::MissingModel);
    assert_eq!(raw("{\"model\":null}").unwrap_err(), ApiError::MissingModel);
    assert_eq!(raw("{\"model\":3}").unwrap_err(), ApiError::InvalidModel);
    assert_eq!(raw("{\"model\":\"\"}").unwrap_err(), ApiError::InvalidModel);
    // the rest is the engine's to judge
    let r = raw("{\"model\":\"m\",\"max_tokens\":\"lots\",\"stream\":\"yes\"}").unwrap();
    assert_eq!(r.model, "m");
    assert!(!r.stream);
}

#[test]
fn prefill_body_asks_for_one_token_and_the_handoff() {
    let r = parse(
        Endpoint::Completions,
        json!({"model": "m", "prompt": "hi", "max_tokens": 64, "stream": true,
               "stream_options": {"include_usage": true}, "temperature": 0}),
    )
    .unwrap();
    assert!(r.stream);
    let p = json_of(&r.prefill_body());
    assert_eq!(
        p,
        json!({"model": "m", "prompt": "hi", "max_tokens": 1, "stream": false, "temperature": 0,
               "kv_transfer_params": {"do_remote_decode": true}})
    );
}

#[test]
fn chat_prefill_caps_max_completion_tokens_only_when_set() {
    let with = parse(
        Endpoint::ChatCompletions,
        json!({"model": "m", "messages": [], "max_completion_tokens": 50}),
    )
    .unwrap();
    let p = json_of(&with.prefill_body());
    assert_eq!(p["max_completion_tokens"], 1);
    assert_eq!(p["max_tokens"], 1);
    let without = parse(Endpoint::ChatCompletions, json!({"model": "m", "messages": []})).unwrap();
    assert!(json_of(&without.prefill_body()).get("max_completion_tokens").is_none());
    // a completion's max_completion_tokens is not a field of that API: left alone
    let c = parse(
        Endpoint::Completions,
        json!({"model": "m", "max_completion_tokens": 50}),
    )
    .unwrap();
    assert_eq!(json_of(&c.prefill_body())["max_completion_tokens"], 50);
}

#[test]
fn decode_body_adds_exactly_prefills_params() {
    let raw = Bytes::from_static(br#"{ "model":"m", "prompt":"hi", "stream":true }"#);
    let r = ClientRequest::parse(Endpoint::Completions, raw.clone()).unwrap();
    // no handoff: the client's bytes as they came
    assert_eq!(r.decode_body(None), raw);
    let params = json!({"kvcache_handoff": {"blocks": 3, "bytes": 300, "fingerprint": "ab"},
                        "prompt_token_ids": [1, 2, 3]});
    let d = json_of(&r.decode_body(Some(&params)));
    assert_eq!(
        d,
        json!({"model": "m", "prompt": "hi", "stream": true, "kv_transfer_params": params})
    );
}

#[test]
fn prompt_sizes() {
    let size = |e, v: Value| parse(e, v).unwrap().prompt_size();
    use Endpoint::*;
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": "abcd"})),
        PromptSize::AtMost(12)
    );
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": ["abcd"]})),
        PromptSize::AtMost(12)
    );
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": [1, 2, 3]})),
        PromptSize::Tokens(3)
    );
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": [[1, 2]]})),
        PromptSize::Tokens(2)
    );
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": ["a", "b"]})),
        PromptSize::Batch
    );
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": [[1], [2]]})),
        PromptSize::Batch
    );
    assert_eq!(size(Completions, json!({"model": "m"})), PromptSize::Unknown);
    assert_eq!(
        size(Completions, json!({"model": "m", "prompt": 5})),
        PromptSize::Unknown
    );
    let chat = json!({"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
    ]});
    // 16 once + 16 per message + roles (6 + 4) + text (8 + 5)
    assert_eq!(size(ChatCompletions, chat), PromptSize::AtMost(16 + 32 + 10 + 13));
    let image = json!({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    ]});
    assert_eq!(size(ChatCompletions, image), PromptSize::Unknown);
}

#[test]
fn tokenize_bodies() {
    let c = parse(
        Endpoint::Completions,
        json!({"model": "m", "prompt": "abc", "max_tokens": 3}),
    )
    .unwrap();
    assert_eq!(
        json_of(&c.tokenize_body().unwrap()),
        json!({"model": "m", "prompt": "abc"})
    );
    let ids = parse(Endpoint::Completions, json!({"model": "m", "prompt": [1, 2]})).unwrap();
    assert!(ids.tokenize_body().is_none());
    let chat = parse(
        Endpoint::ChatCompletions,
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1}),
    )
    .unwrap();
    assert_eq!(
        json_of(&chat.tokenize_body().unwrap()),
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    );
}
