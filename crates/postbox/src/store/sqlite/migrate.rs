//! SQLite migrations, applied in one `BEGIN IMMEDIATE` transaction.

use super::SqliteStore;
use crate::error::Result;
use crate::store::migrations::{self, Migration};

pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "outbox_0001_events",
        sql: include_str!("../../../sql/sqlite/0001_outbox_events.sql"),
    },
    Migration {
        name: "outbox_0002_sink_health",
        sql: include_str!("../../../sql/sqlite/0002_sink_health.sql"),
    },
    Migration {
        name: "outbox_0003_retention",
        sql: include_str!("../../../sql/sqlite/0003_retention.sql"),
    },
    Migration {
        name: "outbox_0004_ordering",
        sql: include_str!("../../../sql/sqlite/0004_ordering.sql"),
    },
    Migration {
        name: "outbox_0005_inbox",
        sql: include_str!("../../../sql/sqlite/0005_inbox.sql"),
    },
];

impl SqliteStore {
    /// [`StoreOps::schema_migrate`](crate::ops::StoreOps::schema_migrate).
    pub(super) async fn apply_migrations(&self) -> Result<Vec<String>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let history = migrations::History {
            create: include_str!("../../../sql/sqlite/history_create.sql").to_owned(),
            read: include_str!("../../../sql/sqlite/history_read.sql").to_owned(),
            record: include_str!("../../../sql/sqlite/history_record.sql").to_owned(),
        };
        let applied =
            migrations::apply::<sqlx::Sqlite>(&mut tx, &history, MIGRATIONS, str::to_owned).await?;
        tx.commit().await?;
        Ok(applied)
    }
}
