//! What a CDC relay checks and creates before it reads: the server's settings, the role's
//! right to replicate, and the publication of the outbox table's inserts.

use postbox::SchemaName;
use sqlx::PgPool;
use tracing::{info, warn};

use crate::config::CdcConfig;
use crate::error::{Error, Result};

/// Fails with the fix when the server or the role cannot replicate; creates the publication,
/// or adds the outbox table to it, when missing.
pub(crate) async fn prepare(pool: &PgPool, schema: &SchemaName, cfg: &CdcConfig) -> Result<()> {
    let (wal_level, role, may, column_lists): (String, String, Option<bool>, bool) =
        sqlx::query_as(include_str!("../sql/server_check.sql"))
            .fetch_one(pool)
            .await?;
    if wal_level != "logical" {
        return Err(Error::WalLevel { found: wal_level });
    }
    if may != Some(true) {
        return Err(Error::NoReplication { role });
    }
    let (exists, holds): (bool, bool) =
        sqlx::query_as(include_str!("../sql/publication_tables.sql"))
            .bind(&cfg.publication)
            .bind(schema.as_str())
            .fetch_one(pool)
            .await?;
    if holds {
        if column_lists {
            let columns: Option<Vec<String>> =
                sqlx::query_scalar(include_str!("../sql/publication_columns.sql"))
                    .bind(&cfg.publication)
                    .bind(schema.as_str())
                    .fetch_optional(pool)
                    .await?;
            if columns.is_some_and(|c| c != ["id"]) {
                info!(publication = %cfg.publication, schema = %schema.as_str(),
                    "the publication sends every column of the outbox table (made by an earlier \
                     Postbox, or by hand); the relay reads only id: `ALTER PUBLICATION … SET \
                     TABLE <schema>.outbox_events (id)` makes the server's decoding cheaper \
                     (docs/cdc.md)");
            }
        }
        return Ok(());
    }
    let template = if exists {
        include_str!("../sql/publication_add.sql")
    } else {
        include_str!("../sql/publication_create.sql")
    };
    // The publication's name is checked by `CdcConfig::validate` (lower-case letters, digits
    // and `_`), and quoted; the schema's by `SchemaName`.
    let sql = template
        .replace("{publication}", &format!("\"{}\"", cfg.publication))
        .replace(
            "{tables}",
            &format!("{}.outbox_events{}", schema.quoted(), columns(column_lists)),
        );
    match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(pool).await {
        Ok(_) => Ok(()),
        // Another relay created it meanwhile.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42710") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Records the slot in the schema's `postbox_cdc_slots`, where polling relays look for a CDC
/// relay reading (`PgStore::leave_to_cdc_relay`). Without it they poll beside this relay and may
/// publish what it reads a second time: said in a warning, not fatal.
pub(crate) async fn record_slot(pool: &PgPool, schema: &SchemaName, slot: &str) {
    // The schema's name is validated by `SchemaName`, and quoted.
    let sql = include_str!("../sql/slot_record.sql").replace("{schema}", &schema.quoted());
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(slot)
        .execute(pool)
        .await
    {
        warn!(slot, error = %e,
            "cannot record the CDC slot in postbox_cdc_slots (run `postbox migrate`): polling \
             relays beside this one will not leave it the events, and may publish some twice");
    }
}

/// The column list an outbox table is published with: only `id` where publications take column
/// lists (PostgreSQL 15+), every column before.
pub(crate) fn columns(column_lists: bool) -> &'static str {
    if column_lists { " (id)" } else { "" }
}

/// Whether another connection reads `slot` now (`sql/slot_held.sql`): a relay starting beside
/// it is a standby, and a standby waits until it is let go.
pub(crate) async fn slot_held(pool: &PgPool, slot: &str) -> std::result::Result<bool, sqlx::Error> {
    sqlx::query_scalar(include_str!("../sql/slot_held.sql"))
        .bind(slot)
        .fetch_one(pool)
        .await
}
