//! Migrating the default schema and every tenant.

use crate::error::{Error, Result};
use crate::store::Store;

/// Migrates the store's default schema (outbox and tenant registry) and then every registered
/// tenant's schema. Returns the names of the migrations applied, prefixed with their schema.
/// Safe to run repeatedly and from several processes at once.
///
/// ```no_run
/// # async fn example() -> postbox::Result<()> {
/// let store = postbox::connect("sqlite:postbox.db").await?;
/// for applied in postbox::migrate(&store).await? {
///     println!("applied {applied}");
/// }
/// # Ok(()) }
/// ```
pub async fn migrate(store: &dyn Store) -> Result<Vec<String>> {
    let default = store.default_schema();
    let mut applied: Vec<String> = store
        .schema_migrate(&default, true)
        .await?
        .into_iter()
        .map(|m| format!("{default}: {m}"))
        .collect();
    match store.tenant_list().await {
        Ok(tenants) => {
            for tenant in tenants {
                let done = store.schema_migrate(&tenant.schema, false).await?;
                applied.extend(done.into_iter().map(|m| format!("{}: {m}", tenant.schema)));
            }
        }
        Err(Error::Unsupported(_)) => {}
        Err(e) => return Err(e),
    }
    for rejected in store.tenant_rejected().await.unwrap_or_default() {
        tracing::warn!(tenant = %rejected.id, reason = %rejected.reason,
            "tenant registry row not migrated: it cannot be served (fix or remove the row)");
    }
    Ok(applied)
}
