//! SQLite migrations, applied in one `BEGIN IMMEDIATE` transaction.

use super::SqliteStore;
use crate::error::Result;
use crate::store::migrations::{self, Migration, migration};

pub(super) const MIGRATIONS: &[Migration] = &[
    migration!("sqlite", "0001_outbox_events", was "outbox_0001_events"),
    migration!("sqlite", "0002_sink_health", was "outbox_0002_sink_health"),
    migration!("sqlite", "0003_retention", was "outbox_0003_retention"),
    migration!("sqlite", "0004_ordering", was "outbox_0004_ordering"),
    migration!("sqlite", "0005_inbox", was "outbox_0005_inbox"),
];

impl SqliteStore {
    /// [`StoreOps::schema_migrate`](crate::ops::StoreOps::schema_migrate).
    pub(super) async fn apply_migrations(&self) -> Result<Vec<String>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let history = migrations::History {
            create: include_str!("../../../sql/sqlite/queries/history_create.sql").to_owned(),
            read: include_str!("../../../sql/sqlite/queries/history_read.sql").to_owned(),
            record: include_str!("../../../sql/sqlite/queries/history_record.sql").to_owned(),
            rename: include_str!("../../../sql/sqlite/queries/history_rename.sql").to_owned(),
        };
        let applied =
            migrations::apply::<sqlx::Sqlite>(&mut tx, &history, MIGRATIONS, str::to_owned).await?;
        tx.commit().await?;
        Ok(applied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_listed_once_under_a_number_of_its_own() {
        migrations::assert_listed("sqlite", MIGRATIONS);
    }
}
