//! A database of each store for the tests that run on every store, reached the way users reach
//! one (`postbox::connect(url)`), and producer connections to it driven by plain statements.

#![allow(clippy::unwrap_used, reason = "tests")]
#![allow(
    dead_code,
    reason = "the tests of each store feature use part of the helpers"
)]

use postbox::{Event, Outbox};

/// A fresh, migrated database of one store, kept for as long as the value lives.
pub(crate) struct TestStore {
    /// What `postbox::connect` takes.
    pub(crate) url: String,
    /// The store the test produces and reads through.
    pub(crate) store: postbox::AnyStore,
    /// The store's name in failure messages.
    pub(crate) name: &'static str,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

impl TestStore {
    async fn on(
        url: String,
        name: &'static str,
        keep: Box<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        let store = postbox::connect(&url).await.unwrap();
        postbox::migrate(&store).await.unwrap();
        TestStore {
            url,
            store,
            name,
            _keep: keep,
        }
    }

    /// PostgreSQL: a database of the test's own.
    #[cfg(feature = "postgres")]
    pub(crate) async fn postgres() -> Self {
        let test = postbox_testkit::TestDb::new().await;
        Self::on(test.url().to_owned(), "PostgreSQL", Box::new(test)).await
    }

    /// MySQL/MariaDB: a database of the test's own.
    #[cfg(feature = "mysql")]
    pub(crate) async fn mysql() -> Self {
        let test = postbox_testkit::TestMySql::new().await;
        Self::on(test.url().to_owned(), "MySQL/MariaDB", Box::new(test)).await
    }

    /// SQLite: a file of the test's own.
    #[cfg(feature = "sqlite")]
    pub(crate) async fn sqlite() -> Self {
        let test = postbox_testkit::TestSqlite::new();
        let url = test.path().to_str().unwrap().to_owned();
        Self::on(url, "SQLite", Box::new(test)).await
    }

    /// Another store on the same database, with connections of its own: what a relay in a
    /// process of its own has.
    pub(crate) async fn connect(&self) -> postbox::AnyStore {
        postbox::connect(&self.url).await.unwrap()
    }

    /// A connection of the test's store's pool.
    pub(crate) async fn conn(&self) -> Conn {
        Conn::of(&self.store).await
    }

    /// Commits `events` in one transaction of a producer connection; returns their ids.
    pub(crate) async fn commit(&self, events: Vec<Event>) -> Vec<i64> {
        let outbox = postbox::StoreExt::outbox(&self.store);
        let mut conn = self.conn().await;
        conn.exec("BEGIN").await;
        let mut ids = Vec::with_capacity(events.len());
        for event in events {
            ids.push(conn.enqueue(&outbox, event).await);
        }
        conn.exec("COMMIT").await;
        ids
    }
}

/// A pooled connection of any store, driven by plain statements.
pub(crate) enum Conn {
    #[cfg(feature = "postgres")]
    Pg(sqlx::pool::PoolConnection<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    My(sqlx::pool::PoolConnection<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Lite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
}

impl Conn {
    /// A connection of `store`'s pool.
    pub(crate) async fn of(store: &postbox::AnyStore) -> Conn {
        match store {
            #[cfg(feature = "postgres")]
            postbox::AnyStore::Postgres(s) => Conn::Pg(s.pool().acquire().await.unwrap()),
            #[cfg(feature = "mysql")]
            postbox::AnyStore::MySql(s) => Conn::My(s.pool().acquire().await.unwrap()),
            #[cfg(feature = "sqlite")]
            postbox::AnyStore::Sqlite(s) => Conn::Lite(s.pool().acquire().await.unwrap()),
            #[allow(unreachable_patterns, reason = "every store of this build is listed")]
            _ => unreachable!(),
        }
    }

    /// Runs `text` (plain SQL: `BEGIN`, `COMMIT`, …); panics naming it if it fails.
    pub(crate) async fn exec(&mut self, text: &str) {
        let sql = sqlx::AssertSqlSafe(text.to_owned());
        match self {
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
            #[cfg(feature = "mysql")]
            Conn::My(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
            #[cfg(feature = "sqlite")]
            Conn::Lite(c) => sqlx::raw_sql(sql).execute(&mut **c).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{text}: {e}"));
    }

    /// Enqueues `event` on this connection (in its transaction, if one is open); its id.
    pub(crate) async fn enqueue(&mut self, outbox: &Outbox, event: Event) -> i64 {
        let done = match self {
            #[cfg(feature = "postgres")]
            Conn::Pg(c) => outbox.enqueue(&mut **c, event).await,
            #[cfg(feature = "mysql")]
            Conn::My(c) => outbox.enqueue(&mut **c, event).await,
            #[cfg(feature = "sqlite")]
            Conn::Lite(c) => outbox.enqueue(&mut **c, event).await,
        };
        done.unwrap().id().unwrap()
    }
}
