//! Per-aggregate ordering (G6) as the library's Rust side sees it, in one place: which events are
//! ordered, how a claim's ordered events are published (one chain per aggregate, in id order),
//! and what an event held back by its aggregate is told. The claim's own rules (an event waits
//! while an earlier event of its aggregate is unfinished, or above the commit horizon) are each
//! store's claim statement, written once per dialect (`postbox_waits_in_order` on PostgreSQL,
//! `claim_in_order.sql` on MySQL, `claim_pick.sql` on SQLite); the relay keeps the commit
//! horizon those claims take (`relay::pipeline::claim`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::event::OutboxEvent;

/// Whether `aggregate_type` is one of the ordered `types` (`*` orders every type).
pub(crate) fn orders_type(types: &[String], aggregate_type: &str) -> bool {
    types.iter().any(|t| t == "*" || t == aggregate_type)
}

/// Whether `event` belongs to an ordered aggregate: one of `types`, with an aggregate id.
pub(crate) fn is_ordered(types: &[String], event: &OutboxEvent) -> bool {
    match (&event.aggregate_type, &event.aggregate_id) {
        (Some(kind), Some(_)) => orders_type(types, kind),
        _ => false,
    }
}

/// Why an event of an ordered aggregate went back without a try.
pub(crate) const HELD_BACK: &str = "held back: an earlier event of its aggregate was not published";

/// What waits for a publish slot: one event, or the events of one ordered aggregate in a claim,
/// published one after another in id order (G6).
pub(crate) enum Work {
    One(Arc<OutboxEvent>),
    Chain(Vec<Arc<OutboxEvent>>),
}

impl Work {
    pub(crate) fn events(&self) -> &[Arc<OutboxEvent>] {
        match self {
            Work::One(event) => std::slice::from_ref(event),
            Work::Chain(events) => events,
        }
    }
}

/// A claim's events (in id order) as work: each ordered aggregate's events as one chain, in id
/// order, where its first event was; every other event alone.
pub(crate) fn plan(types: &[String], events: Vec<OutboxEvent>) -> Vec<Work> {
    let mut work: Vec<Work> = Vec::with_capacity(events.len());
    let mut chains: HashMap<(String, String), usize> = HashMap::new();
    for event in events {
        let event = Arc::new(event);
        if !is_ordered(types, &event) {
            work.push(Work::One(event));
            continue;
        }
        let key = (
            event.aggregate_type.clone().unwrap_or_default(),
            event.aggregate_id.clone().unwrap_or_default(),
        );
        match chains.get(&key) {
            Some(&at) => {
                if let Work::Chain(chain) = &mut work[at] {
                    chain.push(event);
                }
            }
            None => {
                chains.insert(key, work.len());
                work.push(Work::Chain(vec![event]));
            }
        }
    }
    work
}
