use std::sync::Mutex;
use std::time::Duration;

use super::*;

/// Records (event id, rendered destination); answers from a script, then `Ok`.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(i64, Option<String>)>>,
    script: Mutex<Vec<Result<(), PublishError>>>,
    delay: Duration,
}

#[async_trait]
impl RoutableSink for Recorder {
    async fn publish_to(
        &self,
        event: &OutboxEvent,
        destination: Option<&Template>,
    ) -> Result<(), PublishError> {
        let rendered = destination.map(|t| t.render(event)).transpose()?;
        tokio::time::sleep(self.delay).await;
        self.seen.lock().unwrap().push((event.id, rendered));
        let mut script = self.script.lock().unwrap();
        if script.is_empty() {
            Ok(())
        } else {
            script.remove(0)
        }
    }
}

impl Recorder {
    fn seen(&self) -> Vec<(i64, Option<String>)> {
        self.seen.lock().unwrap().clone()
    }
}

fn event(id: i64, event_type: &str, aggregate_type: Option<&str>) -> OutboxEvent {
    let mut e = crate::test_event::event(id, aggregate_type.is_some(), None);
    e.event_type = event_type.to_owned();
    e.aggregate_type = aggregate_type.map(str::to_owned);
    e
}

fn t(s: &str) -> Option<Template> {
    Some(s.parse().unwrap())
}

fn g(s: &str) -> Glob {
    s.parse().unwrap()
}

#[tokio::test]
async fn an_event_goes_to_every_matching_route_with_its_destination() {
    let billing = Arc::new(Recorder::default());
    let audit = Arc::new(Recorder::default());
    let router = Router::new(
        vec![
            Route::new(
                "routes[0]",
                "billing",
                billing.clone(),
                t("billing.{aggregate_type}.{event_type}"),
            )
            .event_type(g("Invoice*"))
            .aggregate_type(g("Invoice")),
            Route::new(
                "routes[1]",
                "audit",
                audit.clone(),
                t("https://audit.example/{event_type}"),
            )
            .event_type(g("*")),
        ],
        Unmatched::Fail,
    );
    router
        .publish(&event(1, "InvoiceCreated", Some("Invoice")))
        .await
        .unwrap();
    router
        .publish(&event(2, "OrderPlaced", Some("Order")))
        .await
        .unwrap();
    // Glob on the event type matches, but not the aggregate type: audit only.
    router
        .publish(&event(3, "InvoiceCreated", Some("Receipt")))
        .await
        .unwrap();
    assert_eq!(
        billing.seen(),
        vec![(1, Some("billing.Invoice.InvoiceCreated".into()))]
    );
    // The metrics' route label: the routes that take each event.
    assert_eq!(
        router
            .route_of(&event(1, "InvoiceCreated", Some("Invoice")))
            .as_deref(),
        Some("routes[0]+routes[1]")
    );
    assert_eq!(
        router
            .route_of(&event(2, "OrderPlaced", Some("Order")))
            .as_deref(),
        Some("routes[1]")
    );
    let mut audited = audit.seen();
    audited.sort();
    assert_eq!(
        audited,
        vec![
            (1, Some("https://audit.example/InvoiceCreated".into())),
            (2, Some("https://audit.example/OrderPlaced".into())),
            (3, Some("https://audit.example/InvoiceCreated".into())),
        ]
    );
}

#[tokio::test]
async fn an_aggregate_glob_never_matches_an_event_without_aggregate() {
    let sink = Arc::new(Recorder::default());
    let route = Route::new("r", "s", sink, None).aggregate_type(g("*"));
    assert!(route.matches(&event(1, "X", Some("Invoice"))));
    assert!(!route.matches(&event(1, "X", None)));
    let open = Route::new("r", "s", Arc::new(Recorder::default()), None);
    assert!(open.matches(&event(1, "X", None)), "no globs: every event");
}

#[tokio::test]
async fn unmatched_events_fail_permanently_naming_their_type_or_take_the_default() {
    let sink: Arc<dyn RoutableSink> = Arc::new(Recorder::default());
    let routes = vec![Route::new("routes[0]", "s", sink.clone(), t("x")).event_type(g("Invoice*"))];
    let strict = Router::new(routes.clone(), Unmatched::Fail);
    let err = strict
        .publish(&event(7, "OrderPlaced", Some("Order")))
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("no route") && text.contains("\"OrderPlaced\"") && text.contains("7"),
        "{text}"
    );

    let fallback = Arc::new(Recorder::default());
    let lenient = Router::new(
        routes,
        Unmatched::Default(Box::new(Route::new(
            "routing.default_route",
            "fallback",
            fallback.clone(),
            t("unrouted.{event_type}"),
        ))),
    );
    lenient
        .publish(&event(8, "OrderPlaced", None))
        .await
        .unwrap();
    lenient
        .publish(&event(9, "InvoiceCreated", None))
        .await
        .unwrap();
    assert_eq!(
        fallback.seen(),
        vec![(8, Some("unrouted.OrderPlaced".into()))],
        "the default route takes only what no route matched"
    );
}

#[tokio::test]
async fn published_only_when_every_route_acked_and_classed_by_the_worst_failure() {
    let ok = Arc::new(Recorder::default());
    let flaky = Arc::new(Recorder::default());
    flaky
        .script
        .lock()
        .unwrap()
        .push(Err(PublishError::retryable("broker away")));
    let router = Router::new(
        vec![
            Route::new("routes[0]", "ok", ok.clone(), t("a")),
            Route::new("routes[1]", "flaky", flaky.clone(), t("b")),
        ],
        Unmatched::Fail,
    );
    let err = router.publish(&event(1, "E", None)).await.unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("1 of 2 routes failed") && text.contains("routes[1]"),
        "{text}"
    );
    assert!(
        text.contains("broker away") && !text.contains("routes[0]"),
        "{text}"
    );
    // The retry goes to both routes again: the one that acked receives it twice.
    router.publish(&event(1, "E", None)).await.unwrap();
    assert_eq!(ok.seen().len(), 2);
    assert_eq!(flaky.seen().len(), 2);

    // One permanent failure makes the whole event permanent, even beside a retryable one.
    flaky
        .script
        .lock()
        .unwrap()
        .push(Err(PublishError::retryable("later")));
    let mut bare = event(2, "E", None);
    bare.aggregate_type = None;
    let router = Router::new(
        vec![
            Route::new("routes[0]", "needs", ok.clone(), t("{aggregate_type}")),
            Route::new("routes[1]", "flaky", flaky, t("b")),
        ],
        Unmatched::Fail,
    );
    let err = router.publish(&bare).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
    assert!(err.to_string().contains("2 of 2 routes failed"), "{err}");
}

#[tokio::test]
async fn a_single_route_error_names_the_route_and_keeps_its_class() {
    let sink = Arc::new(Recorder::default());
    sink.script
        .lock()
        .unwrap()
        .push(Err(PublishError::permanent("answered 400")));
    let router = Router::new(
        vec![Route::new(
            "routes[3]",
            "hook",
            sink,
            t("http://x/{event_type}"),
        )],
        Unmatched::Fail,
    );
    let err = router.publish(&event(1, "E", None)).await.unwrap_err();
    assert!(err.is_permanent());
    assert_eq!(
        err.to_string(),
        "permanent: routes[3] (sink hook, \"http://x/{event_type}\"): answered 400"
    );
}

#[tokio::test]
async fn the_same_sink_and_destination_twice_publishes_once() {
    let sink: Arc<dyn RoutableSink> = Arc::new(Recorder::default());
    let other: Arc<dyn RoutableSink> = Arc::new(Recorder::default());
    let router = Router::new(
        vec![
            Route::new("routes[0]", "s", sink.clone(), t("a.{event_type}")).event_type(g("Inv*")),
            Route::new("routes[1]", "s", sink.clone(), t("a.{event_type}")),
            Route::new("routes[2]", "s", sink.clone(), t("b")),
            Route::new("routes[3]", "o", other, t("a.{event_type}")),
        ],
        Unmatched::Fail,
    );
    let labels: Vec<&str> = router
        .routes_for(&event(1, "Invoice", None))
        .iter()
        .map(|r| r.label())
        .collect();
    assert_eq!(labels, ["routes[0]", "routes[2]", "routes[3]"]);
}

#[tokio::test(start_paused = true)]
async fn routes_of_one_event_are_published_concurrently() {
    let slow = Arc::new(Recorder {
        delay: Duration::from_secs(3),
        ..Recorder::default()
    });
    let slower = Arc::new(Recorder {
        delay: Duration::from_secs(4),
        ..Recorder::default()
    });
    let router = Router::new(
        vec![
            Route::new("routes[0]", "slow", slow, t("a")),
            Route::new("routes[1]", "slower", slower, t("b")),
        ],
        Unmatched::Fail,
    );
    let started = tokio::time::Instant::now();
    router.publish(&event(1, "E", None)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(4), "not 3 s + 4 s");
}
