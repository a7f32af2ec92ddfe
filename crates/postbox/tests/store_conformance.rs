//! The store conformance suite (`postbox_testkit::store_suite`), run against both stores, each
//! case on a database of its own.

#[cfg(feature = "postgres")]
postbox_testkit::store_conformance!(postgres, postbox_testkit::store_suite::PgHarness);

#[cfg(feature = "sqlite")]
postbox_testkit::store_conformance!(sqlite, postbox_testkit::store_suite::SqliteHarness);
