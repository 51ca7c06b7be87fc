//! Where a real kubectl of a given minor release is found. Included by path (`#[path]`) in the e2e
//! tests and the live benchmarks.

use std::path::{Path, PathBuf};

/// kubectl `version` ("1.27", "1.30", "1.33"): the one `scripts/build-kubectl` builds from the
/// release pinned in `tests/kubectl/<version>/go.mod` into `$KVCACHE_TOOLS_DIR` (by default
/// `~/.cache/kvcache-tools`), else the Google Cloud SDK's `kubectl.<version>`.
pub fn kubectl_path(version: &str) -> PathBuf {
    let go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/kubectl/{version}/go.mod"));
    // The kubectl module v0.N.P is kubectl 1.N.P.
    let pinned = std::fs::read_to_string(&go_mod).ok().and_then(|text| {
        text.lines()
            .find_map(|line| line.trim().strip_prefix("k8s.io/kubectl v0."))
            .map(|minor_patch| format!("v1.{}", minor_patch.trim()))
    });
    let tools = std::env::var_os("KVCACHE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kvcache-tools"));
    let built = pinned.map(|release| tools.join(format!("kubectl-{release}/kubectl")));
    let sdk = PathBuf::from(format!("/usr/lib/google-cloud-sdk/bin/kubectl.{version}"));
    match built.into_iter().chain([sdk]).find(|path| path.exists()) {
        Some(path) => path,
        None => panic!(
            "kubectl {version} is missing: these tests drive real kubectl {version}; run scripts/setup \
             (scripts/build-kubectl builds it from tests/kubectl/{version} into {})",
            tools.display()
        ),
    }
}
