//! `TierWasEmpty`: whether the members' disk tiers were empty when the backend was new, decided
//! once from what the runtime surveyed (each member's tier directory before its member first
//! opened it) and never revisited. Only readings of members created within [`BELIEVED_FOR`] of
//! the backend's creation count (later ones find the tier's own files); an unreadable directory
//! (-1) is no reading. One reading above 0 decides `False` (`PreexistingContent`, naming each such
//! node); `True` (`Empty`) needs a reading of 0 from every member the runtime expects. Otherwise
//! the question stays open and the condition absent. Table-tested below.

use std::time::{Duration, SystemTime};

use kvcache_api::KVCacheBackend;
use kvcache_api::backend::BackendStatus;
use kvcache_api::conditions::backend::tier_was_empty;
use kvcache_api::conditions::{self, ConditionStatus, Observation};

use crate::runtime::TierSurvey;

/// How long after a backend's creation a member's survey is believed.
pub const BELIEVED_FOR: Duration = Duration::from_secs(30 * 60);

/// The condition to set, once: `None` while it is decided already or still open.
pub fn decide(obj: &KVCacheBackend, survey: Option<&TierSurvey>, prev: &BackendStatus) -> Option<Observation> {
    if conditions::find(&prev.conditions, tier_was_empty::TYPE).is_some() {
        return None;
    }
    let survey = survey?;
    let created = obj
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs(t.0.as_second().max(0) as u64))?;
    let believed: Vec<&(String, i64, Option<SystemTime>)> = survey
        .readings
        .iter()
        .filter(|(_, entries, at)| {
            *entries >= 0 && at.is_some_and(|at| at.duration_since(created).unwrap_or_default() <= BELIEVED_FOR)
        })
        .collect();
    let full: Vec<String> = believed
        .iter()
        .filter(|(_, entries, _)| *entries > 0)
        .map(|(node, entries, _)| format!("{node} ({entries} entries)"))
        .collect();
    if !full.is_empty() {
        return Some(Observation::new(
            tier_was_empty::TYPE,
            ConditionStatus::False,
            tier_was_empty::PREEXISTING_CONTENT,
            format!(
                "the disk tier directory was not empty when its member first started on: {}; the store adopts \
                 what it can verify there and removes the rest",
                full.join(", ")
            ),
        ));
    }
    (survey.expected > 0 && believed.len() == survey.expected).then(|| {
        Observation::new(
            tier_was_empty::TYPE,
            ConditionStatus::True,
            tier_was_empty::EMPTY,
            format!(
                "every member's disk tier directory was empty when it first started ({} members)",
                survey.expected
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn backend(created_secs: i64) -> KVCacheBackend {
        let mut b: KVCacheBackend = serde_json::from_value(serde_json::json!({
            "apiVersion": "worker.gpustack.ai/v1", "kind": "KVCacheBackend",
            "metadata": {"name": "b"}, "spec": {"type": "Mooncake"}
        }))
        .unwrap();
        b.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created_secs).unwrap()));
        b
    }

    fn at(secs: u64) -> Option<SystemTime> {
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn survey(expected: usize, readings: &[(&str, i64, Option<SystemTime>)]) -> TierSurvey {
        TierSurvey {
            expected,
            readings: readings.iter().map(|(n, e, t)| (n.to_string(), *e, *t)).collect(),
        }
    }

    #[test]
    fn decided_once_from_believed_readings() {
        let b = backend(1_000);
        let open = BackendStatus::default();
        // (case, what the runtime surveyed, the condition's status and reason, if decided)
        type Case = (&'static str, Option<TierSurvey>, Option<(&'static str, &'static str)>);
        let cases: Vec<Case> = vec![
            ("no tier", None, None),
            (
                "all empty",
                Some(survey(2, &[("n0", 0, at(1_010)), ("n1", 0, at(1_020))])),
                Some(("True", "Empty")),
            ),
            ("one still to come", Some(survey(2, &[("n0", 0, at(1_010))])), None),
            (
                "one not empty decides at once",
                Some(survey(3, &[("n0", 0, at(1_010)), ("n1", 7, at(1_020))])),
                Some(("False", "PreexistingContent")),
            ),
            (
                "an unreadable one is no reading",
                Some(survey(1, &[("n0", -1, at(1_010))])),
                None,
            ),
            (
                "too late to believe",
                Some(survey(1, &[("n0", 5, at(1_000 + 31 * 60))])),
                None,
            ),
            ("no time, not believed", Some(survey(1, &[("n0", 0, None)])), None),
        ];
        for (name, s, want) in cases {
            let got = decide(&b, s.as_ref(), &open);
            let got = got.as_ref().map(|o| (o.status.as_str(), o.reason.as_str()));
            assert_eq!(got, want, "{name}");
        }
        let full = decide(&b, Some(&survey(1, &[("n1", 7, at(1_020))])), &open).unwrap();
        assert!(full.message.contains("n1 (7 entries)"), "{}", full.message);
    }

    #[test]
    fn never_revisited() {
        let b = backend(1_000);
        let mut decided = BackendStatus::default();
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let o = decide(&b, Some(&survey(1, &[("n0", 0, at(1_010))])), &decided).unwrap();
        conditions::set(&mut decided.conditions, o, &now);
        assert_eq!(decide(&b, Some(&survey(1, &[("n0", 9, at(1_010))])), &decided), None);
    }
}
