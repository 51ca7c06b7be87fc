//! The offline commands over a stopped server's data directory (`apply`, `get`, `delete`): the
//! same registry and admission as the server, printed as kubectl prints them.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use kvcache_apiserver::app::{App, AppOptions};
use kvcache_apiserver::manifest::{self, ApplyError};
use kvcache_apiserver::registry::RegistryError;
use kvcache_apiserver::registry::dynamic::ListParams;
use kvcache_apiserver::registry::generic::DeleteOptions;
use kvcache_apiserver::registry::kinds::{self, KindEntry};

#[derive(Subcommand)]
pub enum Offline {
    /// Creates or updates the objects in manifest files (a file or a directory of .yaml files).
    Apply {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Namespace for namespaced objects that name none.
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Run every check, store nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Prints objects as YAML.
    Get {
        /// A kind: its short name, plural, singular or kind name (`kubectl api-resources` lists them).
        kind: String,
        name: Option<String>,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// List namespaced objects in every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Deletes an object (it stays, marked for deletion, while finalizers hold it).
    Delete {
        kind: String,
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
}

/// Opens the data directory (which no server may hold) and runs `command` on it.
pub async fn run(opts: AppOptions, command: Offline) -> anyhow::Result<()> {
    let data_dir = opts.data_dir.clone();
    let app = App::open(opts).await.with_context(|| {
        format!(
            "opening the data in {} (is kv-apiserver serve running on it?)",
            data_dir.display()
        )
    })?;
    match command {
        Offline::Apply {
            files,
            namespace,
            dry_run,
        } => apply(&app, &files, &namespace, dry_run).await,
        Offline::Get {
            kind,
            name,
            namespace,
            all_namespaces,
        } => {
            let ns = (!all_namespaces).then_some(namespace.as_str());
            get(&app, resolve(&kind)?, ns, name.as_deref()).await
        }
        Offline::Delete { kind, name, namespace } => delete(&app, resolve(&kind)?, &namespace, &name).await,
    }
}

fn resolve(word: &str) -> anyhow::Result<&'static KindEntry> {
    kinds::resolve(word).with_context(|| {
        let names: Vec<&str> = kinds::KINDS
            .iter()
            .filter_map(|k| k.short_names.first().copied())
            .collect();
        format!(
            "the server doesn't have a resource type {word:?} (try {})",
            names.join(", ")
        )
    })
}

/// The manifest files `paths` name: each file, and each directory's .yaml, .yml and .json files
/// in name order.
pub fn manifest_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json"))
                .collect();
            entries.sort();
            out.extend(entries);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

async fn apply(app: &App, files: &[PathBuf], namespace: &str, dry_run: bool) -> anyhow::Result<()> {
    let mut failed = 0;
    for file in manifest_files(files)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let docs = manifest::documents(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        for doc in docs {
            let applied = manifest::apply(&app.registry, doc, namespace, dry_run).await;
            for w in &applied.warnings {
                eprintln!("Warning: {w}");
            }
            let suffix = if dry_run { " (dry run)" } else { "" };
            match applied.result {
                Ok(manifest::Outcome::Created) => println!("{} created{suffix}", applied.object),
                Ok(manifest::Outcome::Configured) => println!("{} configured{suffix}", applied.object),
                Ok(manifest::Outcome::Unchanged) => println!("{} unchanged{suffix}", applied.object),
                Err(ApplyError::Refused { status, .. }) => {
                    failed += 1;
                    eprintln!(
                        "Error from server ({}): error when applying {}: {}",
                        status.reason.as_deref().unwrap_or_default(),
                        file.display(),
                        status.message.as_deref().unwrap_or_default()
                    );
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {}: {e}", file.display());
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} object(s) were not applied");
    }
    Ok(())
}

fn resource(app: &App, kind: &KindEntry) -> anyhow::Result<std::sync::Arc<dyn kvcache_apiserver::registry::Resource>> {
    app.registry
        .resource(kind.plural)
        .map(|(_, r)| r.clone())
        .with_context(|| format!("{} is not served", kind.plural))
}

async fn get(app: &App, kind: &KindEntry, namespace: Option<&str>, name: Option<&str>) -> anyhow::Result<()> {
    let res = resource(app, kind)?;
    let ns = if kind.namespaced() { namespace } else { None };
    let items = match name {
        Some(n) => vec![
            res.get(ns.unwrap_or_default(), n)
                .await
                .map_err(|e| report(kind, n, &e))?,
        ],
        None => {
            res.list(ns, ListParams::default())
                .await
                .map_err(|e| report(kind, "", &e))?
                .items
        }
    };
    for item in items {
        print!("---\n{}", yaml_serde::to_string(&item)?);
    }
    Ok(())
}

async fn delete(app: &App, kind: &KindEntry, namespace: &str, name: &str) -> anyhow::Result<()> {
    let res = resource(app, kind)?;
    let ns = if kind.namespaced() { namespace } else { "" };
    let removal = res
        .delete(ns, name, DeleteOptions::default())
        .await
        .map_err(|e| report(kind, name, &e))?;
    for w in &removal.warnings {
        eprintln!("Warning: {w}");
    }
    let what = format!("{}.{}/{name}", kind.singular, kvcache_api::GROUP);
    if removal.gone {
        println!("{what} deleted");
    } else {
        println!("{what} marked for deletion (finalizers hold it)");
    }
    Ok(())
}

fn report(kind: &KindEntry, name: &str, e: &RegistryError) -> anyhow::Error {
    let kvcache_apiserver::status::Refusal(_, status) = kvcache_apiserver::status::for_resource(kind.plural, name, e);
    anyhow::anyhow!(
        "Error from server ({}): {}",
        status.reason.unwrap_or_default(),
        status.message.unwrap_or_default()
    )
}
