//! Server configuration that admission reads: the kv-cache settings and the instance types that
//! a ModelDeployment role's `instanceType` resolves to.
//!
//! Loaded from a YAML file (`--config`); every field has a default so an absent file means the
//! defaults below.
//!
//! ```yaml
//! settings:
//!   kvCacheBackendImage: ghcr.io/gpustack/kvcache-store:v0.1.0
//!   modelDeploymentKvCacheDtypeOwned: true
//! instanceTypes:
//!   - name: local-small
//!     accelerators: 1
//! localRuntime:
//!   engines: real               # simulated (the default) | real
//!   path: [/opt/venv/bin]       # searched first for the engine's command
//!   packageDir: /opt/kvcache/python
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use serde::{Deserialize, Serialize};

/// The image every backend role runs when the backend names none: the store image of this release
/// (`scripts/image` builds it; it carries `kv-store` and the Python package). The reference's
/// Mooncake image has no `kv-store`, so it cannot run a managed backend of ours.
pub const DEFAULT_BACKEND_IMAGE: &str = concat!("ghcr.io/gpustack/kvcache-store:v", env!("CARGO_PKG_VERSION"));

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub settings: Settings,
    #[serde(default = "default_instance_types")]
    pub instance_types: Vec<InstanceType>,
    /// How the local runtime runs engine replicas (`--runtime local`).
    #[serde(default)]
    pub local_runtime: LocalRuntimeConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            settings: Settings::default(),
            instance_types: default_instance_types(),
            local_runtime: LocalRuntimeConfig::default(),
        }
    }
}

/// How the local runtime runs a ModelDeployment's replicas.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalRuntimeConfig {
    #[serde(default)]
    pub engines: EngineMode,
    /// Directories searched, before the server's `PATH`, for the engine's command (`vllm`,
    /// `python3`): a virtual environment's `bin`, say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<std::path::PathBuf>,
    /// The directory holding the `kvcache` package real engines load our connectors from (their
    /// `PYTHONPATH`, as a Pod's copy from the store's image): a build's package installed with
    /// `pip install --target DIR`. Unset: the engine's own environment must provide `kvcache`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_dir: Option<std::path::PathBuf>,
}

/// What runs as a replica in the local runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineMode {
    /// `kv-store engine-sim` with exactly the injection: runs anywhere, in seconds.
    #[default]
    Simulated,
    /// The engine's own command (`vllm serve <model>`, SGLang's launcher) with the injection,
    /// when that command is installed and the model is a local directory; otherwise the
    /// simulator, and the deployment's phase message says why.
    Real,
}

/// The kv-cache settings (the reference's `Setting` objects of the same names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    /// `kv-cache-backend-image`: used when a backend names no image. May be blank, which makes
    /// backends without an image refused.
    #[serde(default = "default_backend_image")]
    pub kv_cache_backend_image: String,
    /// `model-deployment-kv-cache-dtype-owned`: the Binding's dtype is handed to engines, so
    /// `auto` is refused on new Bindings and `--kv-cache-dtype` is refused in attached roles.
    #[serde(default = "yes")]
    pub model_deployment_kv_cache_dtype_owned: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            kv_cache_backend_image: default_backend_image(),
            model_deployment_kv_cache_dtype_owned: true,
        }
    }
}

/// A named shape a ModelDeployment role runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceType {
    pub name: String,
    /// Whole accelerators one replica may use; 0 means the type has none.
    #[serde(default)]
    pub accelerators: u32,
    /// Who makes the accelerators (`nvidia`, `amd`, `ascend`, ...): in a cluster it names the
    /// device-plugin resource and, with `runtimeVersion`, the runner image of roles without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// The accelerator runtime's version on the type's nodes (`12.9` for CUDA 12.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
}

fn default_backend_image() -> String {
    DEFAULT_BACKEND_IMAGE.to_owned()
}

fn yes() -> bool {
    true
}

fn default_instance_types() -> Vec<InstanceType> {
    vec![
        InstanceType {
            name: "local-small".into(),
            accelerators: 1,
            manufacturer: None,
            runtime_version: None,
        },
        InstanceType {
            name: "local-cpu".into(),
            accelerators: 0,
            manufacturer: None,
            runtime_version: None,
        },
    ]
}

/// The configuration as it is now, shared by admission, the controllers and the runtime. With a
/// file behind it ([`Live::watch`]), the file is read again when it changes: in a cluster it is a
/// mounted ConfigMap, which the kubelet updates in place. A change that does not parse is
/// reported and the previous configuration stays.
#[derive(Clone, Debug)]
pub struct Live(Arc<RwLock<Arc<Config>>>);

impl Default for Live {
    fn default() -> Self {
        Live::new(Config::default())
    }
}

impl Live {
    pub fn new(config: Config) -> Live {
        Live(Arc::new(RwLock::new(Arc::new(config))))
    }

    pub fn get(&self) -> Arc<Config> {
        self.0.read().clone()
    }

    pub fn set(&self, config: Config) {
        *self.0.write() = Arc::new(config);
    }

    /// Re-reads `path` every [`RELOAD_INTERVAL`] when it changed ([`Live::refresh`]), for as
    /// long as the returned task runs.
    pub fn watch(&self, path: PathBuf) -> tokio::task::JoinHandle<()> {
        let live = self.clone();
        // What was loaded is what the file holds now; a change from here on is read again.
        let mut seen = FileStamp::of(&path);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD_INTERVAL).await;
                match live.refresh(&path, &mut seen) {
                    Ok(true) => {
                        tracing::info!(file = %path.display(), "configuration changed: new settings apply from now on");
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!("the configuration changed but {e}; keeping the previous one"),
                }
            }
        })
    }

    /// Reads `path` again if it changed since `seen`; `Ok(true)` when a different configuration
    /// now applies. A file that does not parse leaves the current one in place.
    pub fn refresh(&self, path: &Path, seen: &mut FileStamp) -> Result<bool, ConfigError> {
        let now = FileStamp::of(path);
        if now == *seen {
            return Ok(false);
        }
        *seen = now;
        let c = Config::load(Some(path))?;
        if *self.get() == c {
            return Ok(false);
        }
        self.set(c);
        Ok(true)
    }
}

/// What tells a file changed: its modification time and length (`None` while it is missing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp(Option<(Option<std::time::SystemTime>, u64)>);

impl FileStamp {
    pub fn of(path: &Path) -> FileStamp {
        FileStamp(std::fs::metadata(path).ok().map(|m| (m.modified().ok(), m.len())))
    }
}

/// How often a watched configuration file is looked at.
pub const RELOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid configuration: {message}")]
    Parse { path: String, message: String },
}

impl Config {
    /// Loads a configuration file; a missing path gives the defaults.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        yaml_serde::from_str(&text).map_err(|e| ConfigError::Parse {
            path: shown,
            message: e.to_string(),
        })
    }

    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_applies_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "settings:\n  kvCacheBackendImage: a:1\n").unwrap();
        let live = Live::new(Config::load(Some(&path)).unwrap());
        let mut seen = FileStamp::of(&path);
        assert!(!live.refresh(&path, &mut seen).unwrap(), "nothing changed");
        std::fs::write(&path, "settings:\n  kvCacheBackendImage: b:22\n").unwrap();
        assert!(live.refresh(&path, &mut seen).unwrap(), "the new image applies");
        assert_eq!(live.get().settings.kv_cache_backend_image, "b:22");
        std::fs::write(&path, "settings: [not, a, map]\n").unwrap();
        assert!(live.refresh(&path, &mut seen).is_err());
        assert_eq!(
            live.get().settings.kv_cache_backend_image,
            "b:22",
            "a broken file keeps the last"
        );
    }

    #[test]
    fn defaults_and_file() {
        let c = Config::default();
        assert_eq!(c.settings.kv_cache_backend_image, DEFAULT_BACKEND_IMAGE);
        assert!(c.instance_type("local-small").is_some());
        let c: Config = yaml_serde::from_str("settings:\n  kvCacheBackendImage: ''\n").unwrap();
        assert_eq!(c.settings.kv_cache_backend_image, "");
        assert!(c.settings.model_deployment_kv_cache_dtype_owned);
        assert!(yaml_serde::from_str::<Config>("bogus: 1\n").is_err());
        assert_eq!(c.local_runtime.engines, EngineMode::Simulated);
        let c: Config =
            yaml_serde::from_str("localRuntime:\n  engines: real\n  path: [/v/bin]\n  packageDir: /p\n").unwrap();
        assert_eq!(c.local_runtime.engines, EngineMode::Real);
        assert_eq!(c.local_runtime.package_dir.as_deref(), Some(Path::new("/p")));
        assert!(yaml_serde::from_str::<Config>("localRuntime:\n  engines: fast\n").is_err());
    }
}
