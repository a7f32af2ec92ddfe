//! Validated schema and tenant names, and the one place where an identifier is quoted into SQL.

use std::fmt;
use std::sync::Arc;

use crate::error::Error;

type Result<T, E = Error> = std::result::Result<T, E>;

/// Longest identifier PostgreSQL keeps without truncating it (NAMEDATALEN - 1).
const MAX_IDENT_BYTES: usize = 63;

/// Checks a name against Postbox's identifier rules: 1 to `max` bytes of lower-case ASCII
/// letters, digits and `_`, starting with a letter or `_`.
/// The name of the default schema's outbox wherever a tenant is named: `--tenant default`, the
/// admin API's `tenant=default`, the `tenant` label of metrics and logs. No tenant can be
/// registered under it.
pub const DEFAULT_TENANT: &str = "default";

fn check_ident(kind: &'static str, name: &str, max: usize) -> Result<()> {
    let refuse = |reason| {
        Err(Error::InvalidName {
            kind,
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > max {
        return refuse("it is too long (PostgreSQL keeps at most 63 bytes of a schema name)");
    }
    let first = name.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first == b'_') {
        return refuse("it must start with a lower-case letter or '_'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return refuse("only lower-case ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

/// A PostgreSQL schema name that passed validation.
///
/// The only way into SQL for a schema name is [`SchemaName::quoted`]; every statement that names
/// a table is rendered through it.
///
/// ```
/// use postbox::SchemaName;
/// let s = SchemaName::new("s_acme").unwrap();
/// assert_eq!(s.quoted(), "\"s_acme\"");
/// assert!(SchemaName::new("acme; DROP TABLE x").is_err());
/// assert!(SchemaName::new("pg_catalog").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SchemaName(Arc<str>);

impl SchemaName {
    /// Validates `name`: lower-case ASCII letters, digits and `_`, at most 63 bytes, not a
    /// system schema (`pg_*`, `information_schema`).
    pub fn new(name: &str) -> Result<Self> {
        check_ident("schema", name, MAX_IDENT_BYTES)?;
        if name.starts_with("pg_") || name == "information_schema" {
            return Err(Error::InvalidName {
                kind: "schema",
                name: name.to_owned(),
                reason: "names starting with 'pg_' and 'information_schema' are PostgreSQL's own",
            });
        }
        Ok(SchemaName(Arc::from(name)))
    }

    /// The default schema, `public`.
    pub fn public() -> Self {
        SchemaName(Arc::from("public"))
    }

    /// The name, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a quoted SQL identifier. This is the single place where a schema name becomes
    /// SQL text.
    pub fn quoted(&self) -> String {
        // Validation already refused '"', but quoting stays correct even if the rules change.
        format!("\"{}\"", self.0.replace('"', "\"\""))
    }
}

impl fmt::Debug for SchemaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SchemaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant id that passed validation: lower-case ASCII letters, digits and `_`, 1 to 61 bytes
/// (so that its default schema `s_<tenant>` fits PostgreSQL's 63-byte limit).
///
/// ```
/// use postbox::schema::TenantId;
/// let t = TenantId::new("acme").unwrap();
/// assert_eq!(t.default_schema().as_str(), "s_acme");
/// assert!(TenantId::new("Acme Corp").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Arc<str>);

impl TenantId {
    /// Validates a tenant id.
    pub fn new(id: &str) -> Result<Self> {
        check_ident("tenant", id, MAX_IDENT_BYTES - 2)?;
        Ok(TenantId(Arc::from(id)))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The schema a tenant gets when none is given: `s_<tenant>`.
    pub fn default_schema(&self) -> SchemaName {
        SchemaName(Arc::from(format!("s_{}", self.0)))
    }
}

/// Names parse (`"s_acme".parse()`, clap's value parsers) and deserialize (from configuration)
/// through the same validation as [`SchemaName::new`] and [`TenantId::new`].
macro_rules! name_traits {
    ($name:ident) => {
        impl std::str::FromStr for $name {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self> {
                $name::new(s)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::new(&s).map_err(serde::de::Error::custom)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }
    };
}

name_traits!(SchemaName);
name_traits!(TenantId);

impl serde::Serialize for TenantId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl serde::Serialize for SchemaName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a batch of events lives: the default schema (no tenant) or one tenant's schema.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// The tenant, or `None` for the default schema.
    pub tenant: Option<TenantId>,
    /// The schema holding this target's `outbox_events` table.
    pub schema: SchemaName,
}

impl Target {
    /// The default schema's target (no tenant).
    pub fn default_schema(schema: SchemaName) -> Self {
        Target {
            tenant: None,
            schema,
        }
    }

    /// The tenant name for logs and messages: the tenant id, or `default`.
    pub fn label(&self) -> &str {
        self.tenant
            .as_ref()
            .map_or(DEFAULT_TENANT, TenantId::as_str)
    }
}

/// A tenant's registry entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Tenant {
    /// The tenant id.
    pub id: TenantId,
    /// The tenant's schema.
    pub schema: SchemaName,
    /// Whether the relay serves it.
    pub status: TenantStatus,
    /// When it was added.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl Tenant {
    /// The tenant as a relay target.
    pub fn target(&self) -> Target {
        Target {
            tenant: Some(self.id.clone()),
            schema: self.schema.clone(),
        }
    }
}

/// A tenant's status in the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum TenantStatus {
    /// Served by the relay.
    Active,
    /// Not served: its events wait until it is resumed.
    Suspended,
}

impl TenantStatus {
    /// The status as the registry stores it: `ACTIVE` or `SUSPENDED`.
    pub fn as_str(self) -> &'static str {
        match self {
            TenantStatus::Active => "ACTIVE",
            TenantStatus::Suspended => "SUSPENDED",
        }
    }
}

impl std::fmt::Display for TenantStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_schema_names_are_refused() {
        for bad in [
            "",
            "a\"b",
            "x; drop table outbox_events",
            "with space",
            "pg_temp",
            "pg_catalog",
            "information_schema",
            "Upper",
            "1abc",
            "dash-ed",
            "é",
            &"a".repeat(64),
        ] {
            let err = SchemaName::new(bad).expect_err(bad);
            assert!(err.to_string().contains("invalid schema name"), "{err}");
        }
        assert!(SchemaName::new(&"a".repeat(63)).is_ok());
        assert!(SchemaName::new("_private1").is_ok());
    }

    #[test]
    fn tenant_ids_fit_their_default_schema() {
        let t = TenantId::new(&"t".repeat(61)).expect("61 bytes");
        assert_eq!(t.default_schema().as_str().len(), 63);
        assert!(TenantId::new(&"t".repeat(62)).is_err());
        assert!(TenantId::new("acme;").is_err());
    }

    #[test]
    fn names_parse_and_deserialize_through_validation() {
        let s: SchemaName = "s_acme".parse().expect("valid");
        assert_eq!(s, "s_acme");
        assert!("Acme".parse::<TenantId>().is_err());
        let t: TenantId = serde_json::from_str("\"acme\"").expect("valid");
        assert_eq!(&*t, "acme");
        let err = serde_json::from_str::<SchemaName>("\"pg_x\"").expect_err("refused");
        assert!(err.to_string().contains("pg_"), "{err}");
    }

    #[test]
    fn quoting_doubles_quotes() {
        let s = SchemaName(Arc::from("a\"b"));
        assert_eq!(s.quoted(), "\"a\"\"b\"");
    }
}
