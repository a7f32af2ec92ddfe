//! Waiting on conditions and on a relay's rounds instead of sleeping.

use std::time::Duration;

use postbox::{RelayProgress, Rounds};

/// Waits until `check` returns true, polling every few milliseconds; panics with `what` if it has
/// not happened within `timeout`. Tests wait on conditions with it instead of sleeping blindly.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        // The step between two looks at a condition nothing signals (a row's state in a
        // database, a message on a broker): a poll, not a guess at how long something takes.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

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
