use super::*;
use crate::cloudevents::Format;

const RELAY: Duration = Duration::from_secs(10);

fn single(kind: SinkKind) -> SingleSink<'static> {
    SingleSink {
        kind,
        url: None,
        topic: None,
        exchange: None,
        webhook_secret: None,
        format: None,
        relay_publish_timeout: RELAY,
    }
}

fn table(value: serde_json::Value) -> std::result::Result<SinkConfig, String> {
    SinkConfig::from_table(&value, RELAY).map_err(|e| e.to_string())
}

#[cfg(feature = "kafka")]
#[test]
fn cloudevents_settings_are_checked_by_key() {
    let kafka = |extra: serde_json::Value| {
        let mut t = serde_json::json!({"kind": "kafka", "topic": "billing"});
        t.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        table(t)
    };
    let config = SinkConfig::from_table(
        &serde_json::json!({"kind": "kafka", "topic": "billing", "format": "cloudevents",
                            "cloudevents": {"mode": "structured", "source": "/billing"}}),
        RELAY,
    )
    .unwrap();
    let SinkConfig::Kafka(c) = config else {
        panic!("kafka")
    };
    assert_eq!(c.format, Format::Cloudevents);
    assert_eq!(c.cloudevents.mode, crate::cloudevents::Mode::Structured);
    assert_eq!(c.cloudevents.source.as_deref(), Some("/billing"));

    let err = kafka(serde_json::json!({"cloudevents": {"mode": "binary"}})).unwrap_err();
    assert!(
        err.starts_with("cloudevents:") && err.contains("format = \"cloudevents\""),
        "{err}"
    );
    let err = kafka(serde_json::json!({"format": "cloud-events"})).unwrap_err();
    assert!(
        err.starts_with("format:") && err.contains("cloud-events"),
        "{err}"
    );
    let err = kafka(serde_json::json!({"format": "cloudevents", "cloudevents": {"source": ""}}))
        .unwrap_err();
    assert!(err.contains("cloudevents.source"), "{err}");
    let err = kafka(serde_json::json!({"format": "cloudevents", "cloudevents": {"mod": "binary"}}))
        .unwrap_err();
    assert!(
        err.starts_with("cloudevents:") && err.contains("mod"),
        "{err}"
    );
    let err = kafka(serde_json::json!({"format": "cloudevents",
                                       "cloudevents": {"dataschema": "https://x/{schema}"}}))
    .unwrap_err();
    assert!(err.contains("{schema}"), "{err}");
}

#[test]
fn every_broker_has_its_default_address() {
    let spec = |kind| {
        SinkConfig::from_single(&SingleSink {
            topic: Some("events.{event_type}"),
            ..single(kind)
        })
        .unwrap()
    };
    let topic: Option<Template> = Some("events.{event_type}".parse().unwrap());
    let SinkConfig::Nats(c) = spec(SinkKind::Nats) else {
        panic!("nats")
    };
    assert_eq!(c.url, "nats://127.0.0.1:4222");
    assert_eq!(c.subject, topic);
    assert_eq!(c.publish_timeout, Duration::from_secs(5));
    let SinkConfig::Amqp(c) = spec(SinkKind::Amqp) else {
        panic!("amqp")
    };
    assert_eq!(c.url, "amqp://127.0.0.1:5672/%2f");
    assert_eq!(c.exchange, "", "the default exchange");
    let SinkConfig::Redis(c) = spec(SinkKind::Redis) else {
        panic!("redis")
    };
    assert_eq!(c.url, "redis://127.0.0.1:6379");
    let SinkConfig::Mqtt(c) = spec(SinkKind::Mqtt) else {
        panic!("mqtt")
    };
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1883));
    let SinkConfig::Kafka(c) = spec(SinkKind::Kafka) else {
        panic!("kafka")
    };
    assert_eq!(c.bootstrap_servers, "127.0.0.1:9092");
    assert_eq!(c.topic, topic);
}

#[test]
fn nats_credentials_leave_the_url() {
    let spec = SinkConfig::from_single(&SingleSink {
        url: Some("nats://relay:p%40ss@n1:4222, nats://relay:p%40ss@n2:4222"),
        topic: Some("x"),
        ..single(SinkKind::Nats)
    })
    .unwrap();
    let SinkConfig::Nats(c) = spec else {
        panic!("nats")
    };
    assert_eq!(c.url, "nats://n1:4222,nats://n2:4222");
    assert_eq!(c.user.as_deref(), Some("relay"));
    assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
    assert!(!format!("{c:?}").contains("p@ss"), "Debug hides it");
    let SinkConfig::Nats(c) =
        table(serde_json::json!({"kind": "nats", "url": "nats://s3cr3t-token@n1:4222"})).unwrap()
    else {
        panic!("nats")
    };
    assert_eq!(c.url, "nats://n1:4222");
    assert_eq!(c.token.as_ref().map(Secret::expose), Some("s3cr3t-token"));
    assert!(c.user.is_none());
    let err = table(
        serde_json::json!({"kind": "nats", "url": "nats://a:b@n1", "user": "a", "password": "b"}),
    )
    .unwrap_err();
    assert!(err.contains("give them once"), "{err}");
}

#[test]
fn kafka_servers_come_from_a_url_or_a_list() {
    use crate::kafka::kafka_servers;
    assert_eq!(
        kafka_servers("kafka://k1:9092,k2:9093").as_deref(),
        Ok("k1:9092,k2:9093")
    );
    assert_eq!(
        kafka_servers("k1:9092, kafka://k2:9093/").as_deref(),
        Ok("k1:9092,k2:9093")
    );
    assert!(kafka_servers("http://k1:9092").is_err());
    assert!(kafka_servers("k1:9092,,k2").is_err());
    let SinkConfig::Kafka(c) = SinkConfig::from_single(&SingleSink {
        url: Some("kafka://10.0.0.1:9092,10.0.0.2:9092"),
        topic: Some("billing.{aggregate_type}"),
        ..single(SinkKind::Kafka)
    })
    .unwrap() else {
        panic!("kafka")
    };
    assert_eq!(c.bootstrap_servers, "10.0.0.1:9092,10.0.0.2:9092");
    let SinkConfig::Kafka(c) = table(serde_json::json!({"kind": "kafka",
        "bootstrap_servers": "a:1", "properties": {"sasl.password": "kafka-pw"}}))
    .unwrap() else {
        panic!("kafka")
    };
    assert!(!format!("{c:?}").contains("kafka-pw"), "{c:?}");
}

#[test]
fn mqtt_urls_give_host_port_and_credentials() {
    let SinkConfig::Mqtt(c) = table(serde_json::json!({"kind": "mqtt",
        "url": "mqtt://relay:p%40ss@broker.internal:1884", "topic": "a/{event_type}"}))
    .unwrap() else {
        panic!("mqtt")
    };
    assert_eq!((c.host.as_str(), c.port), ("broker.internal", 1884));
    assert_eq!(c.username.as_deref(), Some("relay"));
    assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
    assert!(!format!("{c:?}").contains("p@ss"));
    for (url, host, port) in [
        ("127.0.0.1", "127.0.0.1", 1883),
        ("tcp://[::1]:1999/", "::1", 1999),
    ] {
        let SinkConfig::Mqtt(c) = table(serde_json::json!({"kind": "mqtt", "url": url})).unwrap()
        else {
            panic!("mqtt")
        };
        assert_eq!((c.host.as_str(), c.port), (host, port), "{url}");
    }
    for bad in [
        "mqtts://h:8883",
        "mqtt://h:port",
        "mqtt://h/topic",
        "mqtt://:1883",
    ] {
        assert!(
            table(serde_json::json!({"kind": "mqtt", "url": bad})).is_err(),
            "{bad}"
        );
    }
    let err = table(serde_json::json!({"kind": "mqtt", "url": "ws://u:secret@h:1"})).unwrap_err();
    assert!(!err.contains("secret"), "{err}");
    let err = SinkConfig::from_single(&SingleSink {
        url: Some("ftp://u:secret@h/{event_type}"),
        ..single(SinkKind::Webhook)
    })
    .unwrap_err();
    assert_eq!(err.at, "sink_url", "{err}");
    let err = err.to_string();
    assert!(err.contains("u:***@h") && !err.contains("secret"), "{err}");
    let err = table(serde_json::json!({"kind": "webhook", "url": "https://u:secret@h/{nope}"}))
        .unwrap_err();
    assert!(err.contains("{nope}") && !err.contains("secret"), "{err}");
}

#[test]
fn the_sink_gives_up_before_the_relay() {
    assert_eq!(
        default_publish_timeout(Duration::from_secs(10)),
        Duration::from_secs(5)
    );
    assert_eq!(
        default_publish_timeout(Duration::from_secs(2)),
        Duration::from_millis(1600)
    );
}

#[test]
fn tables_take_url_for_every_kind() {
    let SinkConfig::Kafka(c) =
        table(serde_json::json!({"kind": "kafka", "url": "kafka://k:1"})).unwrap()
    else {
        panic!("kafka")
    };
    assert_eq!(c.bootstrap_servers, "k:1");
    assert_eq!(c.topic, None);
    let SinkConfig::Kafka(c) = table(serde_json::json!({"kind": "kafka"})).unwrap() else {
        panic!("kafka default")
    };
    assert_eq!(c.bootstrap_servers, crate::kafka::DEFAULT_SERVERS);
    let SinkConfig::Kafka(c) = table(
        serde_json::json!({"kind": "kafka", "bootstrap_servers": "a:1,b:2",
        "topic": "t.{event_type}", "publish_timeout": "2s",
        "properties": {"compression.type": "lz4"}}),
    )
    .unwrap() else {
        panic!("kafka native keys")
    };
    assert_eq!(c.bootstrap_servers, "a:1,b:2");
    assert_eq!(c.publish_timeout, Duration::from_secs(2));
    assert_eq!(c.properties["compression.type"], "lz4");
}

#[test]
fn bad_tables_are_refused_with_the_reason() {
    for (value, expect) in [
        (serde_json::json!({"url": "nats://h"}), "kind"),
        (serde_json::json!({"kind": "natz"}), "natz"),
        (
            serde_json::json!({"kind": "nats", "subjekt": "x"}),
            "subjekt",
        ),
        (
            serde_json::json!({"kind": "nats", "subject": "a.{nope}"}),
            "{nope}",
        ),
        (
            serde_json::json!({"kind": "webhook", "url": "ftp://x"}),
            "scheme",
        ),
        (
            serde_json::json!({"kind": "kafka", "url": "k:1", "bootstrap_servers": "k:2"}),
            "not both",
        ),
        (
            serde_json::json!({"kind": "mqtt", "url": "mqtt://h", "port": 1}),
            "not both",
        ),
        (serde_json::json!({"kind": "stdout", "url": "x"}), "url"),
        (
            serde_json::json!({"kind": "redis", "publish_timeout": "10s"}),
            "shorter than the relay's",
        ),
        (serde_json::json!("nats"), "table"),
    ] {
        let err = table(value.clone()).unwrap_err();
        assert!(err.contains(expect), "{value}: {err}");
    }
}

#[test]
fn kinds_parse_by_name() {
    for kind in SinkKind::ALL {
        assert_eq!(kind.name().parse::<SinkKind>(), Ok(*kind));
    }
    let err = "natz".parse::<SinkKind>().unwrap_err();
    assert_eq!(err.at, "kind");
    assert!(
        err.message.contains("nats"),
        "names what this build has: {err}"
    );
}
