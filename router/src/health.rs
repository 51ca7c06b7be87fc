//! The periodic health check: every worker's `GET /health` each `--health-interval-ms` (and at
//! once when workers are added). `--unhealthy-after` failures in a row (checks or connections a
//! request made) take a worker out; one passing check brings it back.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::server::App;
use crate::upstream;
use crate::workers::Worker;

/// Checks every worker until `cancel` fires.
pub async fn run(app: Arc<App>, cancel: CancellationToken) {
    let interval = app.config.health_interval();
    // a check may take as long as the interval, within 1..5 s
    let timeout = interval.clamp(Duration::from_secs(1), Duration::from_secs(5));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
            () = app.pool.added.notified() => {}
        }
        let workers = app.pool.all();
        join_all(workers.iter().map(|w| check(&app, w, timeout))).await;
    }
}

async fn check(app: &App, worker: &Arc<Worker>, timeout: Duration) {
    let call = async {
        let response = app
            .upstream
            .get(&worker.url, "/health")
            .await
            .map_err(|e| e.to_string())?;
        // read to the end, so that the connection is kept for the next check
        let (status, _) = upstream::read_body(response, 64 << 10).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("/health answered {status}"))
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(())) => app.pool.succeeded(worker),
        Ok(Err(why)) => app.pool.failed(worker, &why),
        Err(_) => app.pool.failed(worker, "/health did not answer in time"),
    }
}
