//! Server configuration that admission reads: the kv-cache settings and the instance types that
//! a ModelDeployment role's `instanceType` resolves to.
//!
//! Loaded from a YAML file (`--config`); every field has a default so an absent file means the
//! defaults below.
//!
//! ```yaml
//! settings:
//!   kvCacheBackendImage: gpustack/mirrored-mooncake:0.3.13.post1-cpu
//!   modelDeploymentKvCacheDtypeOwned: true
//! instanceTypes:
//!   - name: local-small
//!     accelerators: 1
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The image every backend role runs when the backend names none.
pub const DEFAULT_BACKEND_IMAGE: &str = "gpustack/mirrored-mooncake:0.3.13.post1-cpu";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub settings: Settings,
    #[serde(default = "default_instance_types")]
    pub instance_types: Vec<InstanceType>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            settings: Settings::default(),
            instance_types: default_instance_types(),
        }
    }
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
    fn defaults_and_file() {
        let c = Config::default();
        assert_eq!(c.settings.kv_cache_backend_image, DEFAULT_BACKEND_IMAGE);
        assert!(c.instance_type("local-small").is_some());
        let c: Config = yaml_serde::from_str("settings:\n  kvCacheBackendImage: ''\n").unwrap();
        assert_eq!(c.settings.kv_cache_backend_image, "");
        assert!(c.settings.model_deployment_kv_cache_dtype_owned);
        assert!(yaml_serde::from_str::<Config>("bogus: 1\n").is_err());
    }
}
