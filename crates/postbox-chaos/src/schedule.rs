//! The fault schedule: drawn once, up front, from the seed, so a seed names a run.

use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FaultKind {
    /// SIGKILL a relay; a replacement starts after `hold`.
    Kill,
    /// SIGSTOP a relay for `hold` (longer than its lease), then SIGCONT: other relays take its
    /// events over, and its late writes must be fenced.
    Pause,
    /// Stop PostgreSQL (fast or immediate), keep it down for `hold`, start it again.
    PgRestart,
    /// The broker stores what the relays send but its answers are swallowed for `hold`.
    BrokerStall,
    /// The broker refuses connections for `hold`.
    BrokerDown,
    /// A `REPEATABLE READ` transaction that read the outbox stays open for `hold` (a `pg_dump`,
    /// a long report): nothing can remove the row versions the relays' marks leave meanwhile.
    LongTransaction,
    /// The CDC relays' replication slot is dropped under them (its reader's connection ended
    /// first), as a DBA or a failover would; `hold` passes before the next fault. CDC runs
    /// only (`--source cdc`).
    SlotDrop,
}

impl FaultKind {
    /// Every kind, in the order reports list them.
    pub(crate) const ALL: [FaultKind; 7] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::PgRestart,
        FaultKind::BrokerStall,
        FaultKind::BrokerDown,
        FaultKind::LongTransaction,
        FaultKind::SlotDrop,
    ];

    /// The kinds a polling run draws from by default: all but [`FaultKind::SlotDrop`].
    pub(crate) const POLLING: [FaultKind; 6] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::PgRestart,
        FaultKind::BrokerStall,
        FaultKind::BrokerDown,
        FaultKind::LongTransaction,
    ];

    /// What it hurts: faults of one lane never overlap; with `--overlap`, faults of different
    /// lanes may.
    pub(crate) fn lane(self) -> Lane {
        match self {
            FaultKind::Kill | FaultKind::Pause => Lane::Relays,
            FaultKind::PgRestart | FaultKind::LongTransaction | FaultKind::SlotDrop => {
                Lane::Database
            }
            FaultKind::BrokerStall | FaultKind::BrokerDown => Lane::Broker,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::PgRestart => "pg-restart",
            FaultKind::BrokerStall => "broker-stall",
            FaultKind::BrokerDown => "broker-down",
            FaultKind::LongTransaction => "long-transaction",
            FaultKind::SlotDrop => "slot-drop",
        }
    }
}

/// The three things faults hurt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lane {
    Relays,
    Database,
    Broker,
}

impl Lane {
    const ALL: [Lane; 3] = [Lane::Relays, Lane::Database, Lane::Broker];
}

/// One fault of the schedule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Fault {
    /// When it starts, from the start of the producers.
    #[serde(rename = "at_ms", serialize_with = "millis")]
    pub(crate) at: Duration,
    pub(crate) kind: FaultKind,
    /// The relay slot it hits (kill, pause).
    pub(crate) relay: u32,
    /// How long it lasts: the outage, the pause, PostgreSQL's downtime, or the time before a
    /// killed relay's replacement starts.
    #[serde(rename = "hold_ms", serialize_with = "millis")]
    pub(crate) hold: Duration,
    /// PostgreSQL restart: `-m immediate` (a crash, recovery at start) rather than `-m fast`.
    pub(crate) immediate: bool,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.at.as_secs_f64();
        let hold = self.hold.as_secs_f64();
        match self.kind {
            FaultKind::Kill => write!(
                f,
                "{at:>8.1}s  kill relay {} (replacement after {hold:.1}s)",
                self.relay
            ),
            FaultKind::Pause => {
                write!(f, "{at:>8.1}s  pause relay {} for {hold:.1}s", self.relay)
            }
            FaultKind::PgRestart => write!(
                f,
                "{at:>8.1}s  restart PostgreSQL ({}), down {hold:.1}s",
                if self.immediate { "immediate" } else { "fast" }
            ),
            FaultKind::BrokerStall => write!(f, "{at:>8.1}s  stall the broker for {hold:.1}s"),
            FaultKind::BrokerDown => write!(f, "{at:>8.1}s  cut the broker off for {hold:.1}s"),
            FaultKind::LongTransaction => {
                write!(f, "{at:>8.1}s  hold a snapshot open for {hold:.1}s")
            }
            FaultKind::SlotDrop => write!(
                f,
                "{at:>8.1}s  drop the replication slot, then {hold:.1}s to make it again"
            ),
        }
    }
}

/// What a schedule is drawn from.
#[derive(Clone, Debug)]
pub(crate) struct ScheduleParams {
    pub(crate) seed: u64,
    pub(crate) duration: Duration,
    pub(crate) relays: u32,
    pub(crate) kinds: Vec<FaultKind>,
    pub(crate) gap: Duration,
    pub(crate) lease: Duration,
    pub(crate) max_outage: Duration,
    pub(crate) max_pg_downtime: Duration,
    /// Let faults of different lanes overlap (a relay killed while PostgreSQL is down, say).
    pub(crate) overlap: bool,
}

/// The faults of a run, in order of their start. Faults of one lane never overlap; without
/// `overlap`, no two faults do.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Schedule {
    pub(crate) faults: Vec<Fault>,
    /// Faults of different lanes may overlap.
    pub(crate) overlap: bool,
}

impl Schedule {
    /// Draws the schedule. The stream of random numbers is ChaCha8 seeded with `seed` alone, so
    /// a seed gives the same schedule on every machine and after a `rand` upgrade. With
    /// `overlap`, each lane draws its own faults from a stream of its own, as often as its
    /// share of the kinds, so the run holds as many faults as without.
    pub(crate) fn generate(p: &ScheduleParams) -> Schedule {
        if !p.overlap {
            let mut rng = ChaCha8Rng::seed_from_u64(p.seed);
            return Schedule {
                faults: draw(&mut rng, p, &p.kinds, p.gap),
                overlap: false,
            };
        }
        let mut faults = Vec::new();
        for (i, lane) in Lane::ALL.into_iter().enumerate() {
            let kinds: Vec<FaultKind> = p
                .kinds
                .iter()
                .copied()
                .filter(|k| k.lane() == lane)
                .collect();
            if kinds.is_empty() {
                continue;
            }
            let mut rng = ChaCha8Rng::seed_from_u64(p.seed ^ (0x5eed_0000 + i as u64));
            // A lane with a third of the kinds has a third of the faults.
            let gap = p.gap * p.kinds.len() as u32 / kinds.len() as u32;
            faults.extend(draw(&mut rng, p, &kinds, gap));
        }
        faults.sort_by_key(|f| f.at);
        Schedule {
            faults,
            overlap: true,
        }
    }

    /// A short fingerprint of the schedule, to see at a glance that two runs replayed the same
    /// one (FNV-1a over its printed form).
    pub(crate) fn fingerprint(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for fault in &self.faults {
            for byte in fault.to_string().bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{hash:016x}")
    }

    /// How many faults of `kind` the schedule holds.
    #[cfg(test)]
    pub(crate) fn count(&self, kind: FaultKind) -> usize {
        self.faults.iter().filter(|f| f.kind == kind).count()
    }
}

/// One sequence of faults drawn from `kinds`, each after the previous one ended and a gap.
fn draw(
    rng: &mut ChaCha8Rng,
    p: &ScheduleParams,
    kinds: &[FaultKind],
    gap: Duration,
) -> Vec<Fault> {
    let mut faults = Vec::new();
    if kinds.is_empty() {
        return faults;
    }
    // The relays start and the first events flow before the first fault.
    let mut at = p.duration.min(Duration::from_secs(5)).min(p.duration / 10);
    loop {
        let kind = kinds[rng.random_range(0..kinds.len())];
        let relay = rng.random_range(0..p.relays);
        let immediate = rng.random_bool(0.5);
        let hold = match kind {
            FaultKind::Kill | FaultKind::SlotDrop => {
                between(rng, Duration::ZERO, Duration::from_secs(2))
            }
            // Past the lease, so other relays take the paused relay's events over.
            FaultKind::Pause => between(rng, p.lease * 3 / 2, p.lease * 3),
            FaultKind::PgRestart => between(rng, Duration::ZERO, p.max_pg_downtime),
            FaultKind::BrokerStall | FaultKind::BrokerDown => {
                between(rng, Duration::from_millis(500), p.max_outage)
            }
            // Minutes in a long run (a twelfth to a sixth of it, three minutes at most), so
            // that the relays mark thousands of events behind it.
            FaultKind::LongTransaction => {
                let most = (p.duration / 6).min(Duration::from_secs(180));
                between(rng, most / 2, most)
            }
        };
        let gap = between(rng, gap / 2, gap * 3 / 2);
        if at + hold > p.duration {
            break;
        }
        faults.push(Fault {
            at,
            kind,
            relay,
            hold,
            immediate,
        });
        at += hold + gap.max(Duration::from_millis(100));
    }
    faults
}

/// A duration drawn uniformly from `low..=high`, to the millisecond.
fn between(rng: &mut ChaCha8Rng, low: Duration, high: Duration) -> Duration {
    let low = low.as_millis() as u64;
    let high = (high.as_millis() as u64).max(low);
    Duration::from_millis(rng.random_range(low..=high))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64) -> ScheduleParams {
        ScheduleParams {
            seed,
            duration: Duration::from_secs(120),
            relays: 3,
            kinds: FaultKind::POLLING.to_vec(),
            gap: Duration::from_secs(4),
            lease: Duration::from_secs(3),
            max_outage: Duration::from_secs(8),
            max_pg_downtime: Duration::from_secs(3),
            overlap: false,
        }
    }

    #[test]
    fn a_seed_gives_the_same_schedule_and_another_seed_another() {
        let a = Schedule::generate(&params(7));
        let b = Schedule::generate(&params(7));
        let c = Schedule::generate(&params(8));
        assert_eq!(a.faults, b.faults);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn faults_stay_inside_the_run_and_never_overlap() {
        for seed in 0..50 {
            let s = Schedule::generate(&params(seed));
            assert!(!s.faults.is_empty());
            let mut free_at = Duration::ZERO;
            for f in &s.faults {
                assert!(
                    f.at >= free_at,
                    "seed {seed}: {f} overlaps the fault before"
                );
                assert!(
                    f.at + f.hold <= Duration::from_secs(120),
                    "seed {seed}: {f}"
                );
                assert!(f.relay < 3);
                if f.kind == FaultKind::Pause {
                    assert!(
                        f.hold > Duration::from_secs(3),
                        "a pause outlasts the lease"
                    );
                }
                free_at = f.at + f.hold;
            }
        }
    }

    #[test]
    fn overlapping_faults_overlap_only_across_lanes() {
        let mut p = params(3);
        p.overlap = true;
        let s = Schedule::generate(&p);
        assert_eq!(s.faults, Schedule::generate(&p).faults, "replayable");
        let mut overlaps = 0;
        for (i, a) in s.faults.iter().enumerate() {
            for b in &s.faults[i + 1..] {
                if b.at < a.at + a.hold {
                    assert_ne!(
                        a.kind.lane(),
                        b.kind.lane(),
                        "{a} and {b} overlap in one lane"
                    );
                    overlaps += 1;
                }
            }
        }
        assert!(overlaps > 0, "two minutes of three lanes overlap somewhere");
    }

    #[test]
    fn only_the_chosen_kinds_are_drawn() {
        let mut p = params(1);
        p.kinds = vec![FaultKind::Pause];
        let s = Schedule::generate(&p);
        assert_eq!(s.count(FaultKind::Pause), s.faults.len());
    }
}
