//! SQL text: statements live in `.sql` files under `sql/`, with `{schema}` standing for the
//! schema. [`render`] is the one function of the library that puts a schema name into SQL (every
//! PostgreSQL statement, and the tables of the list statement), always through
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

/// The highest parameter number (`$N`) in a PostgreSQL statement, 0 when it has none.
///
/// Written by hand because only the placeholders are wanted: a full SQL parser would refuse much
/// of PostgreSQL's syntax and weigh far more. It skips what can hold a `$` that is not a
/// parameter — string literals (`'…'`, `E'…'`), quoted identifiers, comments (nested block
/// comments too), dollar-quoted strings and identifiers such as `a$1` — and errs, if ever, on
/// the side of a higher number.
pub(crate) fn max_placeholder(sql: &str) -> usize {
    let b = sql.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
    // Where the delimiter `end` next appears at or after `from`, or the end of the text.
    let find = |from: usize, end: &[u8]| -> usize {
        b.get(from..)
            .and_then(|rest| rest.windows(end.len()).position(|w| w == end))
            .map_or(b.len(), |at| from + at)
    };
    let mut max = 0;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev = i.checked_sub(1).map(|p| b[p]);
        match c {
            b'\'' => {
                // An E'…' string takes backslash escapes; any string ends at a lone quote.
                let escapes = matches!(prev, Some(b'e' | b'E'))
                    && !i.checked_sub(2).is_some_and(|p| ident(b[p]));
                i += 1;
                while i < b.len() {
                    match b[i] {
                        b'\\' if escapes => i += 2,
                        b'\'' if b.get(i + 1) == Some(&b'\'') => i += 2,
                        b'\'' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'"' => {
                i += 1;
                while i < b.len() {
                    match b[i] {
                        b'"' if b.get(i + 1) == Some(&b'"') => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => i = find(i, b"\n"),
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0_usize;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'$' if prev.is_some_and(ident) => i += 1,
            b'$' => {
                let digits = b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
                if digits > 0 {
                    let n = &sql[i + 1..i + 1 + digits];
                    max = max.max(n.parse().unwrap_or(usize::MAX));
                    i += 1 + digits;
                    continue;
                }
                // A dollar quote: `$tag$` (tag empty or an identifier) up to the same again.
                let tag_len = b[i + 1..]
                    .iter()
                    .take_while(|&&t| ident(t) && t != b'$')
                    .count();
                if b.get(i + 1 + tag_len) == Some(&b'$') {
                    let tag = &b[i..i + tag_len + 2];
                    let body = i + tag.len();
                    i = find(body, tag).saturating_add(tag.len());
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::max_placeholder;

    #[test]
    fn placeholders_are_counted_outside_literals_comments_and_identifiers() {
        for (sql, max) in [
            ("INSERT INTO t (a) VALUES ('x')", 0),
            ("INSERT INTO t (a, b) VALUES ($1, $2)", 2),
            ("UPDATE t SET a = $10 WHERE id = $2", 10),
            ("INSERT INTO t (a) VALUES ('$9'), ($1)", 1),
            ("INSERT INTO t (a) VALUES ('it''s $9'), ($1)", 1),
            (r"INSERT INTO t (a) VALUES (E'it\'s $9'), ($1)", 1),
            (r#"INSERT INTO "we""ird$9" (a) VALUES ($1)"#, 1),
            ("INSERT INTO t (a) VALUES ($1) -- not $9\n", 1),
            ("INSERT INTO t (a) /* not /* $8 */ $9 */ VALUES ($1)", 1),
            (
                "INSERT INTO t (a) VALUES ($$ $9 $$), ($tag$ $8 $tag$), ($2)",
                2,
            ),
            ("INSERT INTO a$1 (b$2) VALUES ($1)", 1),
            ("UPDATE t SET a = $3::int", 3),
            ("DELETE FROM t WHERE a = 'unterminated $4", 0),
        ] {
            assert_eq!(max_placeholder(sql), max, "{sql}");
            // Cut anywhere (an unterminated literal, comment or quote), it still answers.
            for (cut, _) in sql.char_indices() {
                assert!(
                    max_placeholder(&sql[..cut]) <= max.max(9),
                    "{}",
                    &sql[..cut]
                );
            }
        }
    }
}
