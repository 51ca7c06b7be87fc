//! `kv-apiserver certs`: the certificates of an aggregated install (the serving certificate and
//! its CA, the APIService's caBundle patch, and the storage's etcd certificates).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

/// Writes the certificates of an aggregated install into --out: the serving certificate
/// (tls.crt, tls.key) for <service>.<namespace>.svc, its CA (ca.crt, ca.key; kept, so running
/// this again rotates the serving certificate under the same CA), and apiservice-cabundle.yaml,
/// the APIService's caBundle as a patch that deploy/ applies.
#[derive(Args)]
pub struct CertsArgs {
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "kvcache-apiserver")]
    service: String,
    #[arg(long, default_value = "gpustack-system")]
    namespace: String,
    /// More DNS names or IP addresses for the serving certificate, comma-separated.
    #[arg(long, value_delimiter = ',')]
    extra_names: Vec<String>,
}

/// `kv-apiserver certs`.
pub fn run(args: &CertsArgs) -> anyhow::Result<()> {
    let (out, service, namespace, extra) = (&args.out, &args.service, &args.namespace, &args.extra_names);
    let mut names = kvcache_certs::service_names(service, namespace);
    // The names kube-apiserver's aggregator verifies come first; the CN is the first.
    names.rotate_left(2);
    names.extend(extra.iter().filter(|n| !n.is_empty()).cloned());
    let install = kvcache_certs::install(out, &names).context("writing the certificates")?;
    use base64::Engine as _;
    let bundle = base64::engine::general_purpose::STANDARD.encode(install.ca_pem.as_bytes());
    let patch = format!(
        "# Written by kv-apiserver certs: the CA of the serving certificate, which kube-apiserver\n\
         # uses to verify this server. Run it again to rotate the serving certificate.\n\
         apiVersion: apiregistration.k8s.io/v1\n\
         kind: APIService\n\
         metadata:\n  name: v1.{group}\n\
         spec:\n  caBundle: {bundle}\n",
        group = kvcache_api::GROUP
    );
    kvcache_certs::write_file(&out.join("apiservice-cabundle.yaml"), patch.as_bytes(), 0o644)?;
    // deploy/etcd.yaml's member, reached through its headless Service, takes only this server.
    let etcd = format!("kvcache-etcd.{namespace}.svc");
    let etcd_names = vec![
        format!("kvcache-etcd-0.{etcd}"),
        format!("*.{etcd}"),
        etcd.clone(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    kvcache_certs::install_etcd(out, &etcd_names).context("writing the storage's certificates")?;
    println!(
        "wrote {dir}/tls.crt and tls.key (for {}), ca.crt and apiservice-cabundle.yaml; \
         etcd-ca.crt, etcd-server.crt and .key (for {}), etcd-client.crt and .key",
        names.join(", "),
        etcd_names.join(", "),
        dir = out.display()
    );
    Ok(())
}
