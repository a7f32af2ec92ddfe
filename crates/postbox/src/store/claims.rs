//! What the relay's hot path passes to a [`Store`](super::Store) and gets back: claims and
//! their order, the gaps a relay passed, the commit horizon, leases and marks.

use std::ops::RangeInclusive;
use std::time::Duration;

use uuid::Uuid;

use super::Undecodable;
use crate::event::OutboxEvent;
use crate::schema::Target;

#[cfg(doc)]
use super::{Capabilities, Store};

/// Parameters of [`Store::events_claim`].
#[derive(Clone, Debug)]
pub struct ClaimParams<'a> {
    /// Whose events to claim.
    pub target: &'a Target,
    /// At most this many events.
    pub batch_size: u32,
    /// How long the claim lasts before another relay may take the events over.
    pub lease: Duration,
    /// This relay's id, written to `locked_by`.
    pub relay_id: &'a str,
    /// Which events go one aggregate at a time, in commit order (G6); none by default.
    pub order: ClaimOrder<'a>,
    /// Where new work is claimed from: an id below which every event is finished or went
    /// wrong once (see [`Store::claim_floor`]); 0 claims from the start. Stores that do not
    /// [claim from a floor](crate::store::Capabilities) ignore it.
    pub floor: i64,
}

/// Per-aggregate ordering of a claim (G6, `docs/guarantees.md`): an event of an ordered
/// aggregate type is claimed only once every earlier event of its aggregate is `PROCESSED` or
/// skipped by an operator (or taken by the same claim, which then holds its aggregate's events
/// in id order), and once its id is at or below the commit horizon.
///
/// ```
/// let types = vec!["Invoice".to_owned()];
/// let order = postbox::store::ClaimOrder {
///     aggregate_types: &types,
///     settled_through: 42,
///     walk: 400,
///     sweep: false,
/// };
/// assert!(order.is_on());
/// assert!(!postbox::store::ClaimOrder::default().is_on());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct ClaimOrder<'a> {
    /// Ordered aggregate types; `*` orders every aggregate; empty turns ordering off.
    pub aggregate_types: &'a [String],
    /// The commit horizon ([`Store::commit_horizon`]): ordered events above this id are not
    /// claimed yet, since a transaction that may still commit an earlier id is running.
    pub settled_through: i64,
    /// With ordering on, the span of ids the claim reads in id order, from the first due event
    /// at or above the floor, each event checked against the earlier events of its aggregate.
    /// When events there wait for their aggregates and the batch is not full, it takes ready
    /// aggregates' heads (and the events right behind them) directly, looking at up to
    /// 4 × `batch_size` aggregates, so that its cost does not grow with the events waiting
    /// behind aggregates in flight or parked; when nothing there waits, it reads on in id
    /// order. 0 reads on to the end. Stores whose claim reads in id order only (MySQL/MariaDB,
    /// SQLite) ignore it.
    pub walk: u32,
    /// Whether the claim is a sweep: it looks at every aggregate's head, not only the first
    /// 4 × `batch_size`, and also takes the due events past the [`walk`](Self::walk) that are
    /// not ordered (no aggregate, or a type not in [`aggregate_types`](Self::aggregate_types)),
    /// in one read of them without a check of their aggregates. A relay makes one a second;
    /// until then such events wait for the events before them.
    pub sweep: bool,
}

impl ClaimOrder<'_> {
    /// Whether any aggregate type is ordered.
    pub fn is_on(&self) -> bool {
        !self.aggregate_types.is_empty()
    }
}

/// Parameters of [`Store::claim_gaps`].
#[derive(Clone, Debug)]
pub struct GapParams<'a> {
    /// Whose table to read.
    pub target: &'a Target,
    /// Ranges of ids a relay's floor or cursor went past while none of them was visible (a
    /// transaction still open, one that rolled back, rows removed): the rows in them now are
    /// looked up.
    pub passed: &'a [RangeInclusive<i64>],
    /// The first `limit` ids present after this one are read, in id order.
    pub after: i64,
    /// See [`after`](Self::after); 0 reads none.
    pub limit: u32,
}

/// The answer of [`Store::claim_gaps`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gaps {
    /// The last id of the first [`GapParams::limit`] ids present (visible, whatever their
    /// status) after [`GapParams::after`]; `None` when none is.
    pub read_through: Option<i64>,
    /// How many ids present were read (at most [`GapParams::limit`]; equal to it when more may
    /// follow).
    pub read: u64,
    /// The ranges of ids after [`GapParams::after`] and below
    /// [`read_through`](Self::read_through) that are not present (in flight, rolled back or
    /// removed), ascending. The store answers the ranges rather than every id present: a read
    /// past a held transaction spans up to hundreds of thousands of ids, and few are missing.
    pub missing: Vec<RangeInclusive<i64>>,
    /// The rows now in [`GapParams::passed`]: committed since the relay passed them.
    pub found: Vec<PassedEvent>,
}

/// A row in one of [`GapParams::passed`], committed since the relay passed its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassedEvent {
    /// Its id.
    pub id: i64,
    /// In flight or waiting without having gone wrong (no `last_error`): below the floor, only
    /// the relay's passed ranges find it.
    pub unfinished: bool,
    /// Unfinished, and no relay holds a lease on it: a claim may take it now.
    pub claimable: bool,
}

/// A probe of a table's commit horizon, kept between calls of [`Store::commit_horizon`]: the
/// last id drawn when it was taken, and the transactions then writing to the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HorizonProbe {
    /// The last id the table's sequence had handed out.
    pub last_id: i64,
    /// The writers of the table then (PostgreSQL virtual transaction ids).
    pub writers: Vec<String>,
}

/// The answer of [`Store::commit_horizon`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Horizon {
    /// Every event at or below this id is committed or rolled back for good, when known.
    pub settled: Option<i64>,
    /// The probe to pass to the next call.
    pub probe: Option<HorizonProbe>,
}

/// Where a relay without ordered aggregate types knows its claims of a target start, for
/// [`Store::backlog_from`]: its floor (every event below it that never went wrong is finished,
/// but in `passed` or put back by hand), and the ranges of ids it passed while a transaction
/// held the commit horizon back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BacklogFrom {
    /// The relay's floor.
    pub floor: i64,
    /// The ranges of ids the relay passed that it reads again.
    pub passed: Vec<std::ops::RangeInclusive<i64>>,
}

/// The result of [`Store::events_claim`].
#[derive(Debug, Default)]
pub struct Claimed {
    /// The fencing token of this claim; every later write on these events must present it.
    pub claim_token: Uuid,
    /// Events now `PROCESSING` under this relay's lease, in id order.
    pub events: Vec<OutboxEvent>,
    /// How many of `events` were stale claims of a relay that did not finish in time (their lost
    /// lease counted as a failed try).
    pub recovered: u64,
    /// Stale events whose lost lease was their last allowed try: they are now `FAILED`.
    pub exhausted: Vec<ExhaustedEvent>,
    /// Claimed events whose rows cannot be read (a column a producer filled with what cannot be
    /// decoded); the relay fails them at once, fenced by this claim's token.
    pub undecodable: Vec<Undecodable>,
}

/// A stale event that went `FAILED` when its lease ran out on its last try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExhaustedEvent {
    /// The event id.
    pub id: i64,
    /// Its event type.
    pub event_type: String,
    /// The failed tries, now equal to the event's `max_retries`.
    pub retry_count: i32,
    /// The reason stored in `last_error`.
    pub last_error: String,
}

/// Parameters of [`Store::leases_renew`].
#[derive(Clone, Debug)]
pub struct RenewParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token.
    pub claim_token: Uuid,
    /// The events still being published.
    pub ids: &'a [i64],
    /// The new lease, from the database's `now()`.
    pub lease: Duration,
}

/// Parameters of [`Store::events_mark_processed`].
#[derive(Clone, Debug)]
pub struct MarkProcessedParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token; rows claimed since by another relay are left alone.
    pub claim_token: Uuid,
    /// Events whose publishing was acknowledged.
    pub ids: &'a [i64],
}

/// One failed try, for [`Store::events_mark_failed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedTry {
    /// The event id.
    pub id: i64,
    /// The error, stored in `last_error` (without NUL characters, and cut to
    /// [`MAX_ERROR_BYTES`]).
    pub error: String,
    /// A permanent error sends the event to `FAILED` at once, whatever its retries.
    pub permanent: bool,
    /// Tries before `FAILED` for this event, instead of its `max_retries` column (a retry
    /// policy of its type); `None` keeps the column's.
    pub max_retries: Option<i32>,
}

/// Parameters of [`Store::events_mark_failed`].
#[derive(Clone, Debug)]
pub struct MarkFailedParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token.
    pub claim_token: Uuid,
    /// The failed tries.
    pub tries: &'a [FailedTry],
    /// The backoff before the next try.
    pub retry: crate::backoff::Backoff,
}

/// An event whose destination was down, for [`Store::events_release`].
#[derive(Clone, Debug, PartialEq)]
pub struct Release {
    /// The event id.
    pub id: i64,
    /// Why, stored in `last_error` (cleaned as [`FailedTry::error`] is).
    pub error: String,
    /// When to try it again, from the database's `now()`.
    pub delay: Duration,
}

/// Parameters of [`Store::events_release`].
#[derive(Clone, Debug)]
pub struct ReleaseParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// The claim's fencing token.
    pub claim_token: Uuid,
    /// The events to put back.
    pub releases: &'a [Release],
}

/// What became of one failed try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedMark {
    /// The event id.
    pub id: i64,
    /// Failed tries so far, this one included.
    pub retry_count: i32,
    /// `true` when the event is now `FAILED` for good; `false` when it waits for a retry.
    pub gave_up: bool,
}

/// The longest error text stored in `last_error`, in bytes; longer ones are cut (on a character
/// boundary) and end in `…`.
pub const MAX_ERROR_BYTES: usize = 4096;

/// An error text as it can be stored: secrets hidden ([`crate::redact::redact`]), without NUL
/// characters (PostgreSQL's text cannot hold them, and one would make the whole mark fail) and
/// at most [`MAX_ERROR_BYTES`] long.
pub(crate) fn storable_error(error: &str) -> std::borrow::Cow<'_, str> {
    let error = crate::redact::redact(error);
    if error.len() <= MAX_ERROR_BYTES && !error.contains('\0') {
        return std::borrow::Cow::Owned(error);
    }
    let mut text: String = error.chars().filter(|c| *c != '\0').collect();
    if text.len() > MAX_ERROR_BYTES {
        let mut cut = MAX_ERROR_BYTES - '…'.len_utf8();
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    std::borrow::Cow::Owned(text)
}
