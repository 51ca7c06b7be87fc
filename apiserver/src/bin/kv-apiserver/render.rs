//! `kv-apiserver render`: the Kubernetes objects the controllers would apply for the backends in
//! manifest files, printed as YAML, computed offline.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kvcache_apiserver::config::Config;
use kvcache_apiserver::manifest;

/// Prints the Kubernetes objects the controllers render for the backends in manifest files
/// (a file or a directory of .yaml files), as YAML, for review before applying them.
#[derive(Args)]
pub struct RenderArgs {
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
    /// The namespace of the store's objects.
    #[arg(long, default_value = "gpustack-system")]
    store_namespace: String,
}

/// `kv-apiserver render`: the manifests in `files`, as the controllers would render them.
pub fn run(args: &RenderArgs, config: &Config) -> anyhow::Result<()> {
    let mut docs = Vec::new();
    for file in super::offline::manifest_files(&args.files)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for doc in manifest::documents(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))? {
            docs.push((file.display().to_string(), doc.value));
        }
    }
    let out = kvcache_apiserver::render::render(&docs, &args.store_namespace, config).map_err(anyhow::Error::msg)?;
    print!("{out}");
    Ok(())
}
