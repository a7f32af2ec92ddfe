//! PostgreSQL migrations: the outbox and registry migrations, applied under the schema's
//! migration lock, and the retry index built concurrently after them.

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use super::functions;
use super::sql::{render, safe};
use super::{PgStore, map_missing_table, pg_locks};
use crate::error::{Error, Result};
use crate::schema::SchemaName;
use crate::store::migrations::{self, Migration, migration};

/// The index of the events below a relay's floor that claims still take (migration
/// `0008_claim.sql`), built by `PgStore::build_retry_index`.
pub(super) const RETRY_INDEX: &str = "outbox_events_retry_idx";

/// Migrations of every outbox schema, in order (`sql/postgres/migrations/`; the numbers are
/// shared with [`REGISTRY_MIGRATIONS`], one sequence per dialect). Names are recorded in the
/// schema's `postbox_schema_history` table, never in the application's own migration table.
pub(super) const OUTBOX_MIGRATIONS: &[Migration] = &[
    migration!("postgres", "0001_outbox_events", was "outbox_0001_events"),
    migration!("postgres", "0002_claim_function", was "outbox_0002_claim_function"),
    migration!("postgres", "0003_no_auto_analyze", was "outbox_0003_no_auto_analyze"),
    migration!("postgres", "0004_bounded_reads", was "outbox_0004_bounded_reads"),
    migration!("postgres", "0005_sql_enqueue", was "outbox_0005_sql_enqueue"),
    migration!("postgres", "0006_retention", was "outbox_0006_retention"),
    migration!("postgres", "0007_ordering", was "outbox_0007_ordering"),
    migration!("postgres", "0008_claim", was "outbox_0008_claim"),
    migration!("postgres", "0009_ordered_heads", was "outbox_0009_ordered_heads"),
    migration!("postgres", "0010_ordered_backlog", was "outbox_0010_ordered_backlog"),
    migration!("postgres", "0011_ordered_runs", was "outbox_0011_ordered_runs"),
    migration!("postgres", "0012_inlined_probes", was "outbox_0012_inlined_probes"),
    migration!("postgres", "0013_inbox", was "outbox_0013_inbox"),
    migration!("postgres", "0014_horizon_checks", was "outbox_0014_horizon_checks"),
    migration!("postgres", "0018_function_checksums"),
    migration!("postgres", "0019_id_high_water"),
];

/// Migrations of the default schema only, applied after the outbox's.
pub(super) const REGISTRY_MIGRATIONS: &[Migration] = &[
    migration!("postgres", "0015_registry_tenants", was "registry_0001_tenants"),
    migration!("postgres", "0016_registry_tenant_names", was "registry_0002_tenant_names"),
    migration!("postgres", "0017_registry_sink_health", was "registry_0003_sink_health"),
    migration!("postgres", "0020_registry_cdc_slots"),
    migration!("postgres", "0021_registry_vacuums"),
];

impl PgStore {
    /// [`StoreOps::schema_migrate`](crate::ops::StoreOps::schema_migrate).
    pub(super) async fn migrate_schema(
        &self,
        schema: &SchemaName,
        registry: bool,
    ) -> Result<Vec<String>> {
        let mut tx = self.pool.begin().await?;
        let mut applied = Self::migrate_in(&mut tx, schema, registry).await?;
        let index = self.retry_index_lock(schema).await?;
        tx.commit().await?;
        if let Some(conn) = index
            && Self::build_retry_index(conn, schema).await?
        {
            applied.push(RETRY_INDEX.to_owned());
        }
        // A sequence relays cannot rely on is refused here already, not first by a relay.
        let check = render(
            include_str!("../../../sql/postgres/queries/id_sequence.sql"),
            schema,
        );
        sqlx::query(safe(&check))
            .execute(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, schema))?;
        Ok(applied)
    }

    pub(super) async fn migrate_in(
        conn: &mut sqlx::PgConnection,
        schema: &SchemaName,
        registry: bool,
    ) -> Result<Vec<String>> {
        sqlx::query(include_str!(
            "../../../sql/postgres/queries/migrate_lock.sql"
        ))
        .bind(schema.as_str())
        .bind(pg_locks::MIGRATE)
        .execute(&mut *conn)
        .await?;
        sqlx::query(include_str!(
            "../../../sql/postgres/queries/migrate_quiet.sql"
        ))
        .execute(&mut *conn)
        .await?;
        let create = render(
            include_str!("../../../sql/postgres/queries/create_schema.sql"),
            schema,
        );
        sqlx::raw_sql(safe(&create)).execute(&mut *conn).await?;
        let mut wanted: Vec<Migration> = OUTBOX_MIGRATIONS
            .iter()
            .chain(if registry { REGISTRY_MIGRATIONS } else { &[] })
            .copied()
            .collect();
        // In the order of their numbers, which both lists share.
        wanted.sort_by_key(|m| m.name);
        let history = migrations::History {
            create: render(
                include_str!("../../../sql/postgres/queries/history_create.sql"),
                schema,
            )
            .to_string(),
            read: render(
                include_str!("../../../sql/postgres/queries/history_read.sql"),
                schema,
            )
            .to_string(),
            record: render(
                include_str!("../../../sql/postgres/queries/history_record.sql"),
                schema,
            )
            .to_string(),
            rename: render(
                include_str!("../../../sql/postgres/queries/history_rename.sql"),
                schema,
            )
            .to_string(),
        };
        let mut applied =
            migrations::apply::<sqlx::Postgres>(conn, &history, &wanted, |template| {
                render(template, schema).to_string()
            })
            .await?;
        applied.extend(functions::install(conn, schema).await?);
        Ok(applied)
    }

    /// Takes the right to build `schema`'s retry index (migration `0008_claim.sql`) on a
    /// connection of its own; `None` when another session has it. Taken before the migrations'
    /// transaction commits, so that of several migrations at once the one that applied them
    /// builds the index too.
    pub(super) async fn retry_index_lock(
        &self,
        schema: &SchemaName,
    ) -> Result<Option<PgConnection>> {
        let mut conn = PgConnection::connect_with(&self.pool.connect_options()).await?;
        let ours: bool = sqlx::query_scalar(include_str!(
            "../../../sql/postgres/queries/retry_index_lock.sql"
        ))
        .bind(schema.as_str())
        .bind(pg_locks::RETRY_INDEX)
        .fetch_one(&mut conn)
        .await?;
        if ours {
            Ok(Some(conn))
        } else {
            conn.close().await.ok();
            Ok(None)
        }
    }

    /// Builds `schema`'s retry index on `conn` (which holds [`PgStore::retry_index_lock`]) if it
    /// is missing, without blocking writes: `CREATE INDEX CONCURRENTLY`, outside a transaction.
    /// A build that did not finish (an invalid index) is dropped and done again. Returns whether
    /// it built the index now.
    pub(super) async fn build_retry_index(
        mut conn: PgConnection,
        schema: &SchemaName,
    ) -> Result<bool> {
        let state: Option<bool> = sqlx::query_scalar(include_str!(
            "../../../sql/postgres/queries/retry_index_state.sql"
        ))
        .bind(schema.as_str())
        .fetch_optional(&mut conn)
        .await?;
        if state == Some(true) {
            conn.close().await.ok();
            return Ok(false);
        }
        let not_built = |e: sqlx::Error| Error::IndexNotBuilt {
            schema: schema.to_string(),
            index: RETRY_INDEX,
            reason: e.to_string(),
        };
        // A concurrent build waits for every transaction that could still see the table
        // without the index: a snapshot held open for long holds it back.
        sqlx::query(include_str!(
            "../../../sql/postgres/queries/retry_index_wait.sql"
        ))
        .execute(&mut conn)
        .await?;
        if state == Some(false) {
            let drop = render(
                include_str!("../../../sql/postgres/queries/retry_index_drop.sql"),
                schema,
            );
            sqlx::raw_sql(safe(&drop))
                .execute(&mut conn)
                .await
                .map_err(not_built)?;
        }
        let build = render(
            include_str!("../../../sql/postgres/queries/retry_index.sql"),
            schema,
        );
        sqlx::raw_sql(safe(&build))
            .execute(&mut conn)
            .await
            .map_err(not_built)?;
        conn.close().await.ok();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_listed_once_under_a_number_of_its_own() {
        let mut all = [OUTBOX_MIGRATIONS, REGISTRY_MIGRATIONS].concat();
        all.sort_by_key(|m| m.name);
        migrations::assert_listed("postgres", &all);
    }
}
