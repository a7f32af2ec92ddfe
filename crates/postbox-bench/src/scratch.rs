//! A scratch database of the benchmark's own, removed afterwards.

use postbox::SqliteStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};

use crate::BenchError;
use crate::db::Db;

/// Where the benchmark runs.
pub(crate) enum Scratch {
    Postgres {
        admin: Box<PgConnectOptions>,
        /// The URL given, for connections made outside sqlx (the CDC relay's).
        url: String,
        name: String,
    },
    Sqlite {
        dir: tempfile::TempDir,
    },
    MySql {
        admin: Box<sqlx::mysql::MySqlConnectOptions>,
        name: String,
    },
}

impl Scratch {
    /// Creates a fresh database next to `url` (PostgreSQL) or a temporary SQLite file.
    pub(crate) async fn create(url: Option<&str>) -> Result<Scratch, BenchError> {
        match url {
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                let admin: PgConnectOptions = u.parse().map_err(BenchError::db)?;
                let name = format!(
                    "postbox_bench_{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..12]
                );
                let mut conn = admin.connect().await.map_err(BenchError::db)?;
                // The name is generated above from hex digits only.
                sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                    .execute(&mut conn)
                    .await
                    .map_err(BenchError::db)?;
                conn.close().await.ok();
                Ok(Scratch::Postgres {
                    admin: Box::new(admin),
                    url: u.to_owned(),
                    name,
                })
            }
            Some(u) if u.starts_with("mysql://") || u.starts_with("mariadb://") => {
                let u = u.replacen("mariadb://", "mysql://", 1);
                let admin: sqlx::mysql::MySqlConnectOptions = u.parse().map_err(BenchError::db)?;
                let name = format!(
                    "postbox_bench_{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..12]
                );
                let mut conn = admin.connect().await.map_err(BenchError::db)?;
                // The name is generated above from hex digits only.
                sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                    .execute(&mut conn)
                    .await
                    .map_err(BenchError::db)?;
                conn.close().await.ok();
                Ok(Scratch::MySql {
                    admin: Box::new(admin),
                    name,
                })
            }
            _ => Ok(Scratch::Sqlite {
                dir: tempfile::tempdir().map_err(|e| BenchError::Setup(e.to_string()))?,
            }),
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Scratch::Postgres { .. })
    }

    /// A URL of the scratch database (PostgreSQL), for a connection the pools do not make (the
    /// CDC relay's replication connection).
    pub(crate) fn url(&self) -> Option<String> {
        match self {
            Scratch::Postgres { url, name, .. } => {
                let mut url = url::Url::parse(url).ok()?;
                url.set_path(name);
                Some(url.to_string())
            }
            _ => None,
        }
    }

    /// The run's own replication slot name (PostgreSQL): slot names are the server's, not the
    /// database's, so a fixed one would collide with another run or a relay on the same server.
    pub(crate) fn slot_name(&self) -> Option<String> {
        match self {
            Scratch::Postgres { name, .. } => Some(name.clone()),
            _ => None,
        }
    }

    /// The backend's name in the report.
    pub(crate) fn backend(&self) -> &'static str {
        match self {
            Scratch::Postgres { .. } => "postgres",
            Scratch::Sqlite { .. } => "sqlite",
            Scratch::MySql { .. } => "mysql",
        }
    }

    /// A pool with `connections` connections on the scratch database whose sessions are named
    /// `application` (PostgreSQL; elsewhere as [`Scratch::open`]), to be counted on the server.
    pub(crate) async fn open_named(
        &self,
        connections: u32,
        application: &str,
    ) -> Result<Db, BenchError> {
        match self {
            Scratch::Postgres { admin, name, .. } => Ok(Db::Pg(
                PgPoolOptions::new()
                    .max_connections(connections)
                    .connect_with(
                        admin
                            .clone()
                            .database(name)
                            .application_name(application)
                            // As `postbox::connect` opens a relay's pool.
                            .statement_cache_capacity(1024),
                    )
                    .await
                    .map_err(BenchError::db)?,
            )),
            _ => self.open(connections).await,
        }
    }

    /// A pool with `connections` connections on the scratch database, migrated.
    pub(crate) async fn open(&self, connections: u32) -> Result<Db, BenchError> {
        let db = match self {
            Scratch::Postgres { admin, name, .. } => Db::Pg(
                PgPoolOptions::new()
                    .max_connections(connections)
                    .connect_with(admin.clone().database(name))
                    .await
                    .map_err(BenchError::db)?,
            ),
            Scratch::Sqlite { dir } => Db::Sqlite(
                SqliteStore::open(dir.path().join("bench.db"))
                    .await?
                    .pool()
                    .clone(),
            ),
            Scratch::MySql { admin, name } => {
                let store = postbox::MySqlStore::connect_with(
                    (**admin).clone().database(name),
                    connections,
                )
                .await?;
                Db::MySql(
                    store.pool().clone(),
                    std::sync::Arc::new(postbox::AnyStore::MySql(store)),
                )
            }
        };
        postbox::migrate(&*db.store()).await?;
        Ok(db)
    }

    /// Empties the outbox between phases, so each starts from the same table state.
    pub(crate) async fn reset(&self) -> Result<(), BenchError> {
        match self {
            Scratch::Postgres { admin, name, .. } => {
                let mut conn = admin
                    .clone()
                    .database(name)
                    .connect()
                    .await
                    .map_err(BenchError::db)?;
                // One statement each: VACUUM cannot run inside the implicit transaction of a
                // multi-statement string.
                for sql in [
                    "TRUNCATE public.outbox_events",
                    "DROP TABLE IF EXISTS public.bench_business",
                    "VACUUM ANALYZE public.outbox_events",
                ] {
                    sqlx::raw_sql(sql)
                        .execute(&mut conn)
                        .await
                        .map_err(BenchError::db)?;
                }
                conn.close().await.ok();
            }
            Scratch::Sqlite { dir } => {
                let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.path().join("bench.db"))
                    .connect()
                    .await
                    .map_err(BenchError::db)?;
                sqlx::raw_sql("DELETE FROM outbox_events; DROP TABLE IF EXISTS bench_business;")
                    .execute(&mut conn)
                    .await
                    .map_err(BenchError::db)?;
                conn.close().await.ok();
            }
            Scratch::MySql { admin, name } => {
                let mut conn = admin
                    .clone()
                    .database(name)
                    .connect()
                    .await
                    .map_err(BenchError::db)?;
                for sql in [
                    "TRUNCATE TABLE outbox_events",
                    "DROP TABLE IF EXISTS bench_business",
                    "ANALYZE TABLE outbox_events",
                ] {
                    sqlx::raw_sql(sql)
                        .execute(&mut conn)
                        .await
                        .map_err(BenchError::db)?;
                }
                conn.close().await.ok();
            }
        }
        Ok(())
    }

    /// Drops the scratch database.
    pub(crate) async fn drop_now(self) {
        match self {
            Scratch::Postgres { admin, name, .. } => {
                if let Ok(mut conn) = admin.connect().await {
                    // A slot of the run's (the CDC comparison's, left by a failed run) would
                    // keep the database from being dropped and WAL on the server for ever.
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE database = $1 AND active_pid IS NOT NULL",
                    )
                    .bind(&name)
                    .execute(&mut conn)
                    .await;
                    let _ = sqlx::query(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE database = $1",
                    )
                    .bind(&name)
                    .execute(&mut conn)
                    .await;
                    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            }
            Scratch::MySql { admin, name } => {
                if let Ok(mut conn) = admin.connect().await {
                    let _ =
                        sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS `{name}`")))
                            .execute(&mut conn)
                            .await;
                }
            }
            Scratch::Sqlite { .. } => {}
        }
    }
}
