//! What a seeded schedule of producers did, and the check of what relays published against it:
//! every committed event delivered, none that rolled back, each aggregate's first deliveries in
//! the promised order, and how many deliveries were repeats.
//!
//! Events are known by a token in their payload (`{"token": n}`), not by their id (SQLite hands
//! a rolled-back id out again), and by an aggregate id of `{prefix}{aggregate}`, so that one
//! database serves many schedules.
//!
//! ```
//! use postbox_testkit::ledger::{Ledger, Order};
//!
//! let mut ledger = Ledger::default();
//! let token = ledger.token();
//! ledger.record(token, 1);
//! ledger.end(vec![(token, 0)], true);
//! let published = vec![postbox_testkit::event(1)
//!     .aggregate("Acct", "7-0")
//!     .payload(serde_json::json!({ "token": token }))
//!     .build()];
//! let checked = ledger.check(&published, "7-", Order::Commit).unwrap();
//! assert_eq!((checked.delivered, checked.repeats), (1, 0));
//! ```

use std::collections::{HashMap, HashSet};

use postbox::OutboxEvent;

/// What a schedule committed and rolled back.
#[derive(Debug, Default)]
pub struct Ledger {
    next: u64,
    /// Per aggregate, the committed events' tokens in commit order.
    committed: HashMap<usize, Vec<u64>>,
    rolled_back: HashSet<u64>,
    /// Each event's id.
    ids: HashMap<u64, i64>,
}

/// The order each aggregate's first deliveries must follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The order the aggregate's events committed (its producers wrote one at a time).
    Commit,
    /// Id order (producers wrote side by side; the poller never publishes an id while an
    /// earlier one may still commit).
    Id,
    /// No order promised: only that each committed event is delivered.
    Any,
}

/// What [`Ledger::check`] counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    /// Distinct events delivered.
    pub delivered: usize,
    /// Deliveries of an event already delivered.
    pub repeats: usize,
}

impl Ledger {
    /// A new event's token, to write into its payload.
    pub fn token(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The id the event of `token` was given.
    pub fn record(&mut self, token: u64, id: i64) {
        self.ids.insert(token, id);
    }

    /// A transaction ended: its events (token, aggregate), in the order inserted, committed or
    /// rolled back.
    pub fn end(&mut self, inserted: Vec<(u64, usize)>, commit: bool) {
        for (token, a) in inserted {
            if commit {
                self.committed.entry(a).or_default().push(token);
            } else {
                self.rolled_back.insert(token);
            }
        }
    }

    /// Events rolled back so far (a savepoint's, or a whole transaction's).
    pub fn roll_back(&mut self, tokens: impl IntoIterator<Item = u64>) {
        self.rolled_back.extend(tokens);
    }

    /// Events committed so far.
    pub fn committed(&self) -> usize {
        self.committed.values().map(Vec::len).sum()
    }

    /// Checks `published` (every delivery, in order) against what was committed; events whose
    /// aggregate id does not start with `prefix` belong to another schedule and are passed
    /// over. Returns what was counted, or why a guarantee does not hold.
    pub fn check(
        &self,
        published: &[OutboxEvent],
        prefix: &str,
        order: Order,
    ) -> Result<Checked, String> {
        let mut first: HashMap<usize, Vec<u64>> = HashMap::new();
        let mut seen = HashSet::new();
        let mut repeats = 0;
        for e in published {
            let Some(a) = e
                .aggregate_id
                .as_deref()
                .and_then(|id| id.strip_prefix(prefix))
                .and_then(|a| a.parse::<usize>().ok())
            else {
                continue;
            };
            let payload: serde_json::Value = serde_json::from_str(e.payload.get())
                .map_err(|err| format!("event {} has a payload that is not JSON: {err}", e.id))?;
            let token = payload["token"]
                .as_u64()
                .ok_or_else(|| format!("event {} has no token: {payload}", e.id))?;
            if self.rolled_back.contains(&token) {
                return Err(format!(
                    "event {token} (id {}) was published, but it rolled back",
                    e.id
                ));
            }
            if seen.insert(token) {
                first.entry(a).or_default().push(token);
            } else {
                repeats += 1;
            }
        }
        let ids = |tokens: &[u64]| -> Vec<Option<i64>> {
            tokens.iter().map(|t| self.ids.get(t).copied()).collect()
        };
        for (a, committed) in &self.committed {
            let delivered = first.get(a).cloned().unwrap_or_default();
            let promised = match order {
                Order::Commit => committed.clone(),
                Order::Id => {
                    let mut by_id = committed.clone();
                    by_id.sort_by_key(|token| self.ids.get(token).copied());
                    by_id
                }
                Order::Any => {
                    let mut sorted = delivered.clone();
                    sorted.sort_unstable();
                    let mut expected = committed.clone();
                    expected.sort_unstable();
                    if sorted == expected {
                        continue;
                    }
                    expected
                }
            };
            if delivered != promised {
                return Err(format!(
                    "aggregate {a} ({order:?} order): promised {promised:?} (ids {:?}), first \
                     delivered {delivered:?} (ids {:?}); committed in the order {committed:?}",
                    ids(&promised),
                    ids(&delivered)
                ));
            }
        }
        if let Some((a, delivered)) = first.iter().find(|(a, _)| !self.committed.contains_key(a)) {
            return Err(format!(
                "aggregate {a}: delivered {delivered:?}, nothing committed"
            ));
        }
        Ok(Checked {
            delivered: seen.len(),
            repeats,
        })
    }
}

/// The seeds a tier runs: the one in the environment variable `one` alone, or as many as the
/// variable `count` says (else `default`) from `base`.
pub fn seeds(one: &str, count: &str, base: u64, default: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var(one).ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let n: u64 = std::env::var(count)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (base..base + n).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn delivery(ledger: &Ledger, token: u64, a: usize) -> OutboxEvent {
        crate::event(ledger.ids[&token])
            .aggregate("Acct", &format!("s-{a}"))
            .payload(serde_json::json!({ "token": token }))
            .build()
    }

    /// Two events of one aggregate, committed in the order 2 then 1 (ids 20, 10).
    fn ledger() -> Ledger {
        let mut ledger = Ledger::default();
        let (t1, t2) = (ledger.token(), ledger.token());
        ledger.record(t1, 10);
        ledger.record(t2, 20);
        ledger.end(vec![(t2, 0)], true);
        ledger.end(vec![(t1, 0)], true);
        ledger
    }

    #[test]
    fn the_promised_order_is_checked() {
        let ledger = ledger();
        let commit_order = [delivery(&ledger, 2, 0), delivery(&ledger, 1, 0)];
        let id_order = [delivery(&ledger, 1, 0), delivery(&ledger, 2, 0)];
        assert!(ledger.check(&commit_order, "s-", Order::Commit).is_ok());
        assert!(ledger.check(&id_order, "s-", Order::Commit).is_err());
        assert!(ledger.check(&id_order, "s-", Order::Id).is_ok());
        assert!(ledger.check(&commit_order, "s-", Order::Id).is_err());
        assert!(ledger.check(&commit_order, "s-", Order::Any).is_ok());
    }

    #[test]
    fn a_lost_event_a_ghost_and_a_repeat_are_found() {
        let mut ledger = ledger();
        let lost = [delivery(&ledger, 2, 0)];
        assert!(ledger.check(&lost, "s-", Order::Any).is_err());
        let ghost = ledger.token();
        ledger.record(ghost, 30);
        ledger.roll_back([ghost]);
        let with_ghost = [
            delivery(&ledger, 2, 0),
            delivery(&ledger, 1, 0),
            delivery(&ledger, ghost, 1),
        ];
        assert!(ledger.check(&with_ghost, "s-", Order::Any).is_err());
        let repeated = [
            delivery(&ledger, 2, 0),
            delivery(&ledger, 1, 0),
            delivery(&ledger, 2, 0),
        ];
        let checked = ledger.check(&repeated, "s-", Order::Commit).unwrap();
        assert_eq!((checked.delivered, checked.repeats), (2, 1));
        // Another schedule's deliveries do not count for this one.
        assert!(ledger.check(&repeated, "t-", Order::Any).is_err());
    }
}
