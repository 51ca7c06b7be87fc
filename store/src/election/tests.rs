use std::sync::Arc;

use parking_lot::Mutex;

use super::memory::Memory;
use super::*;

fn quick() -> Timings {
    Timings {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(50),
    }
}

type Log = Arc<Mutex<Vec<(Instant, Event)>>>;

fn start(
    store: Arc<Memory>,
    id: &'static str,
    timings: Timings,
) -> (Log, CancellationToken, tokio::task::JoinHandle<()>) {
    let log: Log = Arc::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (log, stop) = (log.clone(), stop.clone());
        async move {
            campaign(
                &*store,
                "b-leader",
                id,
                timings,
                |e| log.lock().push((Instant::now(), e)),
                stop,
            )
            .await;
        }
    });
    (log, stop, task)
}

fn leads(log: &Log) -> Option<u64> {
    let mut term = None;
    for (_, e) in log.lock().iter() {
        match e {
            Event::Elected { epoch, .. } => term = Some(*epoch),
            Event::Renewed { .. } => {}
            Event::Deposed => term = None,
        }
    }
    term
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    crate::eventually::eventually_async(Duration::from_secs(10), what, || std::future::ready(f())).await
}

#[tokio::test]
async fn one_leads_the_others_wait_and_a_release_hands_over_at_once() {
    let store = Arc::new(Memory::default());
    let (a, a_stop, a_task) = start(store.clone(), "a", quick());
    until("a leads", || leads(&a).is_some()).await;
    assert_eq!(leads(&a), Some(0), "the first term is 0");
    let (b, _b_stop, _b_task) = start(store.clone(), "b", quick());
    let (c, _c_stop, _c_task) = start(store.clone(), "c", quick());
    // a renews past more than a lease while the others campaign (30 renewals at 50 ms)
    let renewals = |log: &Log| {
        log.lock()
            .iter()
            .filter(|(_, e)| matches!(e, Event::Renewed { .. }))
            .count()
    };
    let before = renewals(&a);
    until("a renews", || renewals(&a) >= before + 30).await;
    assert_eq!((leads(&b), leads(&c)), (None, None), "a renews; nobody takes over");
    assert!(
        a.lock()
            .iter()
            .filter(|(_, e)| matches!(e, Event::Renewed { .. }))
            .count()
            >= 5
    );

    // a graceful stop: deposed first, then released; a standby takes over well inside a lease
    let t0 = Instant::now();
    a_stop.cancel();
    a_task.await.unwrap();
    assert_eq!(a.lock().last().map(|(_, e)| *e), Some(Event::Deposed));
    until("b or c leads", || leads(&b).is_some() || leads(&c).is_some()).await;
    assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
    let next = leads(&b).or(leads(&c));
    assert_eq!(next, Some(1), "the term rose by one");
    assert_eq!(store.stored().unwrap().spec.unwrap().lease_transitions, Some(1));
}

/// One candidate's path to the shared Lease, which can be cut (a partition).
struct View {
    store: Arc<Memory>,
    cut: std::sync::atomic::AtomicBool,
}

impl View {
    fn check(&self) -> Result<(), LeaseError> {
        if self.cut.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LeaseError::Other("partitioned".into()));
        }
        Ok(())
    }
}

#[async_trait]
impl LeaseStore for View {
    async fn get(&self) -> Result<Option<Lease>, LeaseError> {
        self.check()?;
        self.store.get().await
    }
    async fn create(&self, l: Lease) -> Result<Lease, LeaseError> {
        self.check()?;
        self.store.create(l).await
    }
    async fn update(&self, l: Lease) -> Result<Lease, LeaseError> {
        self.check()?;
        self.store.update(l).await
    }
}

#[tokio::test]
async fn a_holder_that_cannot_renew_stops_before_anyone_else_starts() {
    let store = Arc::new(Memory::default());
    let view = |s: &Arc<Memory>| {
        Arc::new(View {
            store: s.clone(),
            cut: false.into(),
        })
    };
    let (a_view, b_view) = (view(&store), view(&store));
    let run = |v: Arc<View>, id: &'static str| {
        let log: Log = Arc::default();
        let l = log.clone();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(
            async move { campaign(&*v, "b-leader", id, quick(), |e| l.lock().push((Instant::now(), e)), s).await },
        );
        (log, stop)
    };
    let (a, _a_stop) = run(a_view.clone(), "a");
    until("a leads", || leads(&a).is_some()).await;
    let (b, _b_stop) = run(b_view, "b");
    // b campaigns while a keeps renewing
    let renewals = || {
        a.lock()
            .iter()
            .filter(|(_, e)| matches!(e, Event::Renewed { .. }))
            .count()
    };
    let before = renewals();
    until("a renews", || renewals() >= before + 6).await;
    assert_eq!(leads(&b), None);
    a_view.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    until("b leads", || leads(&b).is_some()).await;
    let b_elected = b
        .lock()
        .iter()
        .find_map(|(at, e)| matches!(e, Event::Elected { .. }).then_some(*at))
        .unwrap();
    let last_until = a
        .lock()
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Elected { until, .. } | Event::Renewed { until } => Some(*until),
            Event::Deposed => None,
        })
        .next_back()
        .unwrap();
    let a_deposed = a
        .lock()
        .iter()
        .find_map(|(at, e)| matches!(e, Event::Deposed).then_some(*at))
        .expect("a stepped down");
    assert!(
        last_until + Duration::from_millis(300) <= b_elected,
        "a's serving deadline passed well before b was elected"
    );
    assert!(a_deposed < b_elected, "a stepped down before b was elected");
    assert_eq!(leads(&b), Some(1));
    assert_eq!(leads(&a), None);
}

#[tokio::test]
async fn expiry_is_judged_from_when_the_record_changed_on_the_local_clock() {
    let store = Arc::new(Memory::default());
    // a holder that wrote a renewTime far in the past and then died
    let mut dead = Candidate {
        name: "b-leader",
        identity: "dead",
        timings: quick(),
        observed: None,
        term: None,
        renewed: None,
        transitions_seen: 4,
    }
    .record(None, 4, None);
    if let Some(s) = dead.spec.as_mut() {
        s.renew_time = Some(MicroTime("2000-01-01T00:00:00Z".parse().unwrap()));
    }
    store.put(dead);
    let t0 = Instant::now();
    let (b, _b_stop, _b_task) = start(store.clone(), "b", quick());
    until("b leads", || leads(&b).is_some()).await;
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "an old renewTime does not shorten the wait: {:?}",
        t0.elapsed()
    );
    assert_eq!(leads(&b), Some(5));
}

#[test]
fn timings_are_checked() {
    assert!(Timings::CLIENT_GO.validate().is_ok());
    assert!(quick().validate().is_ok());
    let half = Timings {
        lease_duration: Duration::from_millis(1500),
        ..quick()
    };
    assert!(half.validate().unwrap_err().contains("whole number"));
    let late = Timings {
        renew_deadline: Duration::from_secs(2),
        ..quick()
    };
    assert!(late.validate().unwrap_err().contains("renew deadline"));
}
