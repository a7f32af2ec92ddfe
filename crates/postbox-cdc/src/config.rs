//! [`CdcConfig`]: the slot, the publication and the timings of a CDC relay.

use std::time::Duration;

use crate::error::{Error, Result};

/// How a CDC relay reads its slot.
///
/// ```
/// use std::time::Duration;
/// let config = postbox_cdc::CdcConfig::default()
///     .slot("orders_outbox")
///     .heartbeat(Duration::from_secs(5));
/// assert_eq!(config.publication, "postbox_outbox");
/// assert!(config.validate().is_ok());
/// assert!(postbox_cdc::CdcConfig::default().slot("Bad-Name").validate().is_err());
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CdcConfig {
    /// The logical replication slot (created on first use; `postbox`). One relay reads a slot
    /// at a time; a second relay on the same slot polls until the slot is free.
    pub slot: String,
    /// The publication of the outbox table's inserts (created if missing; `postbox_outbox`).
    pub publication: String,
    /// How often the relay writes a heartbeat into the WAL (`pg_logical_emit_message`), so that
    /// the slot advances while the outbox is idle and other tables churn (10 s).
    pub heartbeat: Duration,
    /// How often the polling claim runs beside the slot, for retries, taken-over leases, tenants
    /// whose outbox is not in the publication yet and anything the slot did not deliver (1 s). While the slot cannot be read, it runs on
    /// every round.
    pub poll_interval: Duration,
    /// How often the slot's lag is read into the metrics, and checked against `lag_alert` (10 s).
    pub lag_check: Duration,
    /// The WAL the server may keep for the slot (from its `restart_lsn`, which an open
    /// transaction holds back) before the relay logs an error each check, naming the
    /// transaction (1 GiB).
    pub lag_alert: u64,
    /// How long the slot's confirmed position may stand still while the server's WAL grows
    /// before the relay says the slot is stalled: an error log, `postbox_cdc_slot_stalled`,
    /// [`CdcStatus::stalled`](crate::CdcStatus::stalled) and `/readyz` (60 s). Judged at each
    /// lag check.
    pub stall_after: Duration,
    /// Whether each event the slot delivers is claimed before it is published, as a polling
    /// relay claims (`false`). By default it is read and published unclaimed and then marked:
    /// one write per event instead of two. Claim when a polling relay runs beside this one on
    /// the same table: a poller may otherwise publish an event this relay is publishing (at
    /// most the events this relay has in flight). Events of ordered aggregate types are always
    /// claimed.
    pub claim: bool,
}

impl Default for CdcConfig {
    fn default() -> Self {
        CdcConfig {
            slot: "postbox".to_owned(),
            publication: "postbox_outbox".to_owned(),
            heartbeat: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            lag_check: Duration::from_secs(10),
            lag_alert: 1 << 30,
            stall_after: Duration::from_secs(60),
            claim: false,
        }
    }
}

impl CdcConfig {
    /// Sets the slot (field [`slot`](Self::slot)).
    pub fn slot(mut self, slot: impl Into<String>) -> Self {
        self.slot = slot.into();
        self
    }

    /// Sets the publication (field [`publication`](Self::publication)).
    pub fn publication(mut self, publication: impl Into<String>) -> Self {
        self.publication = publication.into();
        self
    }

    /// Sets the heartbeat interval (field [`heartbeat`](Self::heartbeat)).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = every;
        self
    }

    /// Sets the polling claim's interval beside the slot (field
    /// [`poll_interval`](Self::poll_interval)).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Sets the lag check's interval (field [`lag_check`](Self::lag_check)).
    pub fn lag_check(mut self, every: Duration) -> Self {
        self.lag_check = every;
        self
    }

    /// Sets how long the confirmed position may stand still while WAL grows (field
    /// [`stall_after`](Self::stall_after)).
    pub fn stall_after(mut self, after: Duration) -> Self {
        self.stall_after = after;
        self
    }

    /// Sets the lag past which the relay logs an error (field [`lag_alert`](Self::lag_alert)).
    pub fn lag_alert(mut self, bytes: u64) -> Self {
        self.lag_alert = bytes;
        self
    }

    /// Sets whether each delivered event is claimed before it is published (field
    /// [`claim`](Self::claim)).
    pub fn claim(mut self, claim: bool) -> Self {
        self.claim = claim;
        self
    }

    /// Checks the names (PostgreSQL identifiers: lower-case letters, digits and `_`, not
    /// starting with a digit, at most 63 bytes) and the intervals (not zero).
    pub fn validate(&self) -> Result<()> {
        check_name("slot", &self.slot)?;
        check_name("publication", &self.publication)?;
        for (what, d) in [
            ("heartbeat", self.heartbeat),
            ("poll_interval", self.poll_interval),
            ("lag_check", self.lag_check),
            ("stall_after", self.stall_after),
        ] {
            if d.is_zero() {
                return Err(Error::InvalidName {
                    what,
                    name: "0s".to_owned(),
                    problem: "an interval must be longer than zero",
                });
            }
        }
        Ok(())
    }
}

fn check_name(what: &'static str, name: &str) -> Result<()> {
    let bad = |problem| {
        Err(Error::InvalidName {
            what,
            name: name.to_owned(),
            problem,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 63 {
        return bad("it is longer than 63 bytes");
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return bad("it starts with a digit");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return bad("use lower-case letters, digits and _ only");
    }
    Ok(())
}
