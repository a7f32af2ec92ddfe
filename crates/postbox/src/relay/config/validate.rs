//! Checking a [`RelayConfig`]: each rule names the setting it refuses by its configuration key.

use super::RelayConfig;
use crate::error::{Error, Result};
use crate::relay::timing;

impl RelayConfig {
    /// Checks that the settings are usable together; an error names the setting by its
    /// configuration key ([`Error::InvalidConfig`]).
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::invalid_config(field, reason));
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return bad(
                "batch_size",
                format!("{} is out of range; use 1 to 10000", self.batch_size),
            );
        }
        if self.max_batch_size > 10_000 {
            return bad(
                "max_batch_size",
                format!("{} is out of range; use at most 10000", self.max_batch_size),
            );
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval", "must be above zero".into());
        }
        if self.busy_poll_interval.is_zero() || self.busy_poll_interval > self.poll_interval {
            return bad(
                "busy_poll_interval",
                format!(
                    "{:?} must be above zero and at most poll_interval ({:?})",
                    self.busy_poll_interval, self.poll_interval
                ),
            );
        }
        if timing::margin(self.lease) < timing::MIN_MARGIN {
            return bad(
                "lease",
                format!(
                    "{:?} is too short; use at least {:?}: once an event is published its lease \
                     goes unrenewed until its result is written, for up to {:?} of this lease \
                     (a third of it since the last renewal, {:?} gathering outcomes, half of it \
                     retrying the write), which must leave at least {:?} for database round trips",
                    self.lease,
                    timing::MIN_LEASE,
                    timing::unrenewed(self.lease),
                    timing::FLUSH_WINDOW,
                    timing::MIN_MARGIN,
                ),
            );
        }
        if self.publish_timeout.is_zero() || self.publish_timeout >= self.lease {
            return bad(
                "publish_timeout",
                format!(
                    "{:?} must be above zero and shorter than lease ({:?}), or a slow publish \
                     would outlive its claim; lower publish_timeout or raise lease",
                    self.publish_timeout, self.lease
                ),
            );
        }
        if let Some(every) = self.head_poll_interval
            && (every.is_zero() || every > self.poll_interval)
        {
            return bad(
                "head_poll_interval",
                format!(
                    "{every:?} must be above zero and at most poll_interval ({:?}), or unset",
                    self.poll_interval
                ),
            );
        }
        for (i, p) in self.retry_policies.iter().enumerate() {
            if p.max_retries == Some(0) || p.max_retries.is_some_and(|m| i32::try_from(m).is_err())
            {
                return bad(
                    "retry_policies",
                    format!(
                        "policy {} ({}): max_retries must be 1 or more (and fit 32 bits)",
                        i + 1,
                        p.event_type.as_str()
                    ),
                );
            }
            if let Some(b) = p.backoff
                && (b.base.is_zero() || b.cap < b.base)
            {
                return bad(
                    "retry_policies",
                    format!(
                        "policy {} ({}): the backoff base must be above zero and at most its cap",
                        i + 1,
                        p.event_type.as_str()
                    ),
                );
            }
        }
        for t in &self.ordered_aggregate_types {
            if t.is_empty() || t.chars().count() > 100 || t.chars().any(char::is_control) {
                return bad(
                    "ordered_aggregate_types",
                    format!(
                        "{t:?} is not an aggregate type: use 1 to 100 characters, no control \
                         characters (or `*` for every aggregate)"
                    ),
                );
            }
        }
        if self.dead_letter_retry_interval.is_some_and(|r| r.is_zero()) {
            return bad(
                "dead_letter_retry_interval",
                "must be above zero (or unset, to turn the slow lane off)".into(),
            );
        }
        if self.retention.is_some_and(|r| r.is_zero()) {
            return bad(
                "retention",
                "must be above zero (or unset, to keep every event in the outbox table)".into(),
            );
        }
        if self.archive_retention.is_some_and(|r| r.is_zero()) {
            return bad(
                "archive_retention",
                "must be above zero (or unset, to keep the archive forever)".into(),
            );
        }
        if self.inbox_retention.is_some_and(|r| r.is_zero()) {
            return bad(
                "inbox_retention",
                "must be above zero (or unset, to keep every inbox record)".into(),
            );
        }
        if self.vacuum_threshold == Some(0) {
            return bad(
                "vacuum_threshold",
                "must be at least 1 (or unset, to leave vacuuming to autovacuum)".into(),
            );
        }
        if self.concurrency == 0 {
            return bad("concurrency", "must be at least 1".into());
        }
        if self.retry.base.is_zero() {
            return bad("backoff_base", "must be above zero".into());
        }
        if self.retry.cap < self.retry.base {
            return bad(
                "backoff_cap",
                format!(
                    "{:?} is below backoff_base ({:?})",
                    self.retry.cap, self.retry.base
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{backoff::Backoff, glob::Glob, relay::RetryPolicy};

    /// The key [`RelayConfig::validate`] names for `config`.
    fn field_of(config: RelayConfig) -> &'static str {
        match config.validate() {
            Err(Error::InvalidConfig { field, reason }) => {
                assert!(!reason.is_empty(), "{field}: a reason is given");
                field
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        RelayConfig::default().validate().expect("defaults");
    }

    #[test]
    fn each_rule_names_its_key() {
        let ms = Duration::from_millis;
        let glob = |g: &str| g.parse::<Glob>().expect("glob");
        let d = RelayConfig::default;
        let cases: Vec<(RelayConfig, &str)> = vec![
            (d().batch_size(0), "batch_size"),
            (d().batch_size(10_001), "batch_size"),
            (d().max_batch_size(10_001), "max_batch_size"),
            (d().poll_interval(Duration::ZERO), "poll_interval"),
            (d().busy_poll_interval(Duration::ZERO), "busy_poll_interval"),
            (
                d().poll_interval(ms(100)).busy_poll_interval(ms(200)),
                "busy_poll_interval",
            ),
            (d().lease(ms(99)).publish_timeout(ms(50)), "lease"),
            (d().lease(ms(599)).publish_timeout(ms(50)), "lease"),
            (d().publish_timeout(Duration::ZERO), "publish_timeout"),
            (
                d().lease(ms(1000)).publish_timeout(ms(1000)),
                "publish_timeout",
            ),
            (
                d().head_poll_interval(Some(Duration::ZERO)),
                "head_poll_interval",
            ),
            (
                d().head_poll_interval(Some(Duration::from_secs(60))),
                "head_poll_interval",
            ),
            (
                d().retry_policy(RetryPolicy::new(glob("Invoice*")).max_retries(0)),
                "retry_policies",
            ),
            (
                d().retry_policy(
                    RetryPolicy::new(glob("*")).backoff(Backoff::new(Duration::ZERO, ms(10))),
                ),
                "retry_policies",
            ),
            (d().inbox_retention(Some(Duration::ZERO)), "inbox_retention"),
            (d().ordered_aggregate_types([""]), "ordered_aggregate_types"),
            (
                d().ordered_aggregate_types(["bad\ntype"]),
                "ordered_aggregate_types",
            ),
            (
                d().dead_letter_retry_interval(Some(Duration::ZERO)),
                "dead_letter_retry_interval",
            ),
            (d().retention(Some(Duration::ZERO)), "retention"),
            (
                d().archive_retention(Some(Duration::ZERO)),
                "archive_retention",
            ),
            (d().vacuum_threshold(Some(0)), "vacuum_threshold"),
            (d().concurrency(0), "concurrency"),
            (
                d().retry(Backoff::new(Duration::ZERO, ms(10))),
                "backoff_base",
            ),
            (
                d().retry(Backoff {
                    base: ms(100),
                    cap: ms(10),
                }),
                "backoff_cap",
            ),
        ];
        for (config, want) in cases {
            assert_eq!(field_of(config), want);
        }
    }

    #[test]
    fn the_shortest_lease_is_the_timing_minimum() {
        let min = timing::MIN_LEASE;
        let short = min - Duration::from_millis(1);
        RelayConfig::default()
            .lease(min)
            .publish_timeout(min / 2)
            .validate()
            .expect("the minimum lease is valid");
        let e = RelayConfig::default()
            .lease(short)
            .publish_timeout(short / 2)
            .validate()
            .expect_err("below the minimum");
        let message = e.to_string();
        assert!(
            message.contains("lease") && message.contains(&format!("{min:?}")),
            "{message}"
        );
    }

    #[test]
    fn the_message_names_the_key() {
        let e = RelayConfig::default()
            .batch_size(0)
            .validate()
            .expect_err("batch_size 0");
        assert!(e.to_string().contains("batch_size"), "{e}");
    }
}
