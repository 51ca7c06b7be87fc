//! `kv-apiserver render`: the Kubernetes objects the controllers would apply for the backends in
//! manifest files, printed as YAML, computed offline, once every object passed the server's
//! admission (`kvcache_apiserver::render::admit`).

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use kvcache_apiserver::config::Config;
use kvcache_apiserver::manifest;

/// Prints the Kubernetes objects the controllers render for the backends in manifest files
/// (a file or a directory of .yaml files), as YAML, for review before applying them. Objects the
/// server would refuse are refused here with its words, and nothing is printed.
#[derive(Args)]
pub struct RenderArgs {
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
    /// The namespace of the store's objects.
    #[arg(long, default_value = "gpustack-system")]
    store_namespace: String,
}

/// Admits the manifests' objects, then prints what they render.
pub async fn run(args: &RenderArgs, config: &Config) -> anyhow::Result<()> {
    let mut docs = Vec::new();
    for file in super::offline::manifest_files(&args.files)? {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        for doc in manifest::documents(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))? {
            docs.push((file.display().to_string(), doc));
        }
    }
    let admitted = match kvcache_apiserver::render::admit(docs, config).await {
        Ok(admitted) => admitted,
        Err(refusals) => {
            for r in &refusals {
                eprintln!("{r}");
            }
            bail!("{} object(s) were refused; nothing rendered", refusals.len());
        }
    };
    let out =
        kvcache_apiserver::render::render(&admitted, &args.store_namespace, config).map_err(anyhow::Error::msg)?;
    print!("{out}");
    Ok(())
}
