//! The documentation of every configuration key: the source of `--help`'s key list, checked
//! against `CONFIG.md` and the defaults by tests.

/// One configuration key, as documented in `--help` and `CONFIG.md`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyDoc {
    /// The key, as written in `postbox.toml`; its variable is `POSTBOX_<KEY>`.
    pub(crate) key: &'static str,
    /// The default, as written in `postbox.toml`.
    pub(crate) default: &'static str,
    /// The command-line flag that sets it, if any.
    pub(crate) flag: Option<&'static str>,
    /// What it does.
    pub(crate) about: &'static str,
}

/// Every configuration key, in the order the docs list them.
pub(crate) const KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "database_url",
        default: "(none: SQLite file postbox.db in the working directory)",
        flag: Some("--database-url"),
        about: "postgres:// or postgresql:// for PostgreSQL; mysql:// for MySQL 8.0.23+ / MariaDB \
                10.6+; sqlite:… or a path ending in .db for SQLite. Prefer POSTBOX_DATABASE_URL \
                to a flag for URLs with a password.",
    },
    KeyDoc {
        key: "database_urls",
        default: "[]",
        flag: None,
        about: "Several databases one `postbox relay` serves at once (sharded outboxes, one \
                database per tenant), each on its own connections and in its own turn; a \
                database that is down or failing does not hold up the others. `postbox \
                migrate` migrates each, `postbox status` reports each. Used when database_url is not set; other commands \
                take --database-url. As a variable: comma-separated URLs.",
    },
    KeyDoc {
        key: "schema",
        default: "\"public\"",
        flag: Some("--schema"),
        about: "PostgreSQL schema of the default outbox and the tenant registry (ignored on SQLite).",
    },
    KeyDoc {
        key: "batch_size",
        default: "100",
        flag: Some("--batch-size"),
        about: "Events claimed per batch (1 to 10000). Larger batches cost fewer round trips but \
                widen the window of events published twice after a crash.",
    },
    KeyDoc {
        key: "max_batch_size",
        default: "500",
        flag: None,
        about: "The largest batch claims grow to while they come back full (a backlog): each \
                full claim doubles the next, a nearly empty one halves it, down to batch_size, and \
                an unavailable destination sets it back to batch_size. \
                At or below batch_size, claims stay at batch_size. At most 10000.",
    },
    KeyDoc {
        key: "poll_interval",
        default: "\"5s\"",
        flag: Some("--poll-interval"),
        about: "How often the due sweep reads every outbox's backlog (with many tenants: \
                200 a second at most), finding what nothing announced: retries of other relays, \
                leases of dead ones, lost notifications. NOTIFY and the heads read find new \
                events sooner.",
    },
    KeyDoc {
        key: "busy_poll_interval",
        default: "\"10ms\"",
        flag: None,
        about: "How often a relay claims again from a busy outbox (one that had events within \
                busy_period) while ids its sequence handed out may still commit; and, with \
                head_poll_interval off, from every busy outbox. At most poll_interval.",
    },
    KeyDoc {
        key: "busy_period",
        default: "\"1s\"",
        flag: None,
        about: "How long an outbox stays busy after its last event: its head is read every \
                head_poll_interval and its uncommitted ids claimed at busy_poll_interval; \
                \"0s\" turns busy polling off (then only NOTIFY, the heads and poll_interval \
                find events).",
    },
    KeyDoc {
        key: "head_poll_interval",
        default: "\"10ms\"",
        flag: None,
        about: "How often a relay reads the outbox id sequences for new rows while an outbox \
                is busy (only the heads that moved come back); with none busy, every 100 ms, \
                and with many tenants 20,000 heads a second at most. How soon an event of a \
                producer that does not NOTIFY (plain SQL) is found. \"0s\" leaves such rows \
                to poll_interval. At most poll_interval.",
    },
    KeyDoc {
        key: "vacuum_threshold",
        default: "50000",
        flag: None,
        about: "Dead row versions in an outbox table that make the relay VACUUM it (PostgreSQL; \
                the relay's role must own the table). 0 leaves vacuuming to autovacuum.",
    },
    KeyDoc {
        key: "lease",
        default: "\"30s\"",
        flag: Some("--lease"),
        about: "How long a claim lasts. A relay that dies loses its events to another relay after \
                this long; too short a lease publishes slow batches twice.",
    },
    KeyDoc {
        key: "max_retries",
        default: "5",
        flag: None,
        about: "Tries of an event before it goes FAILED, for events this binary enqueues (the \
                demo); rows carry their own max_retries.",
    },
    KeyDoc {
        key: "backoff_base",
        default: "\"1s\"",
        flag: Some("--backoff-base"),
        about: "Unit of the retry backoff: the wait after the n-th failed try is \
                min(backoff_cap, backoff_base × 2^n).",
    },
    KeyDoc {
        key: "backoff_cap",
        default: "\"300s\"",
        flag: Some("--backoff-cap"),
        about: "Longest wait between tries.",
    },
    KeyDoc {
        key: "publish_timeout",
        default: "\"10s\"",
        flag: Some("--publish-timeout"),
        about: "How long one publish may take before it counts as a failed try; must be shorter \
                than lease.",
    },
    KeyDoc {
        key: "concurrency",
        default: "64",
        flag: Some("--concurrency"),
        about: "Events of a batch published at once.",
    },
    KeyDoc {
        key: "metrics_tenants",
        default: "100",
        flag: None,
        about: "Tenants whose metrics get a tenant label of their own: the first this many the \
                relay records anything of; the others are summed under tenant=\"(other)\", so \
                that thousands of tenants keep the series count bounded. 0: every tenant \
                under \"(other)\" (the default schema always has its own).",
    },
    KeyDoc {
        key: "retention",
        default: "\"30days\"",
        flag: None,
        about: "Age (from creation) past which relays move PROCESSED events to \
                outbox_events_archive, in short batches, every minute; also the default of \
                `postbox archive`. An idempotency key blocks duplicates while its event is in \
                outbox_events. \"0s\" keeps every event in outbox_events.",
    },
    KeyDoc {
        key: "archive_retention",
        default: "\"90days\"",
        flag: None,
        about: "Age (from archiving) past which relays delete archived events. \"0s\" keeps \
                the archive forever.",
    },
    KeyDoc {
        key: "inbox_retention",
        default: "\"7days\"",
        flag: None,
        about: "The inbox's dedup window: age (from receipt) past which relays delete the \
                records of messages consumers handled; a repeat arriving later is handled \
                again. \"0s\" keeps every record.",
    },
    KeyDoc {
        key: "drain_patience",
        default: "\"60s\"",
        flag: None,
        about: "How long `relay --drain` waits for destinations that are down before it gives \
                up (exit status 3); their events stay PENDING with no try spent.",
    },
    KeyDoc {
        key: "dead_letter_retry_interval",
        default: "\"1h\"",
        flag: None,
        about: "The dead_letter_* keys configure the slow lane of FAILED events (FAILED is the \
                dead-letter state): this long after its last try, a FAILED event gets one more try (up to dead_letter_max_retries times) before it waits for an \
                operator. \"0s\" turns the slow lane off.",
    },
    KeyDoc {
        key: "dead_letter_max_retries",
        default: "24",
        flag: None,
        about: "The dead_letter_* keys configure the slow lane: this one is how many slow-lane \
                tries a FAILED event gets at most; 0 turns the slow lane off.",
    },
    KeyDoc {
        key: "ordered_aggregate_types",
        default: "[]",
        flag: None,
        about: "Aggregate types whose events are published one aggregate at a time, in commit \
                order (G6 in docs/guarantees.md); [\"*\"] orders every aggregate. A failing \
                event parks its aggregate: `postbox events list --parked`, `postbox retry`, \
                `postbox events skip`. As a variable: comma-separated names.",
    },
    KeyDoc {
        key: "source",
        default: "\"poll\"",
        flag: Some("--source"),
        about: "How `postbox relay` learns of committed events: poll (claims that read the \
                outbox table; every database) or cdc (PostgreSQL: the table's inserts read from a \
                logical replication slot in commit order, polling kept as the safety net; needs \
                wal_level = logical and a role with REPLICATION; docs/cdc.md).",
    },
    KeyDoc {
        key: "cdc_slot",
        default: "\"postbox\"",
        flag: Some("--cdc-slot"),
        about: "The logical replication slot of source = cdc, created on first use. One relay \
                reads a slot at a time; give each database or relay group its own. Drop it \
                (pg_drop_replication_slot) when you stop using CDC, or it keeps WAL.",
    },
    KeyDoc {
        key: "cdc_claim",
        default: "false",
        flag: Some("--cdc-claim"),
        about: "Whether source = cdc claims each event before publishing it, as polling does. \
                By default the relay reads the rows the slot names, publishes them and marks \
                them: one write per event instead of two. Polling relays beside it leave the \
                default schema's events, and those of the tenants whose outbox its publication \
                holds, to it while it reads the slot (postbox_cdc_slots); set \
                this for pollers that do not (a library's PgStore::leave_to_cdc_relay(false)), or \
                they may publish an event the CDC relay is publishing (at most the events in \
                flight). Ordered aggregate types are always claimed.",
    },
    KeyDoc {
        key: "cdc_publication",
        default: "\"postbox_outbox\"",
        flag: None,
        about: "The publication of source = cdc: the inserts of the default schema's outbox \
                table and of every active tenant's (kept in step with the tenant registry), \
                created when missing.",
    },
    KeyDoc {
        key: "log_format",
        default: "\"text\"",
        flag: Some("--log-format"),
        about: "Log format on stderr: text or json.",
    },
    KeyDoc {
        key: "log_level",
        default: "\"info\"",
        flag: Some("--log-level"),
        about: "Log filter (tracing EnvFilter syntax, e.g. \"warn,postbox=debug\"). Precedence: \
                --log-level, then RUST_LOG, then this key.",
    },
    KeyDoc {
        key: "payload_limit",
        default: "\"1MiB\"",
        flag: None,
        about: "Largest event payload accepted when enqueuing, in bytes or with a unit \
                (B, KB, KiB, MB, MiB).",
    },
    KeyDoc {
        key: "sink",
        default: "(none: stdout, or the [[routes]] when postbox.toml has some)",
        flag: Some("--sink"),
        about: "The relay's one sink: stdout, null, webhook, nats, amqp, kafka, redis or mqtt. \
                Set in postbox.toml or POSTBOX_SINK it excludes [[routes]]; the --sink flag \
                overrides them.",
    },
    KeyDoc {
        key: "sink_url",
        default: "(the broker's: nats://127.0.0.1:4222, amqp://127.0.0.1:5672/%2f, \
                  kafka://127.0.0.1:9092, redis://127.0.0.1:6379, mqtt://127.0.0.1:1883)",
        flag: Some("--sink-url"),
        about: "The sink's address; for webhook the endpoint, required, a URL template. Kafka: \
                kafka://host:port,host:port or host:port,host:port. Passwords are never logged \
                or shown; prefer POSTBOX_SINK_URL to the flag.",
    },
    KeyDoc {
        key: "topic",
        default: "(none; required by the broker sinks)",
        flag: Some("--topic"),
        about: "Destination template: NATS subject, AMQP routing key, Kafka topic, Redis stream \
                key or MQTT topic, e.g. \"billing.{aggregate_type}.{event_type}\". \
                Placeholders: {event_type}, {aggregate_type}, {aggregate_id}, {tenant}, {schema_version}.",
    },
    KeyDoc {
        key: "exchange",
        default: "(none: \"\", the default exchange)",
        flag: Some("--exchange"),
        about: "The AMQP exchange the amqp sink publishes to (it must exist). The default \
                exchange delivers to the queue named by the routing key.",
    },
    KeyDoc {
        key: "sink_format",
        default: "(none: \"postbox\", Postbox's own shape)",
        flag: Some("--sink-format"),
        about: "How the sink writes each event: postbox (the payload as the body, Postbox \
                headers) or cloudevents (a CloudEvents 1.0 event in binary mode; see \
                docs/sinks.md). Not for stdout and null.",
    },
    KeyDoc {
        key: "webhook_secret",
        default: "(none: requests are not signed)",
        flag: None,
        about: "HMAC-SHA256 key of the webhook sink's X-Postbox-Signature header. Never logged \
                or shown by `postbox config`; prefer POSTBOX_WEBHOOK_SECRET to the file.",
    },
    KeyDoc {
        key: "admin_listen",
        default: "(none: off)",
        flag: Some("--admin-listen"),
        about: "Address where `postbox relay` serves /metrics (Prometheus), /healthz, /readyz, \
                the admin API (/api, bearer token) and the admin page (/), e.g. \
                \"127.0.0.1:9187\". A non-loopback address needs admin_token.",
    },
    KeyDoc {
        key: "admin_token",
        default: "(none: /api answers 401)",
        flag: None,
        about: "Bearer token of the admin API and page, at least 16 characters. Never logged or \
                shown by `postbox config`; set POSTBOX_ADMIN_TOKEN rather than the file.",
    },
    KeyDoc {
        key: "alert_webhook",
        default: "(none: alerts are log lines only)",
        flag: None,
        about: "http(s) URL that alerts are POSTed to as Slack-compatible JSON ({\"text\": …}): \
                an event gone FAILED, a sink down for alert_sink_down_after, an outstanding \
                event older than alert_backlog_age. Needs admin_listen.",
    },
    KeyDoc {
        key: "alert_sink_down_after",
        default: "\"5m\"",
        flag: None,
        about: "How long a sink must be down before it alerts.",
    },
    KeyDoc {
        key: "alert_backlog_age",
        default: "\"15m\"",
        flag: None,
        about: "Age of the oldest outstanding (PENDING or PROCESSING) event that alerts; \"0s\" \
                turns the check off.",
    },
    KeyDoc {
        key: "alert_repeat_after",
        default: "\"1h\"",
        flag: None,
        about: "A condition that lasts (a sink still down, more events FAILED) alerts again \
                after this long, with the count of what happened meanwhile.",
    },
    KeyDoc {
        key: "alert_max_per_hour",
        default: "20",
        flag: None,
        about: "At most this many alerts an hour in all; the rest are logged only.",
    },
];

/// The configuration-key section of `--help`.
pub(crate) fn keys_help() -> String {
    let mut out = String::from(
        "Configuration (each layer overrides the one before):\n  \
         built-in defaults → postbox.toml (working directory, or --config PATH) → POSTBOX_<KEY> \
         environment variables → command-line flags.\n  \
         Durations are written like \"500ms\", \"5s\", \"2m\". `postbox config` shows the \
         effective values and where each comes from.\n  \
         Several sinks with routing rules: [sinks.NAME] and [[routes]] tables in postbox.toml \
         (see CONFIG.md and the README).\n\nKeys:\n",
    );
    for k in KEYS {
        let flag = k.flag.map(|f| format!(", {f}")).unwrap_or_default();
        out.push_str(&format!(
            "  {} (POSTBOX_{}{flag})\n      default {}\n      {}\n",
            k.key,
            k.key.to_ascii_uppercase(),
            k.default,
            k.about
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_documented_in_config_md_and_help() {
        let doc = include_str!("../../CONFIG.md");
        let help = keys_help();
        for k in KEYS {
            assert!(
                doc.contains(&format!("`{}`", k.key)),
                "CONFIG.md lacks {}",
                k.key
            );
            assert!(
                doc.contains(&format!("POSTBOX_{}", k.key.to_ascii_uppercase())),
                "CONFIG.md lacks the variable of {}",
                k.key
            );
            assert!(help.contains(k.key), "help lacks {}", k.key);
        }
    }
}
