//! The envelope every kind shares, the static identity of each kind, and the `kube::Resource`
//! view of an object (so kube-rs clients and controllers use our types directly, no CRD).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Whether objects of a kind live in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Cluster,
    Namespaced,
}

/// The static identity of a kind: its names in URLs, discovery and messages.
pub trait Kind:
    Clone + std::fmt::Debug + PartialEq + Default + Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static
{
    type Status: Clone
        + std::fmt::Debug
        + PartialEq
        + Default
        + Serialize
        + DeserializeOwned
        + JsonSchema
        + Send
        + Sync
        + 'static;
    /// `KVCacheBackend`.
    const KIND: &'static str;
    /// `kvcachebackends`.
    const PLURAL: &'static str;
    /// `kvcachebackend`.
    const SINGULAR: &'static str;
    /// `["kvcb"]`.
    const SHORT_NAMES: &'static [&'static str];
    const SCOPE: Scope;
}

/// One object of kind `K`: `K` is the spec type, `K::Status` its status.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound = "K: Kind")]
pub struct Object<K: Kind> {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: K,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<K::Status>,
}

impl<K: Kind> Object<K> {
    /// A new object with `apiVersion` and `kind` filled in.
    pub fn new(name: &str, spec: K) -> Self {
        Object {
            api_version: crate::API_VERSION.to_owned(),
            kind: K::KIND.to_owned(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }
}

impl<K: Kind> JsonSchema for Object<K> {
    fn schema_name() -> Cow<'static, str> {
        K::KIND.into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let spec = generator.subschema_for::<K>();
        let status = generator.subschema_for::<K::Status>();
        let metadata = generator.subschema_for::<ObjectMeta>();
        schemars::json_schema!({
            "type": "object",
            "description": format!("{} ({}/{})", K::KIND, crate::GROUP, crate::VERSION),
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": metadata,
                "spec": spec,
                "status": status,
            },
            "x-kubernetes-group-version-kind": [
                {"group": crate::GROUP, "version": crate::VERSION, "kind": K::KIND}
            ]
        })
    }
}

/// Implements `kube::Resource` for `Object<$spec>` from its [`Kind`] constants, with the kube
/// scope type `$scope` (`ClusterResourceScope` or `NamespaceResourceScope`).
macro_rules! kube_resource {
    ($spec:ty, $scope:ty) => {
        impl kube_core::Resource for $crate::object::Object<$spec> {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                <$spec as $crate::object::Kind>::KIND.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                $crate::GROUP.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $crate::VERSION.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                <$spec as $crate::object::Kind>::PLURAL.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use kube_resource;
