#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn statuses_are_classed() {
    // (status, permanent, unavailable)
    for (code, permanent, unavailable) in [
        (400, true, false),
        (401, false, true),
        (403, false, true),
        (404, true, false),
        (422, true, false),
        (301, true, false),
        (408, false, true),
        (429, false, true),
        (500, false, false),
        (502, false, true),
        (503, false, true),
    ] {
        let e = classify(
            StatusCode::from_u16(code).unwrap(),
            DEFAULT_UNAVAILABLE_STATUSES,
            "m".into(),
        );
        assert_eq!(e.is_permanent(), permanent, "{code}");
        assert_eq!(e.is_unavailable(), unavailable, "{code}");
    }
    let custom = classify(StatusCode::from_u16(500).unwrap(), &[500], "m".into());
    assert!(custom.is_unavailable(), "configurable");
}

#[test]
fn url_values_are_percent_encoded() {
    let mut out = String::new();
    percent_encode("a b/c?d=é", &mut out);
    assert_eq!(out, "a%20b%2Fc%3Fd%3D%C3%A9");
}

#[test]
fn bad_urls_and_headers_are_config_errors() {
    let err = WebhookSink::new(WebhookConfig::new("ftp://x/{event_type}".parse().unwrap()))
        .err()
        .unwrap();
    assert!(err.to_string().contains("url"), "{err}");
    let mut config = WebhookConfig::new("http://127.0.0.1:1/x".parse().unwrap());
    config.headers.insert("bad header".into(), "v".into());
    assert!(WebhookSink::new(config).is_err());
}

#[tokio::test]
async fn without_a_url_of_its_own_only_a_route_gives_one() {
    let mut config = WebhookConfig::new("http://127.0.0.1:1/x".parse().unwrap());
    config.url = None;
    let sink = WebhookSink::new(config).unwrap();
    let event = crate::test_event::event(1, true, None);
    let err = sink.publish(&event).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("no `url` of its own"), "{err}");
    // A route's template is rendered with percent-encoded values.
    let mut odd = event.clone();
    odd.aggregate_id = Some("a b/c".into());
    let url = sink
        .url(
            &odd,
            Some(&"https://h.example/{aggregate_id}".parse().unwrap()),
        )
        .unwrap();
    assert_eq!(url.as_str(), "https://h.example/a%20b%2Fc");
}

#[test]
fn route_urls_are_checked_like_the_sinks_own() {
    assert!(check_url(&"https://h.example/{event_type}".parse().unwrap()).is_ok());
    assert!(check_url(&"https://h.example/fixed".parse().unwrap()).is_ok());
    for bad in [
        "h.example/{event_type}",
        "ftp://h.example/x",
        "{event_type}",
    ] {
        assert!(check_url(&bad.parse().unwrap()).is_err(), "{bad}");
    }
}

#[test]
fn envelope_carries_metadata_and_the_raw_payload() {
    let mut e = crate::test_event::event(9, true, Some("acme"));
    e.idempotency_key = Some("k-1".into());
    let json: serde_json::Value =
        serde_json::from_slice(&serde_json::to_vec(&Envelope::of(&e)).unwrap()).unwrap();
    assert_eq!(json["id"], 9);
    assert_eq!(json["dedup_id"], "k-1");
    assert_eq!(json["tenant"], "acme");
    assert_eq!(json["created_at"], "2026-04-24T10:00:00.000Z");
    assert_eq!(json["payload"]["amount_cents"], 1200);
}

#[test]
fn redacts_credentials() {
    let url = Url::parse("https://u:p@example.com/x").unwrap();
    assert_eq!(redact_url(&url), "https://example.com/x");
    let url = Url::parse("https://example.com/x?token=s3cret&tenant=acme").unwrap();
    assert_eq!(
        redact_url(&url),
        "https://example.com/x?token=***&tenant=acme"
    );
}

#[tokio::test]
async fn dot_segments_in_the_url_are_refused_for_that_event() {
    let sink = WebhookSink::new(WebhookConfig::new(
        "https://hooks.example/customers/{aggregate_id}/events"
            .parse()
            .unwrap(),
    ))
    .unwrap();
    for id in ["..", ".", "%2e%2E", ".%2e", "%2E."] {
        let event = crate::test_event::event(7, false, None);
        let mut event = event;
        event.aggregate_id = Some(id.to_owned());
        let err = sink.publish(&event).await.unwrap_err();
        assert!(err.is_permanent(), "{id}: {err}");
        assert!(err.to_string().contains("dot segment"), "{id}: {err}");
    }
    assert!(is_dot_segment(".."));
    assert!(!is_dot_segment("..."));
    assert!(!is_dot_segment("a.."));
}

#[tokio::test]
async fn a_secret_in_the_url_query_is_never_in_an_error() {
    let mut config = WebhookConfig::new(
        "http://127.0.0.1:1/in/{event_type}?token=s3cret-t0ken"
            .parse()
            .unwrap(),
    );
    config.publish_timeout = Duration::from_secs(1);
    let sink = WebhookSink::new(config).unwrap();
    let err = sink
        .publish(&crate::test_event::event(7, false, None))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
    assert!(err.to_string().contains("token=***"), "{err}");
}
