//! `postbox bench --quick` as a smoke test: every phase runs and its checks hold (no assertions
//! on speed).

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use postbox_bench::{BenchOptions, CdcOutcome, run};

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
    assert_eq!(report.enqueue.len(), 2);
    for e in &report.enqueue {
        assert!(e.without_event.count > 0 && e.second_row.count > 0 && e.with_event.count > 0);
        let each = e
            .with_event_notify_each
            .expect("NOTIFY each commit on PostgreSQL");
        assert!(each.count > 0 && e.notify_each_pct.is_some());
        let in_statement = e
            .with_event_in_statement
            .expect("the event in the business statement on PostgreSQL");
        assert!(
            in_statement.count > 0
                && e.in_statement_pct.is_some()
                && e.in_statement_over_second_row_pct.is_some()
        );
    }
    let modes: Vec<&str> = report.latency.iter().map(|r| r.mode.as_str()).collect();
    assert_eq!(
        modes,
        [
            "NOTIFY ≤50ms + busy poll 10ms",
            "NOTIFY each commit",
            "no NOTIFY (plain SQL), from idle: head check 10ms + busy poll 10ms",
            "poll every 100ms"
        ]
    );
    for run in &report.latency {
        let p = &run.percentiles;
        assert!(p.samples > 0 && p.p99_ms >= p.p50_ms, "{}", run.mode);
    }
    if report.backend == "postgres" {
        let history = report.history.as_ref().expect("history on PostgreSQL");
        assert!(history.windows.len() >= 2, "{history:?}");
        assert!(
            history.archived_at_end > 0,
            "the due half of the history was archived"
        );
        assert!(
            history
                .windows
                .iter()
                .all(|w| w.claim_p99_ms > 0.0 && w.table_mib > 0.0)
        );
    }
    let soak = report.soak.as_ref().expect("soak");
    assert_eq!(soak.windows_per_second.len(), 4);
    assert_eq!(soak.vacuum_threshold, Some(50_000), "the default");
    if report.backend == "postgres" {
        // The test server runs wal_level = logical (scripts/services): the comparison is
        // measured, not reported unavailable.
        let cdc = match report
            .cdc
            .as_ref()
            .expect("the CDC comparison on PostgreSQL")
        {
            CdcOutcome::Measured(cdc) => cdc,
            other => panic!("CDC not measured: {other:?}"),
        };
        for drained in [cdc.poll, cdc.cdc, cdc.poll_held, cdc.cdc_held, cdc.ceiling] {
            assert_eq!(drained.count, 2_000, "{cdc:?}");
        }
        for p in [
            &cdc.latency_poll,
            &cdc.latency_cdc,
            &cdc.latency_cdc_tenant,
            &cdc.deploy.latency,
        ] {
            assert!(p.samples > 0 && p.p99_ms >= p.p50_ms, "{cdc:?}");
        }
        // A rolling deploy repeats at most what the old relay held when it was stopped.
        assert!(
            cdc.deploy.events > 0 && cdc.deploy.repeats <= cdc.deploy.in_flight,
            "{:?}",
            cdc.deploy
        );
        assert!(
            cdc.wal.written_mib > 0.0 && cdc.wal.catch_up_seconds > 0.0,
            "{cdc:?}"
        );
        // The run's slot is gone with it: nothing keeps WAL on the server afterwards.
        let pool = sqlx::PgPool::connect(&postbox_testkit::admin_url())
            .await
            .unwrap();
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1")
                .bind(&cdc.slot)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(left, 0, "slot {} left behind", cdc.slot);
    }
    // The tenants phase: the default schema, a relay from its start, the rate, a slow
    // destination, and the others beside one tenant's backlog, whose rate is reported.
    let tenants = &report.tenants[0];
    assert_eq!(tenants.latency.len(), 5, "{tenants:?}");
    assert!(
        tenants.latency[..4]
            .iter()
            .all(|l| l.backlog_per_s.is_none())
    );
    assert!(tenants.latency[4].backlog_per_s.is_some(), "{tenants:?}");
    let table = report.table();
    for part in [
        "measured after 0.5 s of the same load",
        "from its start (no warm-up)",
        "the backlog's tenant meanwhile",
        "ceiling",
        "2nd row",
        "in stmt",
        "NOTIFY each",
        "NOTIFY each commit",
        "relay vacuum at 50000 dead rows",
        "1 business statement each",
    ] {
        assert!(table.contains(part), "{part} not in\n{table}");
    }
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["latency"][0]["percentiles"]["p50_ms"].is_number());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_bench_runs_on_sqlite() {
    let mut opts = quiet(BenchOptions::quick(None));
    opts.vacuum_threshold = None;
    opts.business_statements = 3;
    let report = run(&opts).await.unwrap();
    assert_eq!(report.backend, "sqlite");
    assert!(report.latency.is_empty());
    assert!(report.drain.iter().all(|d| d.relay.count == 2_000));
    assert!(report.enqueue.iter().all(|e| {
        e.second_row.count > 0
            && e.with_event_notify_each.is_none()
            && e.notify_each_pct.is_none()
            && e.with_event_in_statement.is_none()
    }));
    assert_eq!(report.soak.as_ref().unwrap().vacuum_threshold, None);
    assert!(report.enqueue.iter().all(|e| e.business_statements == 3));
    let table = report.table();
    assert!(table.contains("3 business statements each"), "{table}");
    assert!(table.contains("relay vacuum off"), "{table}");
    assert!(!table.contains("latency"), "{table}");
    assert!(report.cdc.is_none(), "CDC is PostgreSQL's");
}
