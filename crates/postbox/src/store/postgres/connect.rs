//! Opening a PostgreSQL store from [`ConnectOptions`]: one connection alone first, then the pool.

use super::PgStore;
use crate::connect::ConnectOptions;
use crate::error::{Error, Result};
use crate::schema::SchemaName;
use crate::store::server::probe;

/// Prepared statements each connection keeps (sqlx's default: 100). Postbox's statements name
/// their schema, so a relay serving a hundred tenants prepares a few hundred of them; with the
/// default cache each claim in a tenant's schema prepared its statements again (a round trip
/// each). A few kilobytes of server memory each, per connection.
pub(crate) const STATEMENT_CACHE: usize = 1024;

impl PgStore {
    /// The store [`ConnectOptions::connect`] opens for a `postgres://` or `postgresql://` URL:
    /// its default schema `public` unless the options name one, a pool of 10 connections unless
    /// they say otherwise.
    pub(crate) async fn from_options(o: &ConnectOptions) -> Result<Self> {
        let options: sqlx::postgres::PgConnectOptions =
            o.url.trim().parse().map_err(|e: sqlx::Error| {
                Error::invalid_config(
                    "database_url",
                    format!(
                        "{:?} is not a valid PostgreSQL URL: {e}",
                        crate::redact::redact(&o.url)
                    ),
                )
            })?;
        let options = options.statement_cache_capacity(STATEMENT_CACHE);
        probe::<sqlx::postgres::PgConnection>(&options).await?;
        let mut pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(o.max_connections.unwrap_or(10));
        if let Some(timeout) = o.acquire_timeout {
            pool = pool.acquire_timeout(timeout);
        }
        let pool = pool.connect_with(options).await?;
        let schema = o.schema.clone().unwrap_or_else(SchemaName::public);
        Ok(PgStore::with_schema(pool, schema))
    }
}
