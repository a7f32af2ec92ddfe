//! Exponential backoff: the one formula behind every wait that grows after a failure — an
//! event's retries (computed in SQL on the database clock, which mirrors [`Backoff::delay`]), a
//! relay's pauses after a database error, a sink's reconnection attempts.

use std::time::Duration;

/// The exponent stops growing here: `2^40` times any base is past every sensible cap, and an
/// event retried for a very long time must not overflow the arithmetic (in Rust or in SQL, whose
/// mark statements use the same limit).
pub const MAX_EXPONENT: u32 = 40;

/// Waits that double after each failure, from `base` up to `cap`: the wait after the `n`-th
/// failure is `min(cap, base × 2^n)`.
///
/// For an event's retries `n` is its `retry_count` after the failed try (docs/architecture.md, "The contract"): with the
/// defaults (base 1 s, cap 300 s) the waits are 2 s, 4 s, 8 s, … 300 s. No jitter is added there:
/// the clock is the database's, and each event's wait starts at its own failure, so relays do
/// not retry in lockstep.
///
/// ```
/// use std::time::Duration;
/// use postbox::backoff::Backoff;
///
/// let b = Backoff::default();
/// assert_eq!(b.delay(1), Duration::from_secs(2));
/// assert_eq!(b.delay(20), Duration::from_secs(300));
///
/// // A reconnect loop: base, 2 × base, … up to the cap, and back to base after a success.
/// let mut waits = Backoff::new(Duration::from_millis(100), Duration::from_millis(350)).attempts();
/// let got: Vec<_> = (0..4).map(|_| waits.next_delay().as_millis()).collect();
/// assert_eq!(got, [100, 200, 350, 350]);
/// waits.reset();
/// assert_eq!(waits.next_delay(), Duration::from_millis(100));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The unit: the first wait of a reconnect loop, and half the wait after an event's first
    /// failed try (default 1 s).
    pub base: Duration,
    /// The longest wait (default 300 s).
    pub cap: Duration,
}

impl Default for Backoff {
    /// The seed's retry backoff: base 1 s, cap 300 s (docs/architecture.md, "The contract").
    fn default() -> Self {
        Backoff::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl Backoff {
    /// Waits from `base` up to `cap` (a cap below the base is raised to it).
    pub const fn new(base: Duration, cap: Duration) -> Self {
        let cap = if cap.as_nanos() < base.as_nanos() {
            base
        } else {
            cap
        };
        Backoff { base, cap }
    }

    /// The wait after the `n`-th failure: `min(cap, base × 2^n)`, the exponent stopping at
    /// [`MAX_EXPONENT`].
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 2f64.powi(n.min(MAX_EXPONENT) as i32);
        // Duration arithmetic in f64 seconds cannot overflow at these magnitudes; the cap bounds
        // the result.
        Duration::try_from_secs_f64(self.base.as_secs_f64() * factor)
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// The waits of a loop that retries until it succeeds: `base`, `2 × base`, … up to `cap`.
    pub fn attempts(self) -> Attempts {
        Attempts {
            backoff: self,
            failures: 0,
        }
    }
}

/// A running sequence of [`Backoff`] waits; see [`Backoff::attempts`].
#[derive(Clone, Debug)]
pub struct Attempts {
    backoff: Backoff,
    failures: u32,
}

impl Attempts {
    /// The wait before the next attempt; each call doubles the one after, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.backoff.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// How many waits were handed out since the start or the last [`reset`](Self::reset).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Starts over from `base` (after a success).
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_without_overflowing() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let got: Vec<u128> = (0..6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
        let huge = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert!(huge.delay(MAX_EXPONENT) <= Duration::MAX);
        assert_eq!(
            Backoff::new(Duration::from_secs(2), Duration::from_secs(1)).cap,
            Duration::from_secs(2),
            "a cap below the base is raised to it"
        );
    }
}
