//! Value types of the configuration: log format, URLs and secrets (redacted when shown) and
//! sizes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where the relay learns of committed events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RelaySource {
    /// Claims found by polling the outbox table (every store).
    #[default]
    Poll,
    /// Inserts read from a PostgreSQL logical replication slot, polling as the safety net.
    Cdc,
}

/// Log output format on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A URL that may hold a password (a database or broker URL). Its `Debug` and `Display` hide
/// the password, so it can be logged.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct SecretUrl(String);

/// The database URL.
pub(crate) type DatabaseUrl = SecretUrl;

impl SecretUrl {
    /// The URL with its password; for connecting only, never for logs.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> Self {
        SecretUrl(url.to_owned())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

/// A secret (the webhook signing key). It never serializes, and its `Debug` shows `***`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub(crate) struct Secret(String);

impl Secret {
    /// The secret itself; for signing only, never for logs.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// `url` with its secrets hidden (see [`postbox::redact::redact`]).
pub(crate) fn redact_url(url: &str) -> String {
    postbox::redact::redact(url)
}

/// A size in bytes, written as a number of bytes or with a unit (`"1MiB"`, `"64 KiB"`,
/// `"500KB"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteSize(pub(crate) usize);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, unit) = s.split_at(split);
        let n: usize = digits.parse().map_err(|_| {
            format!("{s:?} is not a size (examples: 1048576, \"512KiB\", \"1MiB\")")
        })?;
        let factor: usize = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1000,
            "kib" => 1024,
            "mb" => 1000 * 1000,
            "mib" => 1024 * 1024,
            other => {
                return Err(format!(
                    "unknown unit {other:?} in {s:?}; use B, KB, KiB, MB or MiB"
                ));
            }
        };
        n.checked_mul(factor)
            .map(ByteSize)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0 as u64)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A size as written: bytes, or text with a unit.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(n) => usize::try_from(n)
                .map(ByteSize)
                .map_err(|_| serde::de::Error::custom("size too large")),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A list of names: a TOML array, or one string of comma-separated names (as an environment
/// variable gives it: `POSTBOX_ORDERED_AGGREGATE_TYPES=Invoice,Order`).
pub(crate) fn list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        One(String),
        Many(Vec<String>),
    }
    Ok(match List::deserialize(deserializer)? {
        List::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        List::Many(v) => v,
    })
}

/// A list of URLs, as [`list`] reads names (a TOML array, or comma-separated in a variable).
pub(crate) fn url_list<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<SecretUrl>, D::Error> {
    Ok(list(deserializer)?
        .iter()
        .map(|u| SecretUrl::from(u.as_str()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!("1MiB".parse(), Ok(ByteSize(1024 * 1024)));
        assert_eq!("64 KiB".parse(), Ok(ByteSize(64 * 1024)));
        assert_eq!("500KB".parse(), Ok(ByteSize(500_000)));
        assert_eq!("42".parse(), Ok(ByteSize(42)));
        assert!("1 GiB".parse::<ByteSize>().is_err());
        assert!("MiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redact_url("postgresql://app@db/app?password=s3cret&sslmode=require"),
            "postgresql://app@db/app?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://db/app?user=x&password=p@ss:word"),
            "postgres://db/app?user=x&password=***"
        );
        assert_eq!(redact_url("sqlite://postbox.db"), "sqlite://postbox.db");
        let url = DatabaseUrl::from("postgres://u:pw@h/d");
        assert!(!format!("{url} {url:?}").contains("pw"));
        let url = SecretUrl::from("amqp://guest:pw@127.0.0.1:5672/%2f");
        assert_eq!(url.to_string(), "amqp://guest:***@127.0.0.1:5672/%2f");
        let secret: Secret = serde_json::from_str("\"s3cr3t\"").expect("secret");
        assert_eq!(format!("{secret:?}"), "\"***\"");
        assert_eq!(secret.expose(), "s3cr3t");
    }
}
