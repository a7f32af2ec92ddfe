//! PostgreSQL wake-ups: a listener on the channel `enqueue` notifies.

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPoolOptions};

use super::PgStore;
use crate::error::Result;
use crate::store::Wakeups;

/// The channel enqueue notifies and relays listen on; the payload is the schema name.
pub(crate) const NOTIFY_CHANNEL: &str = "postbox_events";

struct PgWakeups {
    listener: PgListener,
}

#[async_trait]
impl Wakeups for PgWakeups {
    async fn next(&mut self) -> Result<Option<String>> {
        // One at a time: each names its schema, and the relay claims just those it names.
        let n = self.listener.recv().await?;
        Ok(Some(n.payload().to_owned()))
    }
}

impl PgStore {
    /// [`Store::wakeups`](crate::Store::wakeups).
    pub(super) async fn listen(&self) -> Result<Option<Box<dyn Wakeups>>> {
        // A listener keeps its connection checked out for as long as it lives, so it gets a
        // connection of its own rather than one of the pool's: on a one-connection pool it
        // would otherwise leave the relay waiting for itself.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with((*self.pool.connect_options()).clone());
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(NOTIFY_CHANNEL).await?;
        Ok(Some(Box::new(PgWakeups { listener })))
    }
}
