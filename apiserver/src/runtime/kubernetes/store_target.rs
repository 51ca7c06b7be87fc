//! Where a backend's store objects go and what they run: the namespace, the
//! image (the backend's, else the setting `kv-cache-backend-image`), its pull policy and secrets.

use crate::runtime::StorePlan;

/// Where the rendered objects go and what they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The namespace of every store object (`gpustack-system`).
    pub namespace: String,
    /// The `kv-store` image (the backend's `image`, else the setting `kv-cache-backend-image`).
    pub image: String,
    /// `Always`, `IfNotPresent` or `Never`; `None` follows the image's tag.
    pub pull_policy: Option<String>,
    pub pull_secrets: Vec<String>,
    /// The namespace the API server (and its controllers) run in, whose Pods may reach the store.
    pub server_namespace: String,
}

impl Target {
    /// A backend's target in `namespace`: its own image, else `default_image` (the setting
    /// `kv-cache-backend-image`); with neither, nothing can be rendered and the error says so.
    /// The server is taken to run in `namespace` too.
    pub fn for_plan(plan: &StorePlan, namespace: &str, default_image: &str) -> Result<Target, String> {
        let image = plan.image.as_deref().unwrap_or(default_image).trim();
        if image.is_empty() {
            return Err("no image: set spec.image or the setting kv-cache-backend-image".into());
        }
        Ok(Target {
            namespace: namespace.to_owned(),
            image: image.to_owned(),
            pull_policy: plan.pull_policy.clone(),
            pull_secrets: plan.pull_secrets.clone(),
            server_namespace: namespace.to_owned(),
        })
    }
}

/// `spec.imagePullPolicy`, else `Always` for `:latest` or an image with neither tag nor digest,
/// else `IfNotPresent`; always written, so the object converges.
pub fn pull_policy(image: &str, explicit: Option<&str>) -> String {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    let (name, digest) = image.split_once('@').map_or((image, false), |(n, _)| (n, true));
    let tag = name
        .rsplit_once('/')
        .map_or(name, |(_, last)| last)
        .split_once(':')
        .map(|(_, t)| t);
    match (tag, digest) {
        (Some("latest"), _) | (None, false) => "Always".into(),
        _ => "IfNotPresent".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policies_follow_the_tag_unless_given() {
        assert_eq!(pull_policy("a/b:v1", None), "IfNotPresent");
        assert_eq!(pull_policy("a/b:latest", None), "Always");
        assert_eq!(pull_policy("a/b", None), "Always");
        assert_eq!(pull_policy("host:5000/b", None), "Always");
        assert_eq!(pull_policy("a/b@sha256:00", None), "IfNotPresent");
        assert_eq!(pull_policy("a/b:v1", Some("Never")), "Never");
    }
}
