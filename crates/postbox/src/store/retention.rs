//! Retention: what [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive) and
//! [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge) take and return.
//!
//! Both work in batches, each a short transaction of its own, so that neither holds a lock that
//! stops claims nor a snapshot that keeps vacuum from cleaning up; the caller loops until a
//! batch says it is `done` (see `relay::retention` and `postbox archive` / `postbox purge`).

use std::time::Duration;

use crate::schema::Target;

/// Parameters of [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive): one batch of moving
/// `PROCESSED` events created more than `older_than` ago to the archive.
#[derive(Clone, Debug)]
pub struct ArchiveParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// Events created longer ago than this (by the database clock) are archived.
    pub older_than: Duration,
    /// Where the walk resumes: the `last_id` of the previous batch, 0 at first.
    pub after_id: i64,
    /// Rows looked at per batch.
    pub batch_size: u32,
    /// Count what would move, and move nothing.
    pub dry_run: bool,
    /// How long each statement waits for a lock on the table (another session's `ALTER TABLE`,
    /// `VACUUM FULL`, `LOCK TABLE`) before it fails with the database's lock-timeout error;
    /// `None` waits as long as the lock is held. PostgreSQL only: MySQL and SQLite wait as
    /// their own settings say (`lock_wait_timeout`, the busy timeout).
    pub lock_wait: Option<Duration>,
}

/// One batch of [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchiveBatch {
    /// The last id looked at: the next batch starts after it.
    pub last_id: i64,
    /// Events moved to the archive (in a dry run, that would move).
    pub moved: u64,
    /// No event old enough is left after `last_id`.
    pub done: bool,
}

impl ArchiveBatch {
    /// A batch's outcome (for stores outside this crate).
    pub fn new(last_id: i64, moved: u64, done: bool) -> Self {
        ArchiveBatch {
            last_id,
            moved,
            done,
        }
    }
}

/// What [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge) deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PurgeKind {
    /// Archived events archived more than `older_than` ago.
    Archive,
    /// `FAILED` events whose last try is more than `older_than` ago (an operator's decision:
    /// relays never purge them).
    Failed,
    /// Inbox records ([`Inbox`](crate::inbox::Inbox)) received more than `older_than` ago: past the
    /// dedup window, a repeat of their message is handled again.
    Inbox,
}

/// Parameters of [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge).
#[derive(Clone, Debug)]
pub struct PurgeParams<'a> {
    /// Whose events.
    pub target: &'a Target,
    /// Archived or failed events.
    pub kind: PurgeKind,
    /// Age past which they go, by the database clock.
    pub older_than: Duration,
    /// Rows deleted per batch (whole weekly archive partitions are dropped at once on
    /// PostgreSQL, whatever their size).
    pub batch_size: u32,
    /// Count what would go, and delete nothing; the count covers every batch.
    pub dry_run: bool,
    /// How long each statement waits for a lock on the table (another session's `ALTER TABLE`,
    /// `VACUUM FULL`, `LOCK TABLE`) before it fails with the database's lock-timeout error;
    /// `None` waits as long as the lock is held. PostgreSQL only: MySQL and SQLite wait as
    /// their own settings say (`lock_wait_timeout`, the busy timeout).
    pub lock_wait: Option<Duration>,
}

/// One batch of [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeBatch {
    /// Events deleted (in a dry run, that would be).
    pub purged: u64,
    /// Nothing old enough is left.
    pub done: bool,
}

impl PurgeBatch {
    /// A batch's outcome (for stores outside this crate).
    pub fn new(purged: u64, done: bool) -> Self {
        PurgeBatch { purged, done }
    }
}

/// How long a run that waits for the retention lock sleeps between tries.
const LOCK_RETRY: Duration = Duration::from_millis(250);

/// Runs [`StoreOps::events_archive`](crate::ops::StoreOps::events_archive) batch after batch, from the
/// start of the table, until the walk is done; `progress` sees each batch's count. Returns how
/// many events moved (in a dry run, would move).
///
/// Another relay or command may hold the table's retention lock: with `wait`, the run waits for
/// it; without, it returns `None` when it could not start. A run that has begun always waits
/// for the lock between its batches: whoever took it meanwhile may be doing something else (a
/// purge batch, a dry run) and would not carry the archiving on.
///
/// ```no_run
/// # async fn example(store: &dyn postbox::Store) -> postbox::Result<()> {
/// use std::time::Duration;
/// use postbox::store::{ArchiveParams, archive_all};
///
/// let target = postbox::Target::default_schema(store.default_schema());
/// let params = ArchiveParams {
///     target: &target,
///     older_than: Duration::from_secs(30 * 86_400),
///     after_id: 0,
///     batch_size: 1_000,
///     dry_run: false,
///     lock_wait: None,
/// };
/// let moved = archive_all(store, params, true, |n| println!("+{n}")).await?;
/// println!("{moved:?} events archived");
/// # Ok(()) }
/// ```
pub async fn archive_all(
    store: &dyn super::Store,
    mut params: ArchiveParams<'_>,
    wait: bool,
    mut progress: impl FnMut(u64) + Send,
) -> crate::Result<Option<u64>> {
    let mut total = None;
    loop {
        match store.events_archive(&params).await? {
            Some(batch) => {
                let sum = total.unwrap_or(0) + batch.moved;
                total = Some(sum);
                progress(batch.moved);
                if batch.done {
                    return Ok(total);
                }
                params.after_id = batch.last_id;
            }
            None if wait || total.is_some() => tokio::time::sleep(LOCK_RETRY).await,
            None => return Ok(total),
        }
    }
}

/// Runs [`StoreOps::events_purge`](crate::ops::StoreOps::events_purge) batch after batch until nothing old
/// enough is left; `progress` sees each batch's count. Returns how many events went (in a dry
/// run, would go). `wait` as for [`archive_all`].
pub async fn purge_all(
    store: &dyn super::Store,
    params: PurgeParams<'_>,
    wait: bool,
    mut progress: impl FnMut(u64) + Send,
) -> crate::Result<Option<u64>> {
    let mut total = None;
    loop {
        match store.events_purge(&params).await? {
            Some(batch) => {
                let sum = total.unwrap_or(0) + batch.purged;
                total = Some(sum);
                progress(batch.purged);
                if batch.done {
                    return Ok(total);
                }
            }
            None if wait || total.is_some() => tokio::time::sleep(LOCK_RETRY).await,
            None => return Ok(total),
        }
    }
}
