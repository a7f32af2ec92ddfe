//! SQL text: statements live in `.sql` files under `sql/`, with `{schema}` standing for the
//! schema. [`render`] is the one function that puts a schema name into SQL, always through
//! [`SchemaName::quoted`].

use std::sync::Arc;

use sqlx::AssertSqlSafe;

use crate::schema::SchemaName;

/// Renders a statement template for `schema`.
pub(crate) fn render(template: &str, schema: &SchemaName) -> Arc<str> {
    Arc::from(template.replace("{schema}", &schema.quoted()))
}

/// Wraps rendered SQL for sqlx. Safe: the only dynamic part is a validated, quoted identifier.
pub(crate) fn safe(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

/// A cache of rendered statement sets, one per schema; statements are rendered once per schema
/// and shared, so the hot path neither formats nor allocates SQL text.
pub(crate) struct PerSchema<T> {
    sets: std::sync::RwLock<std::collections::HashMap<SchemaName, Arc<T>>>,
    build: fn(&SchemaName) -> T,
}

impl<T> PerSchema<T> {
    pub(crate) fn new(build: fn(&SchemaName) -> T) -> Self {
        PerSchema {
            sets: Default::default(),
            build,
        }
    }

    pub(crate) fn get(&self, schema: &SchemaName) -> Arc<T> {
        if let Some(set) = self
            .sets
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(schema)
        {
            return Arc::clone(set);
        }
        let set = Arc::new((self.build)(schema));
        self.sets
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(schema.clone(), Arc::clone(&set));
        set
    }
}
