//! Waiting on conditions and on a relay's rounds instead of sleeping.

use std::time::Duration;

use postbox::{relay::RelayProgress, relay::Rounds};

/// What a check given to [`wait_until`] answers: whether the awaited thing has happened, and
/// with what.
///
/// - `bool`: it has happened (`true`) or not yet; [`wait_until`] returns `()`.
/// - `Option<T>`: `Some(value)` once it has; [`wait_until`] returns the value.
/// - `Result<T, E>`: `Ok(value)` once it has, `Err(why_not)` until then; [`wait_until`] returns
///   the value, and names the last `why_not` if it gives up.
pub trait Ready {
    /// What [`wait_until`] returns once the check holds.
    type Value;
    /// `Ok` with the value once the check holds; `Err` with why not (if the check says) before.
    fn ready(self) -> Result<Self::Value, Option<String>>;
}

impl Ready for bool {
    type Value = ();

    fn ready(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Ready for Option<T> {
    type Value = T;

    fn ready(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Display> Ready for Result<T, E> {
    type Value = T;

    fn ready(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// Waits until `check` holds, looking every few milliseconds (or, after a slow look, after as
/// long as it took), and returns what it answered
/// (see [`Ready`]: `true`, `Some(value)` or `Ok(value)`); panics with `what`, `timeout` and the
/// check's last `Err` if it has not held within `timeout`.
///
/// The one way the tests wait on a condition nothing signals (a row's state in a database, a
/// message on a broker, a port answering): never a loop around a sleep of their own.
///
/// ```no_run
/// # async fn example(sink: postbox_testkit::RecordingSink) {
/// use std::time::Duration;
///
/// let first: i64 = postbox_testkit::wait_until(
///     "an event is published",
///     Duration::from_secs(10),
///     || async { sink.published_ids().first().copied() },
/// )
/// .await;
/// # }
/// ```
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> <Fut::Output as Ready>::Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future,
    Fut::Output: Ready,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let looked = tokio::time::Instant::now();
        let why_not = match check().await.ready() {
            Ok(value) => return value,
            Err(why_not) => why_not,
        };
        let look = looked.elapsed();
        if tokio::time::Instant::now() >= deadline {
            match why_not {
                Some(why_not) => {
                    panic!("timed out after {timeout:?} waiting until {what} (last: {why_not})")
                }
                None => panic!("timed out after {timeout:?} waiting until {what}"),
            }
        }
        // The step between two looks at a condition nothing signals: a poll, not a guess at
        // how long something takes. A look that takes long (a count over a large table) is
        // followed by a pause as long, so the waiting never takes more than half of what it
        // looks at.
        tokio::time::sleep(POLL.max(look)).await;
    }
}

/// How long [`wait_until`] waits between two quick looks.
const POLL: Duration = Duration::from_millis(5);

/// Waits until the relay has finished a round begun after the call and is waiting for its next
/// ([`Rounds::settle`]): everything due before the call has been claimed, and what the relay
/// left alone it chose to. Panics with `what` after `timeout`.
///
/// ```no_run
/// # async fn example(relay: postbox::Relay) {
/// let mut rounds = relay.rounds();
/// let handle = relay.start();
/// postbox_testkit::settled(&mut rounds, "the relay looked past the held event",
///     std::time::Duration::from_secs(10)).await;
/// # let _ = handle.stop().await; }
/// ```
pub async fn settled(rounds: &mut Rounds, what: &str, timeout: Duration) {
    if tokio::time::timeout(timeout, rounds.settle())
        .await
        .is_err()
    {
        panic!(
            "timed out after {timeout:?} waiting until {what} (the relay did not settle: {:?})",
            rounds.progress()
        );
    }
}

/// Waits until `done` holds for the relay's progress ([`Rounds::until`]): a number of rounds
/// finished, the relay waiting, the slow lane's passes. Panics with `what` after `timeout`.
pub async fn relay_until(
    rounds: &mut Rounds,
    what: &str,
    timeout: Duration,
    done: impl FnMut(&RelayProgress) -> bool + Send,
) {
    if tokio::time::timeout(timeout, rounds.until(done))
        .await
        .is_err()
    {
        panic!(
            "timed out after {timeout:?} waiting until {what} (the relay is at {:?})",
            rounds.progress()
        );
    }
}
