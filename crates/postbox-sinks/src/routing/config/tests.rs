use std::time::Duration;

use super::*;

/// A routing configuration parsed from TOML, as `postbox.toml` holds it.
fn config(toml: &str) -> RoutingConfig {
    toml::from_str(toml).expect("toml")
}

fn routed_plan(toml: &str) -> Routes {
    config(toml).check(Duration::from_secs(10)).expect("valid")
}

fn error(toml: &str) -> ConfigError {
    config(toml)
        .check(Duration::from_secs(10))
        .expect_err("invalid")
}

const SINKS: &str = r#"
        [sinks.billing_nats]
        kind = "nats"
        url = "nats://127.0.0.1:4222"
        [sinks.audit_hook]
        kind = "webhook"
        secret = "s3cr3t"
        [sinks.spare]
        kind = "redis"
        stream = "spare"
    "#;

#[test]
fn the_documented_example_reads() {
    let plan = routed_plan(&format!(
        r#"{SINKS}
            [[routes]]
            event_type = "Invoice*"
            aggregate_type = "Invoice"
            sink = "billing_nats"
            topic = "billing.{{aggregate_type}}.{{event_type}}"
            [[routes]]
            event_type = "*"
            sink = "audit_hook"
            topic = "https://audit.example/{{event_type}}"
            [routing]
            unmatched = "default"
            default_route = {{ sink = "billing_nats", topic = "unrouted.{{event_type}}" }}
            "#
    ));
    assert_eq!(plan.routes.len(), 2);
    assert_eq!(plan.routes[0].label, "routes[0]");
    assert_eq!(
        plan.routes[0].event_type.as_ref().map(Glob::as_str),
        Some("Invoice*")
    );
    assert_eq!(plan.routes[1].sink, "audit_hook");
    assert_eq!(plan.unused, ["spare"]);
    assert_eq!(plan.sinks.len(), 2);
    let default = plan.default_route.expect("default route");
    assert_eq!(default.label, "routing.default_route");
    assert_eq!(
        default.topic.as_ref().map(Template::as_str),
        Some("unrouted.{event_type}")
    );
    let SinkConfig::Webhook(hook) = &plan.sinks["audit_hook"] else {
        panic!("webhook")
    };
    assert_eq!(hook.secret.as_ref().map(|s| s.expose()), Some("s3cr3t"));
    assert_eq!(hook.publish_timeout, Duration::from_secs(5));
}

#[test]
fn a_route_may_use_the_sinks_own_destination_or_stdout() {
    let plan = routed_plan(
        r#"
            [sinks.spare]
            kind = "redis"
            stream = "spare:{event_type}"
            [sinks.out]
            kind = "stdout"
            [[routes]]
            sink = "spare"
            [[routes]]
            sink = "out"
            "#,
    );
    assert!(plan.routes.iter().all(|r| r.topic.is_none()));
    assert!(
        plan.default_route.is_none(),
        "unmatched events fail by default"
    );
}

#[test]
fn mistakes_are_refused_naming_the_rule_or_sink() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[[routes]]\nsink = \"nope\"\ntopic = \"a\""),
            "routes[1]",
            "\"nope\" is not defined",
        ),
        (
            format!("{SINKS}\n[[routes]]\nevent_type = \"Invoice[0-9]\"\nsink = \"billing_nats\"\ntopic = \"a\""),
            "routes[0]",
            "not supported",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a.{{aggregate}}\""),
            "routes[0]",
            "{aggregate}",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\""),
            "routes[0]",
            "no `subject` of its own",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"audit_hook\"\ntopic = \"audit.example/x\""),
            "routes[0]",
            "audit_hook",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopik = \"a\""),
            "routes[0]",
            "topik",
        ),
        (
            "[sinks.x]\nkind = \"natz\"\n[[routes]]\nsink = \"x\"".to_owned(),
            "sinks.x",
            "natz",
        ),
        (
            "[sinks.x]\nurl = \"nats://h\"\n[[routes]]\nsink = \"x\"".to_owned(),
            "sinks.x",
            "kind",
        ),
        (
            "[sinks.x]\nkind = \"kafka\"\nurl = \"kafka://k:1\"\nbootstrap_servers = \"k:2\"\n[[routes]]\nsink = \"x\"\ntopic = \"t\"".to_owned(),
            "sinks.x",
            "not both",
        ),
        (
            "[sinks.x]\nkind = \"redis\"\npublish_timeout = \"10s\"\n[[routes]]\nsink = \"x\"\ntopic = \"t\"".to_owned(),
            "sinks.x",
            "shorter than the relay's",
        ),
        (
            "[sinks.x]\nkind = \"stdout\"\n[[routes]]\nsink = \"x\"\ntopic = \"t\"".to_owned(),
            "routes[0]",
            "takes no topic",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\nunmatched = \"default\""),
            "routing.unmatched",
            "no routing.default_route",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\nunmatched = \"drop\""),
            "routing",
            "drop",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\ndefault_route = {{ sink = \"spare\" }}"),
            "routing.default_route",
            "unmatched",
        ),
        (
            format!("{SINKS}\n[[routes]]\nsink = \"billing_nats\"\ntopic = \"a\"\n[routing]\nunmatched = \"default\"\ndefault_route = {{ sink = \"gone\", topic = \"x\" }}"),
            "routing.default_route",
            "\"gone\" is not defined",
        ),
        (SINKS.to_owned(), "sinks", "no [[routes]]"),
    ];
    for (toml, key, text) in cases {
        let err = error(&toml);
        assert_eq!(err.at, key, "{toml}\n{err:?}");
        assert!(err.message.contains(text), "{toml}\n{err:?}");
    }
}
