//! Retry policies per event type: validation-type events fail fast, flaky-network ones retry
//! longer, some skip the slow lane. The first policy whose glob matches an event's type applies;
//! what a policy leaves unset comes from the relay's own settings.

use crate::backoff::Backoff;
use crate::glob::Glob;

/// How events of the types `event_type` matches are retried.
///
/// ```
/// use std::time::Duration;
/// use postbox::{backoff::Backoff, RelayConfig, relay::RetryPolicy};
///
/// let config = RelayConfig::default()
///     // Bad input will not get better: fail after one try, no slow lane.
///     .retry_policy(RetryPolicy::new("Validation*".parse().unwrap()).max_retries(1).slow_lane(false))
///     // A flaky partner: twenty tries, up to an hour apart.
///     .retry_policy(
///         RetryPolicy::new("Partner.*".parse().unwrap())
///             .max_retries(20)
///             .backoff(Backoff { base: Duration::from_secs(5), cap: Duration::from_secs(3600) }),
///     );
/// assert_eq!(config.policy_for("ValidationFailed").max_retries, Some(1));
/// assert_eq!(config.policy_for("OrderPlaced").max_retries, None);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// The event types it applies to.
    pub event_type: Glob,
    /// Tries before `FAILED`, instead of the event's own `max_retries` column; `None` keeps
    /// the column's.
    pub max_retries: Option<u32>,
    /// The backoff between tries, instead of the relay's
    /// [`retry`](super::RelayConfig::retry); `None` keeps the relay's.
    pub backoff: Option<Backoff>,
    /// Whether `FAILED` events of these types get the slow lane (default `true`).
    pub slow_lane: bool,
}

impl RetryPolicy {
    /// A policy for `event_type` that changes nothing until its setters say what.
    pub fn new(event_type: Glob) -> Self {
        RetryPolicy {
            event_type,
            max_retries: None,
            backoff: None,
            slow_lane: true,
        }
    }

    /// Sets the tries before `FAILED`.
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// Sets the backoff between tries.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// Sets whether `FAILED` events of these types get the slow lane.
    pub fn slow_lane(mut self, slow_lane: bool) -> Self {
        self.slow_lane = slow_lane;
        self
    }
}

/// What applies to one event type: the matching policy's settings over the relay's.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct EffectivePolicy {
    /// The glob of the policy that matched; `None` when none did (the relay's settings).
    pub matched: Option<Glob>,
    /// Tries before `FAILED`; `None`: the event's `max_retries` column.
    pub max_retries: Option<u32>,
    /// The backoff between tries.
    pub backoff: Backoff,
    /// Whether the slow lane applies (and is on).
    pub slow_lane: bool,
}
