#![allow(clippy::unwrap_used)]
use super::*;

fn notice(tenant: &str, id: i64) -> FailedNotice {
    FailedNotice::new(tenant, id, "OrderPlaced", 5, "HTTP 422")
}

fn config() -> AlertConfig {
    AlertConfig {
        repeat_after: Duration::from_secs(600),
        sink_down_after: Duration::from_secs(60),
        ..AlertConfig::default()
    }
}

#[test]
fn a_burst_of_failures_is_one_alert_then_a_summary() {
    let mut p = Policy::new(config());
    let t0 = Instant::now();
    let first = p.failed(&notice("acme", 1), t0);
    assert_eq!(first.len(), 1);
    assert!(first[0].text.contains("event 1"), "{}", first[0].text);
    for id in 2..=1000 {
        assert!(
            p.failed(&notice("acme", id), t0 + Duration::from_secs(1))
                .is_empty()
        );
    }
    // Another tenant is another subject.
    assert_eq!(p.failed(&notice("other", 5), t0).len(), 1);
    // Before repeat_after: nothing; after: one summary of the 999.
    assert!(
        p.checks(Vec::new(), t0 + Duration::from_secs(300))
            .is_empty()
    );
    let summary = p.checks(Vec::new(), t0 + Duration::from_secs(601));
    assert_eq!(summary.len(), 1);
    assert!(summary[0].text.contains("999 more"), "{}", summary[0].text);
    assert!(
        summary[0].text.contains("event 1000"),
        "{}",
        summary[0].text
    );
    assert!(
        p.checks(Vec::new(), t0 + Duration::from_secs(1300))
            .is_empty()
    );
}

#[test]
fn a_sink_alerts_once_down_long_enough_and_once_back_up() {
    let mut p = Policy::new(config());
    let t0 = Instant::now();
    let since = chrono::Utc::now() - chrono::Duration::seconds(30);
    let down = SinkHealth::new("kafka", false, since, Some("connection refused".into()));
    assert!(p.sink(&down, t0).is_none(), "down 30s, threshold 60s");
    let since = chrono::Utc::now() - chrono::Duration::seconds(90);
    let down = SinkHealth::new("kafka", false, since, Some("connection refused".into()));
    let alert = p.sink(&down, t0).unwrap();
    assert_eq!(alert.kind, "sink_down");
    assert!(alert.text.contains("connection refused"), "{}", alert.text);
    for s in 1..100 {
        assert!(p.sink(&down, t0 + Duration::from_secs(s)).is_none());
    }
    assert!(p.sink(&down, t0 + Duration::from_secs(601)).is_some());
    let up = SinkHealth::new("kafka", true, chrono::Utc::now(), None);
    assert_eq!(
        p.sink(&up, t0 + Duration::from_secs(602)).unwrap().kind,
        "sink_up"
    );
    assert!(p.sink(&up, t0 + Duration::from_secs(603)).is_none());
}

#[test]
fn an_old_backlog_alerts_and_resolves() {
    let mut p = Policy::new(AlertConfig {
        backlog_age_over: Some(Duration::from_secs(60)),
        ..config()
    });
    let t0 = Instant::now();
    assert!(
        p.backlog("acme", Some(Duration::from_secs(5)), 3, t0)
            .is_none()
    );
    let old = p
        .backlog("acme", Some(Duration::from_secs(61)), 3, t0)
        .unwrap();
    assert_eq!(old.kind, "backlog_old");
    assert!(
        p.backlog("acme", Some(Duration::from_secs(62)), 3, t0)
            .is_none()
    );
    let ok = p.backlog("acme", None, 0, t0).unwrap();
    assert_eq!(ok.kind, "backlog_ok");
}

#[test]
fn the_hourly_limit_holds_and_says_so() {
    let mut p = Policy::new(AlertConfig {
        max_per_hour: 2,
        ..config()
    });
    let t0 = Instant::now();
    let mut sent = 0;
    for i in 0..10 {
        sent += p.failed(&notice(&format!("t{i}"), 1), t0).len();
    }
    assert_eq!(sent, 2);
    let later = p.failed(&notice("late", 1), t0 + Duration::from_secs(3601));
    assert!(
        later[0].text.contains("8 alerts were held back"),
        "{}",
        later[0].text
    );
}

#[test]
fn webhooks_must_be_http_urls() {
    let err = Alerts::new(AlertConfig {
        webhook: Some("ftp://user:pw@host/x".to_owned()),
        ..AlertConfig::default()
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("http://"), "{err}");
    assert!(!err.contains("pw"), "{err}");
}
