//! The one-sink flags of `postbox relay`, `replay` and `config`: --sink, --sink-url, --topic, --exchange, --sink-format.

use clap::Args;

use crate::config::SinkKind;

/// The sink kinds this build has, with their help, for `--sink`.
fn sink_kinds() -> impl clap::builder::TypedValueParser<Value = SinkKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = SinkKind::ALL
        .iter()
        .map(|k| PossibleValue::new(k.name()).help(k.description().trim_end_matches('.')));
    // Only the names above get through the parser, and each is a kind.
    PossibleValuesParser::new(values).map(|name| name.parse().unwrap_or(SinkKind::Stdout))
}

/// The relay's one sink, from the command line.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Sink (flags override postbox.toml and POSTBOX_*)")]
pub(crate) struct SinkArgs {
    /// Where events are published [config: sink; default: stdout, or the [[routes]] of
    /// postbox.toml when it has some (a --sink flag overrides them)]
    #[arg(long, value_parser = sink_kinds(), value_name = "KIND")]
    pub(crate) sink: Option<SinkKind>,

    /// The sink's address [config: sink_url; defaults: nats://127.0.0.1:4222,
    /// amqp://127.0.0.1:5672/%2f (guest/guest), kafka://127.0.0.1:9092 (or a host:port list),
    /// redis://127.0.0.1:6379, mqtt://127.0.0.1:1883]. For webhooks, required: the endpoint, a
    /// template like https://hooks.example.com/{event_type}. Passwords in it are never logged;
    /// prefer POSTBOX_SINK_URL to the flag for URLs with a password
    #[arg(long, value_name = "URL")]
    pub(crate) sink_url: Option<String>,

    /// Destination template, required for brokers: the NATS subject, the AMQP routing key, the
    /// Kafka topic, the Redis stream key or the MQTT topic, e.g. 'billing.{aggregate_type}.{event_type}'.
    /// Placeholders: {event_type}, {aggregate_type}, {aggregate_id}, {tenant}, {schema_version} [config: topic]
    #[arg(long, value_name = "TEMPLATE")]
    pub(crate) topic: Option<String>,

    /// AMQP exchange to publish to [config: exchange; default: "", the default exchange, which
    /// delivers to the queue named by the routing key]
    #[arg(long, value_name = "NAME")]
    pub(crate) exchange: Option<String>,

    /// How the sink writes each event: postbox, or cloudevents (CloudEvents 1.0, binary mode)
    /// [config: sink_format; default: postbox]
    #[arg(long, value_name = "FORMAT", value_parser = ["postbox", "cloudevents"])]
    pub(crate) sink_format: Option<String>,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn sink_flags_become_overrides() {
        let cli = Cli::try_parse_from([
            "postbox",
            "relay",
            "--sink",
            "amqp",
            "--sink-url",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
            "--topic",
            "{aggregate_type}.{event_type}",
            "--exchange",
            "billing",
        ])
        .expect("parses");
        let o = cli.overrides();
        assert_eq!(o.sink, Some(SinkKind::Amqp));
        assert_eq!(o.topic.as_deref(), Some("{aggregate_type}.{event_type}"));
        assert_eq!(o.exchange.as_deref(), Some("billing"));
        assert!(o.sink_url.is_some());
        for kind in SinkKind::ALL {
            let name = kind.name();
            Cli::try_parse_from(["postbox", "relay", "--sink", name]).expect(name);
        }
        assert!(Cli::try_parse_from(["postbox", "relay", "--sink", "sqs"]).is_err());
    }
}
