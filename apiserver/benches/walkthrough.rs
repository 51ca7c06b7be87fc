//! How long the walkthrough takes to happen on this machine, with the real manifests (two 8Gi
//! members): `kubectl apply` of step 1 until `kubectl get kvcb` would show `Ready` with the full
//! `16Gi`, and `kubectl apply` of step 3 (after step 2 is granted) until the deployment's
//! `CacheAttached` is `True`. Five runs, each on a fresh `kv-apiserver serve` with the local
//! runtime; the medians are printed. This is a report: nothing is asserted about the numbers.
//!
//! Run with `cargo build --release -p kvcache-store && cargo bench -p kvcache-apiserver --bench
//! walkthrough` (the server starts the `kv-store` next to its own binary).

mod live;

use std::time::{Duration, Instant};

use live::{kubectl, manifest, start, until};

const RUNS: usize = 5;

fn run() -> anyhow::Result<(Duration, Duration)> {
    let s = start()?;
    let d = s.dir.path();
    let apply = |file: &str| -> anyhow::Result<Instant> {
        let t = Instant::now();
        kubectl(d, &["apply", "-f", &manifest(file).display().to_string()])?;
        Ok(t)
    };
    let t1 = apply("01-backend.yaml")?;
    let ready = until(
        d,
        &["kvcb", "mooncake-dram"],
        "{.status.phase} {.status.capacity.total}",
        "Ready 16Gi",
    )?;
    apply("02-pool-binding.yaml")?;
    until(
        d,
        &["-n", "team-a", "kvcpb", "team-a"],
        "{.status.conditions[?(@.type==\"QuotaGranted\")].status} {.status.effectiveQuota}",
        "True 8Gi",
    )?;
    let t3 = apply("03-model-deployment.yaml")?;
    let attached = until(
        d,
        &["-n", "team-a", "md", "qwen-chat"],
        "{.status.conditions[?(@.type==\"CacheAttached\")].status}",
        "True",
    )?;
    Ok((ready - t1, attached - t3))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    println!("the walkthrough on the local runtime (two stand-in nodes, 8Gi members), {RUNS} runs, fresh server each");
    let (mut ready, mut attached) = (Vec::new(), Vec::new());
    for i in 1..=RUNS {
        let (r, a) = run()?;
        println!(
            "run {i}: step 1 apply -> Ready 16Gi {:.2} s; step 3 apply -> CacheAttached {:.2} s",
            r.as_secs_f64(),
            a.as_secs_f64()
        );
        ready.push(r);
        attached.push(a);
    }
    println!(
        "median: step 1 -> Ready with full CAPACITY {:.2} s; step 3 -> CacheAttached {:.2} s",
        median(&mut ready).as_secs_f64(),
        median(&mut attached).as_secs_f64()
    );
    Ok(())
}
