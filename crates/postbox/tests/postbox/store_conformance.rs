//! The store conformance suite (`postbox_testkit::store_suite`), run against every store, each
//! case on a database of its own.

#[cfg(feature = "postgres")]
postbox_testkit::store_conformance!(postgres, postbox_testkit::store_suite::PgHarness);

#[cfg(feature = "sqlite")]
postbox_testkit::store_conformance!(sqlite, postbox_testkit::store_suite::SqliteHarness);

#[cfg(feature = "mysql")]
postbox_testkit::store_conformance!(mysql, postbox_testkit::store_suite::MySqlHarness);
