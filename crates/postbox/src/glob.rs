//! Glob patterns over event and aggregate types: routes of `postbox-sinks` match with them, and
//! event filters (list, replay) select with them, in SQL.

use std::fmt;
use std::str::FromStr;

/// A pattern over a whole name: `*` matches any run of characters (none included), `?` exactly
/// one; everything else matches itself, case-sensitively. `Invoice*` matches `Invoice` and
/// `InvoiceCreated`, `*Created` matches `InvoiceCreated`, `Order?` matches `Order1`.
///
/// The characters `[`, `]`, `{`, `}` and `\` are refused: they mean character classes,
/// alternatives or escapes in other glob dialects, and a pattern that silently meant something
/// else would route events to the wrong place.
///
/// ```
/// use postbox::glob::Glob;
///
/// let glob: Glob = "Invoice*".parse().unwrap();
/// assert!(glob.matches("InvoiceCreated"));
/// assert!(!glob.matches("OrderPlaced"));
/// assert!("Invoice[0-9]".parse::<Glob>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
    pattern: Vec<char>,
}

/// Why a glob was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GlobError {
    /// The pattern is empty.
    #[error("the pattern is empty; write \"*\" to match every name")]
    Empty,
    /// The pattern uses a character only other glob dialects know.
    #[error(
        "pattern {pattern:?} has {found:?}, which is not supported: only `*` (any run of \
         characters) and `?` (one character) are wildcards"
    )]
    Unsupported {
        /// The pattern as written.
        pattern: String,
        /// The refused character.
        found: char,
    },
}

impl Glob {
    /// Parses `pattern`.
    pub fn parse(pattern: &str) -> Result<Glob, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        if let Some(found) = pattern
            .chars()
            .find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(GlobError::Unsupported {
                pattern: pattern.to_owned(),
                found,
            });
        }
        Ok(Glob {
            source: pattern.to_owned(),
            pattern: pattern.chars().collect(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The pattern for SQL `LIKE … ESCAPE '\\'` (PostgreSQL): `*` is `%`, `?` is `_`, and a
    /// literal `%` or `_` is escaped. Case-sensitive, as [`matches`](Self::matches).
    pub fn to_like(&self) -> String {
        let mut like = String::with_capacity(self.source.len() + 4);
        for c in &self.pattern {
            match c {
                '*' => like.push('%'),
                '?' => like.push('_'),
                '%' | '_' => {
                    like.push('\\');
                    like.push(*c);
                }
                c => like.push(*c),
            }
        }
        like
    }

    /// The pattern for SQLite's `GLOB` operator: the same text, since the characters that would
    /// mean more to `GLOB` (`[`, `]`) are refused. Case-sensitive, as [`matches`](Self::matches).
    pub fn to_sqlite_glob(&self) -> &str {
        &self.source
    }

    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        // Iterative wildcard matching: on a mismatch, backtrack to the last `*` and let it
        // swallow one more character. Linear in practice, never exponential.
        let name: Vec<char> = name.chars().collect();
        let (mut p, mut n) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while n < name.len() {
            match self.pattern.get(p) {
                Some('*') => {
                    star = Some((p, n));
                    p += 1;
                }
                Some('?') => {
                    p += 1;
                    n += 1;
                }
                Some(&c) if c == name[n] => {
                    p += 1;
                    n += 1;
                }
                _ => match star {
                    Some((star_p, star_n)) => {
                        p = star_p + 1;
                        n = star_n + 1;
                        star = Some((star_p, star_n + 1));
                    }
                    None => return false,
                },
            }
        }
        self.pattern[p..].iter().all(|&c| c == '*')
    }
}

impl FromStr for Glob {
    type Err = GlobError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Glob::parse(s)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Glob({:?})", self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Glob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Glob::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Glob {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn m(pattern: &str, name: &str) -> bool {
        Glob::parse(pattern).unwrap().matches(name)
    }

    #[test]
    fn stars_and_question_marks() {
        assert!(m("*", "InvoiceCreated"));
        assert!(m("*", ""));
        assert!(m("Invoice*", "Invoice"));
        assert!(m("Invoice*", "InvoiceCreated"));
        assert!(!m("Invoice*", "invoiceCreated"), "case-sensitive");
        assert!(!m("Invoice*", "MyInvoiceCreated"), "anchored at the start");
        assert!(m("*Created", "InvoiceCreated"));
        assert!(!m("*Created", "InvoiceCreatedLate"), "anchored at the end");
        assert!(m("*voice*", "InvoiceCreated"));
        assert!(m("Order?", "Order1"));
        assert!(!m("Order?", "Order"));
        assert!(!m("Order?", "Order12"));
        assert!(m("a*b*c", "aXXbYYbZc"));
        assert!(!m("a*b*c", "aXXbYYbZ"));
        assert!(m("**a", "bbba"));
        assert!(m("Invoice", "Invoice"));
        assert!(!m("Invoice", "Invoices"));
        assert!(m("Ré*", "Réglé"), "characters, not bytes");
        assert!(m("?", "é"));
    }

    #[test]
    fn no_exponential_backtracking() {
        let pattern = "a*".repeat(30) + "b";
        let name = "a".repeat(5000);
        let started = std::time::Instant::now();
        assert!(!m(&pattern, &name));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn other_dialects_and_empty_patterns_are_refused() {
        assert_eq!(Glob::parse("").unwrap_err(), GlobError::Empty);
        for bad in ["Invoice[0-9]", "{a,b}", "a\\*", "x]"] {
            let err = Glob::parse(bad).unwrap_err();
            assert!(matches!(err, GlobError::Unsupported { .. }), "{bad}");
            assert!(err.to_string().contains("only `*`"), "{err}");
        }
    }

    #[test]
    fn like_patterns_escape_what_like_would_read() {
        assert_eq!(Glob::parse("Invoice*").unwrap().to_like(), "Invoice%");
        assert_eq!(Glob::parse("Order?").unwrap().to_like(), "Order_");
        assert_eq!(Glob::parse("100%_off*").unwrap().to_like(), "100\\%\\_off%");
    }

    #[test]
    fn deserializes_from_a_string() {
        let g: Glob = serde_json::from_str("\"Inv*\"").unwrap();
        assert_eq!(g.as_str(), "Inv*");
        let err = serde_json::from_str::<Glob>("\"[x]\"").unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
    }
}
