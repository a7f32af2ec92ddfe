//! The producers of a seeded schedule: a model of what each producer connection is doing, from
//! which a random next step is drawn that is valid when it runs — a producer begins, inserts an
//! event of one of the aggregates (or many in one statement), sets or rolls back to a savepoint,
//! commits, rolls back, leaves its transaction open across later steps, prepares it
//! (two-phase commit) and later commits or rolls back the prepared transaction.
//!
//! ```
//! use postbox_testkit::producers::{Producers, Settings, Step};
//! use rand::SeedableRng;
//!
//! let mut rng = rand::rngs::StdRng::seed_from_u64(7);
//! let mut producers = Producers::new(Settings { producers: 2, aggregates: 3, ..Settings::default() });
//! let mut steps: Vec<Step> = (0..20).filter_map(|_| producers.next(&mut rng)).collect();
//! steps.extend(producers.end(&mut rng));
//! assert!(matches!(steps[0], Step::Begin(_)));
//! ```

use std::collections::HashMap;

use rand::Rng;
use rand::rngs::StdRng;

/// One producer's step; the first number is the producer, the second an aggregate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `BEGIN`.
    Begin(usize),
    /// One event of the aggregate.
    Insert(usize, usize),
    /// One statement inserting this many events of one aggregate.
    InsertMany(usize, usize, usize),
    /// `SAVEPOINT`.
    Savepoint(usize),
    /// `ROLLBACK TO SAVEPOINT`: the events since it roll back.
    RollbackToSavepoint(usize),
    /// `COMMIT`.
    Commit(usize),
    /// `ROLLBACK`.
    Rollback(usize),
    /// `PREPARE TRANSACTION`.
    Prepare(usize),
    /// `COMMIT PREPARED`.
    CommitPrepared(usize),
    /// `ROLLBACK PREPARED`.
    RollbackPrepared(usize),
}

/// What the producers of a schedule may do.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Producer connections.
    pub producers: usize,
    /// Aggregates their events belong to.
    pub aggregates: usize,
    /// A producer writes to an aggregate only while no other open or prepared transaction has
    /// written to it (the aggregate's row lock, as applications hold it).
    pub locks: bool,
    /// Transactions may be prepared (PostgreSQL's two-phase commit).
    pub prepares: bool,
    /// One writer at a time (SQLite): a producer begins only while no other is in a
    /// transaction.
    pub one_writer: bool,
    /// A tenth of the inserts write many events in one statement.
    pub many: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            producers: 3,
            aggregates: 3,
            locks: false,
            prepares: true,
            one_writer: false,
            many: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Idle,
    InTx { savepoint: bool },
    Prepared,
}

/// The producers' model.
pub struct Producers {
    settings: Settings,
    state: Vec<State>,
    /// Each aggregate's writer while `locks` holds.
    owner: HashMap<usize, usize>,
}

impl Producers {
    /// Every producer idle.
    pub fn new(settings: Settings) -> Self {
        Producers {
            settings,
            state: vec![State::Idle; settings.producers],
            owner: HashMap::new(),
        }
    }

    /// A random producer's next step, or `None` when the one drawn leaves its transaction
    /// open (or waits its turn) this time.
    pub fn next(&mut self, rng: &mut StdRng) -> Option<Step> {
        let p = rng.random_range(0..self.settings.producers);
        let writing = self.state.iter().any(|s| matches!(s, State::InTx { .. }));
        match self.state[p] {
            State::Idle if self.settings.one_writer && writing => None,
            State::Idle => {
                self.state[p] = State::InTx { savepoint: false };
                Some(Step::Begin(p))
            }
            State::InTx { savepoint } => {
                let roll = rng.random_range(0..100);
                if roll < 45 {
                    let a = rng.random_range(0..self.settings.aggregates);
                    if self.settings.locks && self.owner.get(&a).is_some_and(|o| *o != p) {
                        return None;
                    }
                    self.owner.insert(a, p);
                    Some(if self.settings.many && rng.random_bool(0.1) {
                        Step::InsertMany(p, a, rng.random_range(2..40))
                    } else {
                        Step::Insert(p, a)
                    })
                } else if roll < 50 && !savepoint {
                    self.state[p] = State::InTx { savepoint: true };
                    Some(Step::Savepoint(p))
                } else if roll < 55 && savepoint {
                    Some(Step::RollbackToSavepoint(p))
                } else if roll < 75 {
                    self.ended(p);
                    Some(Step::Commit(p))
                } else if roll < 83 {
                    self.ended(p);
                    Some(Step::Rollback(p))
                } else if roll < 90 && self.settings.prepares {
                    self.state[p] = State::Prepared;
                    Some(Step::Prepare(p))
                } else {
                    None
                }
            }
            State::Prepared => {
                let roll = rng.random_range(0..100);
                if roll < 30 {
                    self.ended(p);
                    Some(Step::CommitPrepared(p))
                } else if roll < 40 {
                    self.ended(p);
                    Some(Step::RollbackPrepared(p))
                } else {
                    None
                }
            }
        }
    }

    /// The server restarted: open transactions rolled back, prepared ones stay.
    pub fn server_restarted(&mut self) {
        for p in 0..self.state.len() {
            if matches!(self.state[p], State::InTx { .. }) {
                self.ended(p);
            }
        }
    }

    /// The steps that end what is open: most transactions commit, some roll back, prepared
    /// ones commit.
    pub fn end(&mut self, rng: &mut StdRng) -> Vec<Step> {
        let mut steps = vec![];
        for p in 0..self.state.len() {
            match self.state[p] {
                State::Idle => continue,
                State::InTx { .. } if rng.random_bool(0.8) => steps.push(Step::Commit(p)),
                State::InTx { .. } => steps.push(Step::Rollback(p)),
                State::Prepared => steps.push(Step::CommitPrepared(p)),
            }
            self.ended(p);
        }
        steps
    }

    fn ended(&mut self, p: usize) {
        self.state[p] = State::Idle;
        self.owner.retain(|_, o| *o != p);
    }
}
