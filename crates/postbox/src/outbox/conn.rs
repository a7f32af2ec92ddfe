//! The connections an [`Outbox`] and an [`Inbox`] write through, one per database, listed once
//! (`connections!` below): the sealed [`OutboxConnection`] trait, the [`Conn`] it hands out,
//! what each database keeps per outbox and per inbox, and the dispatch of each write to the
//! database's folder under `store/` (its `outbox.rs` and `inbox.rs`).

use super::{Checked, Outbox};
use crate::error::Result;
use crate::event::Enqueued;
use crate::inbox::Inbox;
use crate::schema::SchemaName;

/// A connection or transaction that [`Outbox::enqueue`] can write through: a PostgreSQL, SQLite
/// or MySQL connection, pooled connection or transaction. Sealed.
pub trait OutboxConnection: sealed::Sealed + Send {}

mod sealed {
    pub trait Sealed {
        fn outbox_connection(&mut self) -> super::Conn<'_>;
    }
}

/// Implements [`OutboxConnection`] for a database's connection, its transactions and its pooled
/// connections, each handing itself out as the [`Conn`] variant `$variant`.
macro_rules! outbox_connection {
    ($variant:ident, $db:ty, $conn:ty) => {
        impl sealed::Sealed for $conn {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(self)
            }
        }
        impl OutboxConnection for $conn {}
        impl sealed::Sealed for sqlx::Transaction<'_, $db> {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(&mut *self)
            }
        }
        impl OutboxConnection for sqlx::Transaction<'_, $db> {}
        impl sealed::Sealed for sqlx::pool::PoolConnection<$db> {
            fn outbox_connection(&mut self) -> Conn<'_> {
                Conn::$variant(&mut *self)
            }
        }
        impl OutboxConnection for sqlx::pool::PoolConnection<$db> {}
    };
}

/// Writes [`Conn`] and what goes through its variants, once for every database. Each line names
/// the variant, the sqlx database and connection type, the cargo feature that builds the
/// database, and its folder under `store/`. Every variant, field, impl and match arm written
/// here is compiled with that feature only: the databases' features are named in this one list,
/// and each database's code is gated once, at its folder. The folder provides, in `outbox.rs`,
/// `Prepared` (what an outbox keeps for it), `insert_one` and `insert_many`; in `inbox.rs`,
/// `Prepared` (what an inbox keeps) and `receive`.
macro_rules! connections {
    ($(
        $(#[$doc:meta])*
        $variant:ident($db:ty, $conn:ty) if feature $feature:literal in $module:ident;
    )*) => {
        /// A connection [`Outbox`] (and an [`Inbox`]) can write through.
        pub enum Conn<'a> {
            $(
                $(#[$doc])*
                #[cfg(feature = $feature)]
                $variant(&'a mut $conn),
            )*
        }

        $(
            #[cfg(feature = $feature)]
            outbox_connection!($variant, $db, $conn);
        )*

        /// What an [`Outbox`] keeps for each database, made once when it is built (PostgreSQL:
        /// its statements, rendered for the outbox's schema).
        pub(crate) struct Prepared {
            $(
                #[cfg(feature = $feature)]
                pub(crate) $module: crate::store::$module::outbox::Prepared,
            )*
        }

        impl Prepared {
            pub(super) fn new(schema: &SchemaName) -> Self {
                Prepared {
                    $(
                        #[cfg(feature = $feature)]
                        $module: crate::store::$module::outbox::Prepared::new(schema),
                    )*
                }
            }
        }

        /// What an [`Inbox`] keeps for each database, made once with it (PostgreSQL: its
        /// statement, rendered for the inbox's schema).
        #[derive(Clone, Debug)]
        pub(crate) struct InboxPrepared {
            $(
                #[cfg(feature = $feature)]
                pub(crate) $module: crate::store::$module::inbox::Prepared,
            )*
        }

        impl InboxPrepared {
            pub(crate) fn new(schema: &SchemaName) -> Self {
                InboxPrepared {
                    $(
                        #[cfg(feature = $feature)]
                        $module: crate::store::$module::inbox::Prepared::new(schema),
                    )*
                }
            }
        }

        impl Conn<'_> {
            /// Writes one checked event of `outbox`: its id, or `None` when its idempotency key
            /// exists already.
            pub(super) async fn insert_one(
                self,
                outbox: &Outbox,
                event: &Checked<'_>,
            ) -> Result<Option<i64>> {
                match self {
                    $(
                        #[cfg(feature = $feature)]
                        Conn::$variant(c) => {
                            let prepared = &outbox.prepared().$module;
                            crate::store::$module::outbox::insert_one(outbox, prepared, c, event).await
                        }
                    )*
                }
            }

            /// Writes many checked events of `outbox`; results in the order of `events`.
            pub(super) async fn insert_many(
                self,
                outbox: &Outbox,
                events: &[Checked<'_>],
            ) -> Result<Vec<Enqueued>> {
                match self {
                    $(
                        #[cfg(feature = $feature)]
                        Conn::$variant(c) => {
                            let prepared = &outbox.prepared().$module;
                            crate::store::$module::outbox::insert_many(outbox, prepared, c, events).await
                        }
                    )*
                }
            }

            /// Records that `inbox`'s consumer handles `message_id`: whether it is new.
            pub(crate) async fn receive(self, inbox: &Inbox, message_id: &str) -> Result<bool> {
                match self {
                    $(
                        #[cfg(feature = $feature)]
                        Conn::$variant(c) => {
                            let prepared = &inbox.prepared().$module;
                            crate::store::$module::inbox::receive(inbox, prepared, c, message_id).await
                        }
                    )*
                }
            }
        }
    };
}

connections! {
    /// PostgreSQL.
    Postgres(sqlx::Postgres, sqlx::postgres::PgConnection) if feature "postgres" in postgres;
    /// SQLite.
    Sqlite(sqlx::Sqlite, sqlx::sqlite::SqliteConnection) if feature "sqlite" in sqlite;
    /// MySQL or MariaDB.
    MySql(sqlx::MySql, sqlx::mysql::MySqlConnection) if feature "mysql" in mysql;
}
