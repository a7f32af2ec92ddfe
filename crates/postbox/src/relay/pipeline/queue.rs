//! The publish queue: claimed work waiting for a publish slot, fair across targets. Each target
//! has a queue of its own, and the slots go to the targets in turn, so that an event of a quiet
//! tenant claimed beside a tenant's backlog is published next, not after the hundreds of events
//! the backlog's last claims queued.

use std::collections::{HashMap, VecDeque};

use crate::ordering::Work;
use crate::schema::SchemaName;

/// Work of claims (by claim number) waiting for a publish slot, per target.
#[derive(Default)]
pub(super) struct Queue {
    by_target: HashMap<SchemaName, VecDeque<(u64, Work)>>,
    /// The targets with work waiting, in the order they get the next slots.
    turn: VecDeque<SchemaName>,
    len: usize,
}

impl Queue {
    /// Pieces of work waiting.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `work` of claim `claim` of `target`, behind that target's earlier work.
    pub(super) fn push(&mut self, target: &SchemaName, claim: u64, work: Work) {
        let queue = self.by_target.entry(target.clone()).or_default();
        if queue.is_empty() {
            self.turn.push_back(target.clone());
        }
        queue.push_back((claim, work));
        self.len += 1;
    }

    /// The next piece of work: the first of the target whose turn it is, which then goes to
    /// the back of the turn.
    pub(super) fn pop(&mut self) -> Option<(u64, Work)> {
        let target = self.turn.pop_front()?;
        let queue = self.by_target.get_mut(&target)?;
        let next = queue.pop_front();
        if queue.is_empty() {
            self.by_target.remove(&target);
        } else {
            self.turn.push_back(target);
        }
        if next.is_some() {
            self.len -= 1;
        }
        next
    }

    /// Everything queued, emptying the queue.
    pub(super) fn take(&mut self) -> Vec<(u64, Work)> {
        let mut all = Vec::with_capacity(self.len);
        while let Some(next) = self.pop() {
            all.push(next);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OutboxEvent;

    fn work(id: i64) -> Work {
        let event = OutboxEvent::new(id, "E", &serde_json::json!({})).expect("an event");
        crate::ordering::plan(&[], vec![event])
            .pop()
            .expect("one piece of work")
    }

    fn ids(queue: &mut Queue) -> Vec<i64> {
        queue
            .take()
            .into_iter()
            .map(|(_, w)| w.events()[0].id)
            .collect()
    }

    #[test]
    fn targets_take_turns_for_the_publish_slots() {
        let busy = SchemaName::new("busy").expect("a name");
        let quiet = SchemaName::new("quiet").expect("a name");
        let mut queue = Queue::default();
        for id in 1..=5 {
            queue.push(&busy, 1, work(id));
        }
        queue.push(&quiet, 2, work(100));
        assert_eq!(queue.len(), 6);
        // The quiet target's event goes second, not sixth.
        assert_eq!(ids(&mut queue), [1, 100, 2, 3, 4, 5]);
        assert!(queue.is_empty());
    }
}
