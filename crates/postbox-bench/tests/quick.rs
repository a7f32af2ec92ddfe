//! `postbox bench --quick` as a smoke test: every phase runs and its checks hold (no assertions
//! on speed).

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use postbox_bench::{BenchOptions, run};

fn quiet(mut o: BenchOptions) -> BenchOptions {
    o.progress = false;
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_bench_runs_on_postgres() {
    let url = postbox_testkit::admin_url();
    let report = run(&quiet(BenchOptions::quick(Some(url)))).await.unwrap();
    assert_eq!(report.backend, "postgres");
    assert_eq!(report.drain.len(), 2);
    assert!(
        report
            .drain
            .iter()
            .all(|d| d.relay.count == 2_000 && d.ceiling.count == 2_000)
    );
    let notify = report.latency_notify.expect("latency with NOTIFY");
    assert!(notify.samples > 0 && notify.p99_ms >= notify.p50_ms);
    let soak = report.soak.as_ref().expect("soak");
    assert_eq!(soak.windows_per_second.len(), 4);
    assert!(report.table().contains("ceiling"));
    serde_json::to_string(&report).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_bench_runs_on_sqlite() {
    let report = run(&quiet(BenchOptions::quick(None))).await.unwrap();
    assert_eq!(report.backend, "sqlite");
    assert!(report.latency_notify.is_none());
    assert!(report.drain.iter().all(|d| d.relay.count == 2_000));
}
