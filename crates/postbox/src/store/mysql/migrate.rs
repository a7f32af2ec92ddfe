//! MySQL migrations, applied under the database's named migration lock.

use sqlx::mysql::MySql;

use super::{MIGRATION_LOCK, MySqlStore, try_lock, unlock};
use crate::error::{Error, Result};
use crate::store::migrations::{self, Migration, migration};

pub(super) const MIGRATIONS: &[Migration] = &[
    migration!("mysql", "0001_outbox_events", was "outbox_0001_events"),
    migration!("mysql", "0002_retry_due", was "outbox_0002_retry_due"),
    migration!("mysql", "0003_retry_index", was "outbox_0003_retry_index"),
    migration!("mysql", "0004_inbox", was "outbox_0004_inbox"),
    migration!("mysql", "0005_truncate_guard"),
];

impl MySqlStore {
    /// [`StoreOps::schema_migrate`](crate::ops::StoreOps::schema_migrate).
    pub(super) async fn apply_migrations(&self) -> Result<Vec<String>> {
        // MySQL commits each DDL statement at once: a named lock keeps migrations one at a time.
        let mut conn = self.pool.acquire().await?;
        if !try_lock(&mut conn, MIGRATION_LOCK, 60).await? {
            return Err(Error::Unsupported(
                "another `postbox migrate` has held the migration lock of this database for a \
                 minute; try again when it is done",
            ));
        }
        let history = migrations::History {
            create: include_str!("../../../sql/mysql/queries/history_create.sql").to_owned(),
            read: include_str!("../../../sql/mysql/queries/history_read.sql").to_owned(),
            record: include_str!("../../../sql/mysql/queries/history_record.sql").to_owned(),
            rename: include_str!("../../../sql/mysql/queries/history_rename.sql").to_owned(),
        };
        let applied =
            migrations::apply::<MySql>(&mut conn, &history, MIGRATIONS, str::to_owned).await;
        unlock(&mut conn, MIGRATION_LOCK).await?;
        applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_listed_once_under_a_number_of_its_own() {
        migrations::assert_listed("mysql", MIGRATIONS);
    }
}
