//! A fresh SQLite file per test.

/// An SQLite database file of its own for one test, in a temporary directory removed afterwards.
pub struct TestSqlite {
    dir: tempfile::TempDir,
}

impl TestSqlite {
    /// A fresh temporary directory for the database file.
    pub fn new() -> TestSqlite {
        TestSqlite {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The database file's path.
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("postbox.db")
    }

    /// Opens the store.
    pub async fn store(&self) -> postbox::SqliteStore {
        postbox::SqliteStore::open(self.path())
            .await
            .expect("open sqlite")
    }
}

impl Default for TestSqlite {
    fn default() -> Self {
        Self::new()
    }
}
