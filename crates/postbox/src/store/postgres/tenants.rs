//! PostgreSQL tenants: the registry in the default schema, one outbox schema per tenant.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::migrate::OUTBOX_MIGRATIONS;
use super::sql::{render, safe};
use super::{PgStore, map_missing_table};
use crate::error::{Error, Result};
use crate::schema::{SchemaName, TenantId};
use crate::store::{RejectedTenant, Tenant, TenantAddParams, TenantStatus};

impl PgStore {
    /// [`StoreOps::tenant_add`](crate::ops::StoreOps::tenant_add).
    pub(super) async fn add_tenant(&self, p: &TenantAddParams<'_>) -> Result<Tenant> {
        if p.id.as_str() == crate::schema::DEFAULT_TENANT {
            return Err(Error::InvalidName {
                kind: "tenant",
                name: p.id.to_string(),
                reason: "it names the default schema's outbox (pick another id)",
            });
        }
        let schema = p.schema.cloned().unwrap_or_else(|| p.id.default_schema());
        if schema == self.default_schema {
            return Err(Error::TenantExists(p.id.to_string()));
        }
        let mut tx = self.pool.begin().await?;
        let sql = self.sql.get(&self.default_schema);
        let row = sqlx::query(safe(&sql.tenant_add))
            .bind(p.id.as_str())
            .bind(schema.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?
            .ok_or_else(|| Error::TenantExists(p.id.to_string()))?;
        let tenant = Self::tenant_from_row(&row)?;
        let applied = Self::migrate_in(&mut tx, &schema, false).await?;
        if applied.iter().any(|m| m == OUTBOX_MIGRATIONS[0].name) {
            // The table is new in this transaction and nothing else sees it: its retry index is
            // built here, at once, rather than concurrently after the commit on a connection of
            // its own (which waits for every transaction that could see the table: with tenants
            // added side by side, for each other).
            let index = render(
                include_str!("../../../sql/postgres/queries/retry_index_new.sql"),
                &schema,
            );
            sqlx::raw_sql(safe(&index)).execute(&mut *tx).await?;
            tx.commit().await?;
            return Ok(tenant);
        }
        let index = self.retry_index_lock(&schema).await?;
        tx.commit().await?;
        if let Some(conn) = index {
            Self::build_retry_index(conn, &schema).await?;
        }
        Ok(tenant)
    }

    /// [`StoreOps::tenant_list`](crate::ops::StoreOps::tenant_list).
    pub(super) async fn list_tenants(&self) -> Result<Vec<Tenant>> {
        Ok(self
            .tenant_rows()
            .await?
            .into_iter()
            .filter_map(std::result::Result::ok)
            .collect())
    }

    /// [`StoreOps::tenant_rejected`](crate::ops::StoreOps::tenant_rejected).
    pub(super) async fn rejected_tenants(&self) -> Result<Vec<RejectedTenant>> {
        Ok(self
            .tenant_rows()
            .await?
            .into_iter()
            .filter_map(std::result::Result::err)
            .collect())
    }

    /// [`StoreOps::tenant_set_status`](crate::ops::StoreOps::tenant_set_status).
    pub(super) async fn set_tenant_status(
        &self,
        id: &TenantId,
        status: TenantStatus,
    ) -> Result<Tenant> {
        let sql = self.sql.get(&self.default_schema);
        let row = sqlx::query(safe(&sql.tenant_set_status))
            .bind(id.as_str())
            .bind(status.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?
            .ok_or_else(|| Error::UnknownTenant(id.to_string()))?;
        Self::tenant_from_row(&row)
    }

    /// Every registry row: a tenant, or why it cannot be served (a row added by hand with a
    /// name Postbox refuses).
    async fn tenant_rows(&self) -> Result<Vec<std::result::Result<Tenant, RejectedTenant>>> {
        let sql = self.sql.get(&self.default_schema);
        let rows = sqlx::query(safe(&sql.tenant_list))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_missing_table(e, &self.default_schema))?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                let schema: String = row.try_get(1)?;
                Ok(Self::tenant_from_row(row).map_err(|e| RejectedTenant {
                    id,
                    schema,
                    reason: e.to_string(),
                }))
            })
            .collect()
    }

    fn tenant_from_row(row: &PgRow) -> Result<Tenant> {
        let id: String = row.try_get(0)?;
        let schema: String = row.try_get(1)?;
        let status: String = row.try_get(2)?;
        Ok(Tenant {
            id: TenantId::new(&id)?,
            schema: SchemaName::new(&schema)?,
            status: TenantStatus::from_sql(&status),
            created_at: row.try_get(3)?,
        })
    }
}

impl TenantStatus {
    /// The status as the registry stores it (anything but `ACTIVE` is suspended).
    fn from_sql(s: &str) -> Self {
        if s == "ACTIVE" {
            TenantStatus::Active
        } else {
            TenantStatus::Suspended
        }
    }
}
