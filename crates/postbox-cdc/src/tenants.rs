//! Every tenant through the slot: the active tenants' outbox tables are kept in the
//! publication (added when a tenant is added or resumed, taken out when it is suspended), and
//! the relay serves each outbox the publication holds for it — the default schema's and those
//! tenants' — from the slot, keyed by schema ([`crate::progress::Sid`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use postbox::SchemaName;
use tracing::{debug, info, warn};

use crate::stream::Stream;

/// How often the registry is compared with the publication: a tenant added or resumed is
/// served by the slot within this (its events committed before are polled, as always).
pub(crate) const TENANT_CHECK: Duration = Duration::from_secs(2);

/// How many tables one `ALTER PUBLICATION` adds or drops.
const PER_STATEMENT: usize = 200;

#[derive(sqlx::FromRow)]
struct TenantOutbox {
    schema_name: String,
    active: bool,
    migrated: bool,
    published: bool,
}

/// Keeps the publication and the outboxes served in step with the tenant registry until the
/// relay stops.
pub(crate) async fn follow(s: Arc<Stream>) {
    // Whether publications take column lists, as the setup asked it (server_check.sql).
    let column_lists = sqlx::query_as::<_, (String, String, Option<bool>, bool)>(include_str!(
        "../sql/server_check.sql"
    ))
    .fetch_one(&s.pool)
    .await
    .is_ok_and(|(_, _, _, column_lists)| column_lists);
    let mut every = tokio::time::interval(TENANT_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Schemas whose table the publication refused, said once each.
    let mut refused: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            () = s.cancel.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = check(&s, column_lists, &mut refused).await {
            debug!(error = %e, "cannot compare the tenant registry with the CDC publication yet");
        }
    }
}

/// One comparison: adds active tenants' tables, drops suspended ones', and tells the reader
/// which outboxes it serves.
async fn check(
    s: &Stream,
    column_lists: bool,
    refused: &mut HashSet<String>,
) -> Result<(), sqlx::Error> {
    // The schema's name is validated by `SchemaName`, and quoted.
    let sql = include_str!("../sql/tenant_outboxes.sql").replace("{schema}", &s.schema.quoted());
    let tenants: Vec<TenantOutbox> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&s.config.publication)
        .fetch_all(&s.pool)
        .await?;
    // Registry rows name schemas checked by the registry; one that is not a valid schema name
    // is not served (the relay says so when it reads the registry).
    let named = |t: &TenantOutbox| SchemaName::new(&t.schema_name).ok();
    let add: Vec<SchemaName> = (tenants.iter())
        .filter(|t| t.active && t.migrated && !t.published && !refused.contains(&t.schema_name))
        .filter_map(named)
        .collect();
    let drop: Vec<SchemaName> = (tenants.iter())
        .filter(|t| !t.active && t.published)
        .filter_map(named)
        .collect();
    let columns = crate::setup::columns(column_lists);
    let added = alter(
        s,
        include_str!("../sql/publication_add.sql"),
        &add,
        columns,
        refused,
    )
    .await;
    alter(
        s,
        include_str!("../sql/publication_drop.sql"),
        &drop,
        "",
        refused,
    )
    .await;
    if !added.is_empty() {
        info!(publication = %s.config.publication, tenants = added.len(),
            "tenants' outboxes added to the CDC publication: the slot serves them from now on");
    }
    let mut served = vec![s.schema.as_str().to_owned()];
    served.extend(
        (tenants.iter())
            .filter(|t| t.active && t.published)
            .map(|t| t.schema_name.clone()),
    );
    served.extend(added.iter().map(|a| a.as_str().to_owned()));
    s.progress.serve(&served);
    Ok(())
}

/// Runs `template` (an `ALTER PUBLICATION`) for `schemas`' outbox tables, a few hundred per
/// statement; a statement that fails is tried table by table, and a table refused alone is
/// said once, in a warning. Returns the schemas whose table it took.
async fn alter(
    s: &Stream,
    template: &str,
    schemas: &[SchemaName],
    columns: &str,
    refused: &mut HashSet<String>,
) -> Vec<SchemaName> {
    let mut done = Vec::new();
    for chunk in schemas.chunks(PER_STATEMENT) {
        if run(s, template, chunk, columns).await.is_ok() {
            done.extend_from_slice(chunk);
            continue;
        }
        for schema in chunk {
            match run(s, template, std::slice::from_ref(schema), columns).await {
                Ok(()) => done.push(schema.clone()),
                // Another relay on the publication (a rolling deploy's other pod) changed it
                // first: already a member (42710), or no longer one (42704).
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("42710" | "42704")) =>
                {
                    done.push(schema.clone());
                }
                // The server is going away: tried again at the next check.
                Err(e) if crate::stream::server_lost(&e) => return done,
                Err(e) => {
                    if refused.insert(schema.as_str().to_owned()) {
                        warn!(schema = %schema, publication = %s.config.publication, error = %e,
                            "cannot change the CDC publication for this tenant's outbox (the \
                             relay's role must own the publication and the table): its events \
                             are polled, not read from the slot");
                    }
                }
            }
        }
    }
    done
}

async fn run(
    s: &Stream,
    template: &str,
    schemas: &[SchemaName],
    columns: &str,
) -> Result<(), sqlx::Error> {
    let tables: Vec<String> = schemas
        .iter()
        .map(|schema| format!("{}.outbox_events{columns}", schema.quoted()))
        .collect();
    // The publication's name is checked by `CdcConfig::validate` (lower-case letters, digits
    // and `_`), and quoted; the schemas' by `SchemaName`.
    let sql = template
        .replace("{publication}", &format!("\"{}\"", s.config.publication))
        .replace("{tables}", &tables.join(", "));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&s.pool)
        .await
        .map(|_| ())
}
