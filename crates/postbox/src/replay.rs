//! Replays: events published again, chosen by id or filter, from the outbox table and the
//! archive, to any sink — the relay's own routes or another destination.
//!
//! A replay never writes to the outbox: the original rows and their history stay as they are.
//! It reads a page of events at a time (one short read each, oldest first; no transaction stays
//! open, however many events it replays), publishes each to the sink, and counts what the sink
//! acknowledged. A replayed delivery says it is one: it carries the original event id (the
//! message id, as always) and the headers `postbox-replay-of` (that id) and `postbox-replay-id`
//! (the replay's id).
//!
//! **Dedup ids.** A consumer that drops repeats would drop a replay carrying the original dedup
//! id, so by default ([`ReplayDedup::PerReplay`]) a replayed event's idempotency key is
//! `<original dedup id>:replay:<replay id>`: new to every consumer, and the same for every
//! event of one replay, so running a replay again under the same id
//! ([`ReplayOptions::replay_id`]) is deduplicated like any repeat. [`ReplayDedup::Original`]
//! keeps the original key, for consumers that should drop what they already have.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::error::Result;
use crate::event::OutboxEvent;
use crate::schema::Target;
use crate::sink::Sink;
use crate::store::{EventFilter, EventStatus, ListParams, Order, Store, StoredEvent};

/// The header naming the event a delivery replays.
pub const REPLAY_OF_HEADER: &str = "postbox-replay-of";
/// The header naming the replay a delivery belongs to.
pub const REPLAY_ID_HEADER: &str = "postbox-replay-id";

/// What dedup id (idempotency key) replayed events carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplayDedup {
    /// `<original dedup id>:replay:<replay id>`: consumers that drop repeats take the replay.
    #[default]
    PerReplay,
    /// The original: consumers that drop repeats drop what they had already.
    Original,
}

/// How a replay runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// This replay's id, in `postbox-replay-id` and the per-replay dedup ids; a fresh UUID by
    /// default. Give the id of an interrupted replay to run it again without new duplicates.
    pub replay_id: String,
    /// The dedup id replayed events carry.
    pub dedup: ReplayDedup,
    /// At most this many events per second (`None`: as fast as the sink takes them).
    pub rate_limit: Option<f64>,
    /// Events published at once.
    pub concurrency: usize,
    /// Events read per page.
    pub page_size: u32,
    /// How long one publish may take.
    pub publish_timeout: Duration,
    /// Tries of an event whose publish fails (an unavailable destination is waited for
    /// instead, up to `patience`).
    pub tries: u32,
    /// How long an event waits for a destination that is down before it counts as failed.
    pub patience: Duration,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            replay_id: uuid::Uuid::new_v4().to_string(),
            dedup: ReplayDedup::default(),
            rate_limit: None,
            concurrency: 32,
            page_size: 500,
            publish_timeout: Duration::from_secs(10),
            tries: 3,
            patience: Duration::from_secs(60),
        }
    }
}

impl ReplayOptions {
    // Setters, one per field, so that options added later do not break callers.

    /// Sets the replay's id (field [`replay_id`](Self::replay_id)).
    pub fn replay_id(mut self, replay_id: impl Into<String>) -> Self {
        self.replay_id = replay_id.into();
        self
    }

    /// Sets the dedup id replayed events carry (field [`dedup`](Self::dedup)).
    pub fn dedup(mut self, dedup: ReplayDedup) -> Self {
        self.dedup = dedup;
        self
    }

    /// Sets the rate limit in events per second (field [`rate_limit`](Self::rate_limit)).
    pub fn rate_limit(mut self, rate_limit: Option<f64>) -> Self {
        self.rate_limit = rate_limit;
        self
    }

    /// Sets how many events are published at once (field [`concurrency`](Self::concurrency)).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Sets the events read per page (field [`page_size`](Self::page_size)).
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }

    /// Sets how long one publish may take (field
    /// [`publish_timeout`](Self::publish_timeout)).
    pub fn publish_timeout(mut self, publish_timeout: Duration) -> Self {
        self.publish_timeout = publish_timeout;
        self
    }

    /// Sets the tries of a failing event (field [`tries`](Self::tries)).
    pub fn tries(mut self, tries: u32) -> Self {
        self.tries = tries;
        self
    }

    /// Sets how long an event waits for a destination that is down (field
    /// [`patience`](Self::patience)).
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Events the sink acknowledged.
    pub published: u64,
    /// Events that could not be replayed, with the reason (publish errors, rows that cannot be
    /// read).
    pub failed: Vec<(i64, String)>,
}

/// A replay of the events a filter selects to a sink.
///
/// ```no_run
/// # async fn example(store: std::sync::Arc<dyn postbox::Store>, sink: std::sync::Arc<dyn postbox::Sink>) -> postbox::Result<()> {
/// use postbox::replay::{Replay, ReplayOptions};
/// use postbox::store::{EventFilter, EventStatus};
///
/// let target = postbox::Target::default_schema(store.default_schema());
/// let mut filter = EventFilter::default();
/// filter.event_type = Some("Invoice*".parse().expect("a glob"));
/// filter.statuses = vec![EventStatus::Processed];
/// filter.archive = true;
/// let replay = Replay::new(store, sink, ReplayOptions::default());
/// println!("{} events to replay", replay.count(&target, &filter).await?);
/// let report = replay.run(&target, &filter, |n| println!("+{n}")).await?;
/// println!("{} replayed, {} failed", report.published, report.failed.len());
/// # Ok(()) }
/// ```
pub struct Replay {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    options: ReplayOptions,
}

impl Replay {
    /// A replay from `store` to `sink`.
    pub fn new(store: Arc<dyn Store>, sink: Arc<dyn Sink>, options: ReplayOptions) -> Self {
        Replay {
            store,
            sink,
            options,
        }
    }

    /// The filter a replay uses: `filter` with the statuses a replay may take (`PROCESSED` and
    /// `FAILED` when none are named). Pending and claimed events are the relays' to publish, so
    /// naming them is refused.
    pub fn filter(filter: &EventFilter) -> Result<EventFilter> {
        let mut filter = filter.clone();
        if filter.statuses.is_empty() {
            filter.statuses = vec![EventStatus::Processed, EventStatus::Failed];
        }
        if let Some(status) = filter
            .statuses
            .iter()
            .find(|s| matches!(s, EventStatus::Pending | EventStatus::Processing))
        {
            return Err(crate::Error::InvalidFilter {
                field: "status",
                reason: format!(
                    "{status} events are published by the relays; a replay takes PROCESSED and \
                     FAILED events"
                ),
            });
        }
        filter.validate()?;
        Ok(filter)
    }

    /// How many events `filter` selects (a dry run), and the first `sample` of them.
    pub async fn count(&self, target: &Target, filter: &EventFilter) -> Result<u64> {
        Ok(self.preview(target, filter, 0).await?.0)
    }

    /// How many events `filter` selects, and the first `sample` of them, oldest first (see
    /// [`preview`]).
    pub async fn preview(
        &self,
        target: &Target,
        filter: &EventFilter,
        sample: usize,
    ) -> Result<(u64, Vec<StoredEvent>)> {
        preview(&*self.store, target, filter, sample).await
    }

    /// Publishes every event `filter` selects, oldest first; `progress` sees the count of each
    /// page's acknowledged events.
    pub async fn run(
        &self,
        target: &Target,
        filter: &EventFilter,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<ReplayReport> {
        let filter = Self::filter(filter)?;
        let mut report = ReplayReport::default();
        let mut pages = Pages::new(&*self.store, target, &filter, self.options.page_size);
        let mut pace = Pace::new(self.options.rate_limit);
        while let Some(page) = pages.next().await? {
            let mut events = Vec::with_capacity(page.len());
            for stored in page {
                match stored.to_outbox_event() {
                    Ok(event) => events.push(self.replayed(event)),
                    Err(reason) => report.failed.push((
                        stored.id,
                        format!("the stored event cannot be read: {reason}"),
                    )),
                }
            }
            let mut outcomes = futures::stream::iter(events)
                .map(|event| {
                    let wait = pace.next();
                    async move {
                        tokio::time::sleep_until(wait).await;
                        (event.id, self.publish(&event).await)
                    }
                })
                .buffer_unordered(self.options.concurrency.max(1));
            let mut acknowledged = 0;
            while let Some((id, outcome)) = outcomes.next().await {
                match outcome {
                    Ok(()) => acknowledged += 1,
                    Err(reason) => report.failed.push((id, reason)),
                }
            }
            report.published += acknowledged;
            progress(acknowledged);
        }
        report.failed.sort_unstable_by_key(|(id, _)| *id);
        Ok(report)
    }

    /// The delivery of a replayed event: marked as a replay, with the dedup id chosen.
    fn replayed(&self, mut event: OutboxEvent) -> OutboxEvent {
        let replay_id = &self.options.replay_id;
        event
            .headers
            .insert(REPLAY_OF_HEADER.to_owned(), event.id.to_string());
        event
            .headers
            .insert(REPLAY_ID_HEADER.to_owned(), replay_id.clone());
        if self.options.dedup == ReplayDedup::PerReplay {
            event.idempotency_key = Some(format!("{}:replay:{replay_id}", event.dedup_id()));
        }
        event
    }

    /// Publishes one event: failed tries are tried again (up to `tries`), a destination that
    /// is down is waited for (up to `patience`).
    async fn publish(&self, event: &OutboxEvent) -> std::result::Result<(), String> {
        let o = &self.options;
        let started = Instant::now();
        let mut tries = 0;
        loop {
            let error =
                match tokio::time::timeout(o.publish_timeout, self.sink.publish(event)).await {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(e)) => e,
                    Err(_) => crate::PublishError::retryable(format!(
                        "no answer within {:?}",
                        o.publish_timeout
                    )),
                };
            let wait = if error.is_unavailable() {
                if started.elapsed() >= o.patience {
                    return Err(crate::redact::redact(&format!(
                        "the destination stayed unavailable for {:?}: {error}",
                        o.patience
                    )));
                }
                error.retry_after().unwrap_or(Duration::from_secs(1))
            } else {
                tries += 1;
                if error.is_permanent() || tries >= o.tries {
                    return Err(crate::redact::redact(&error.to_string()));
                }
                Duration::from_millis(250) * 2u32.pow(tries.min(6))
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// A dry run of a replay, without a sink: how many events `filter` selects (with the statuses
/// of [`Replay::filter`]), and the first `sample` of them, oldest first. Reads a page at a time.
pub async fn preview(
    store: &dyn Store,
    target: &Target,
    filter: &EventFilter,
    sample: usize,
) -> Result<(u64, Vec<StoredEvent>)> {
    let filter = Replay::filter(filter)?;
    let mut pages = Pages::new(store, target, &filter, ReplayOptions::default().page_size);
    let (mut count, mut first) = (0, Vec::new());
    while let Some(page) = pages.next().await? {
        count += page.len() as u64;
        first.extend(page.into_iter().take(sample.saturating_sub(first.len())));
    }
    Ok((count, first))
}

/// The pages of a filter, oldest first.
struct Pages<'a> {
    store: &'a dyn Store,
    target: &'a Target,
    filter: &'a EventFilter,
    size: u32,
    after: Option<i64>,
    done: bool,
}

impl<'a> Pages<'a> {
    fn new(store: &'a dyn Store, target: &'a Target, filter: &'a EventFilter, size: u32) -> Self {
        Pages {
            store,
            target,
            filter,
            size: size.max(1),
            after: None,
            done: false,
        }
    }

    async fn next(&mut self) -> Result<Option<Vec<StoredEvent>>> {
        if self.done {
            return Ok(None);
        }
        let page = self
            .store
            .events_list(&ListParams {
                target: self.target,
                filter: self.filter,
                order: Order::OldestFirst,
                after: self.after,
                limit: self.size,
            })
            .await?;
        self.done = page.len() < self.size as usize;
        self.after = page.last().map(|e| e.id).or(self.after);
        Ok((!page.is_empty()).then_some(page))
    }
}

/// Start times spaced for a rate limit.
struct Pace {
    every: Option<Duration>,
    next: Instant,
}

impl Pace {
    fn new(rate: Option<f64>) -> Self {
        Pace {
            every: rate
                .filter(|r| r.is_finite() && *r > 0.0)
                .map(|r| Duration::from_secs_f64(1.0 / r)),
            next: Instant::now(),
        }
    }

    /// When the next event may start.
    fn next(&mut self) -> Instant {
        let Some(every) = self.every else {
            return Instant::now();
        };
        let at = self.next.max(Instant::now());
        self.next = at + every;
        at
    }
}
