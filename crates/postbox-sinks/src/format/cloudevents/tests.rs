#![allow(clippy::unwrap_used)]
use super::*;

fn config(mode: Mode) -> CloudEventsConfig {
    CloudEventsConfig {
        mode,
        ..CloudEventsConfig::default()
    }
}

fn header<'m>(m: &'m Message<'_>, name: &str) -> Option<&'m str> {
    m.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_postbox_format_is_the_payload_and_the_postbox_headers() {
    let e = crate::test_event::event(42, true, None);
    let m = Encoder::default().encode(&e, Binding::Kafka).unwrap();
    assert_eq!(m.headers, headers::all(&e));
    assert_eq!(m.body.as_ref(), e.payload.get().as_bytes());
    assert_eq!(m.content_type, JSON);
}

#[test]
fn binary_mode_names_the_attributes_as_each_binding_does() {
    let mut e = crate::test_event::event(42, true, Some("acme"));
    e.idempotency_key = Some("Invoice:456:InvoiceCreated".into());
    e.headers.insert(
        "traceparent".into(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    );
    let mut c = config(Mode::Binary);
    c.set_origin(Some(Origin {
        database: "billing".into(),
        schema: "public".into(),
    }));
    c.dataschema = Some(
        "https://schemas.example.com/{event_type}/v{schema_version}"
            .parse()
            .unwrap(),
    );
    let encoder = Encoder::new(Format::Cloudevents, &c);

    let kafka = encoder.encode(&e, Binding::Kafka).unwrap();
    assert_eq!(header(&kafka, "ce_specversion"), Some("1.0"));
    assert_eq!(header(&kafka, "ce_id"), Some("Invoice:456:InvoiceCreated"));
    assert_eq!(header(&kafka, "ce_source"), Some("/postbox/billing/acme"));
    assert_eq!(header(&kafka, "ce_type"), Some("InvoiceCreated"));
    assert_eq!(header(&kafka, "ce_subject"), Some("Invoice/456"));
    assert_eq!(header(&kafka, "ce_time"), Some("2026-04-24T10:00:00.000Z"));
    assert_eq!(
        header(&kafka, "ce_dataschema"),
        Some("https://schemas.example.com/InvoiceCreated/v1")
    );
    assert_eq!(header(&kafka, "ce_partitionkey"), Some("456"));
    assert_eq!(
        header(&kafka, "ce_traceparent"),
        e.headers.get("traceparent").map(String::as_str)
    );
    assert_eq!(header(&kafka, "content-type"), Some(JSON));
    assert_eq!(
        header(&kafka, headers::DEDUP_ID),
        Some("Invoice:456:InvoiceCreated")
    );
    assert_eq!(kafka.body.as_ref(), e.payload.get().as_bytes());

    let amqp = encoder.encode(&e, Binding::Amqp).unwrap();
    assert_eq!(
        header(&amqp, "cloudEvents:id"),
        Some("Invoice:456:InvoiceCreated")
    );
    assert_eq!(header(&amqp, "content-type"), None, "a property of its own");

    let mqtt = encoder.encode(&e, Binding::Mqtt).unwrap();
    assert_eq!(header(&mqtt, "type"), Some("InvoiceCreated"));
    assert_eq!(
        header(&mqtt, "traceparent"),
        e.headers.get("traceparent").map(String::as_str)
    );
    assert!(
        mqtt.headers.iter().all(|(n, _)| n
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())),
        "MQTT binary mode has only attributes as user properties: {:?}",
        mqtt.headers
    );
}

#[test]
fn http_values_outside_printable_ascii_are_percent_encoded() {
    let mut e = crate::test_event::event(7, true, None);
    e.aggregate_id = Some("Zoë 100%".into());
    let encoder = Encoder::new(Format::Cloudevents, &config(Mode::Binary));
    let http = encoder.encode(&e, Binding::Http).unwrap();
    assert_eq!(
        header(&http, "ce-subject"),
        Some("Invoice/Zo%C3%AB%20100%25")
    );
    assert_eq!(header(&http, "ce-source"), Some("/postbox"));
    let kafka = encoder.encode(&e, Binding::Kafka).unwrap();
    assert_eq!(header(&kafka, "ce_subject"), Some("Invoice/Zoë 100%"));
}

#[test]
fn structured_mode_carries_the_attributes_and_the_payload_as_data() {
    let e = crate::test_event::event(9, false, None);
    let mut c = config(Mode::Structured);
    c.source = Some("urn:acme:billing".into());
    let m = Encoder::new(Format::Cloudevents, &c)
        .encode(&e, Binding::Http)
        .unwrap();
    assert_eq!(m.content_type, STRUCTURED);
    let json: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
    assert_eq!(json["specversion"], "1.0");
    assert_eq!(json["id"], "9");
    assert_eq!(json["source"], "urn:acme:billing");
    assert_eq!(json["datacontenttype"], JSON);
    assert!(json.get("subject").is_none(), "no aggregate, no subject");
    let payload: serde_json::Value = serde_json::from_str(e.payload.get()).unwrap();
    assert_eq!(json["data"], payload);
    assert!(
        header(&m, "ce-id").is_none(),
        "structured mode has no ce- headers"
    );
}

#[test]
fn a_dataschema_that_needs_a_missing_value_fails_permanently() {
    let e = crate::test_event::event(9, false, None);
    let mut c = config(Mode::Binary);
    c.dataschema = Some(
        "https://schemas.example.com/{aggregate_type}"
            .parse()
            .unwrap(),
    );
    let err = Encoder::new(Format::Cloudevents, &c)
        .encode(&e, Binding::Kafka)
        .unwrap_err();
    assert!(err.is_permanent());
}

#[test]
fn an_empty_source_is_refused_by_name() {
    let mut c = config(Mode::Binary);
    c.source = Some(" ".into());
    assert_eq!(c.check().unwrap_err().at, "cloudevents.source");
}
