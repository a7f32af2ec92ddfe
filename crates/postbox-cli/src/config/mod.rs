//! Configuration: built-in defaults, then `postbox.toml`, then `POSTBOX_*` environment
//! variables, then command-line flags, each layer overriding the one before (figment).
//!
//! Every key is documented in [`keys::KEYS`], which feeds `--help` and is checked against
//! `CONFIG.md` and [`Config::default`] by tests.

mod keys;
mod values;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider, Source};
use serde::{Deserialize, Serialize};

pub(crate) use keys::{KEYS, keys_help};
pub(crate) use values::{ByteSize, DatabaseUrl, LogFormat};

use crate::database::Location;

/// The configuration file read from the working directory when `--config` is not given.
pub(crate) const DEFAULT_FILE: &str = "postbox.toml";

/// The prefix of configuration environment variables (`POSTBOX_BATCH_SIZE`, …).
pub(crate) const ENV_PREFIX: &str = "POSTBOX_";

/// Metadata name of the built-in defaults layer.
const DEFAULTS_SOURCE: &str = "built-in default";

/// Metadata name of the command-line flags layer.
const FLAGS_SOURCE: &str = "command-line flag";

/// The effective configuration. Field docs: see [`KEYS`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// Where the outbox lives; `None` for the SQLite file `postbox.db`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) database_url: Option<DatabaseUrl>,
    /// PostgreSQL schema of the default outbox and tenant registry.
    pub(crate) schema: String,
    /// Events claimed per batch.
    pub(crate) batch_size: u32,
    /// Idle polling interval.
    #[serde(with = "humantime_serde")]
    pub(crate) poll_interval: Duration,
    /// Claim lease.
    #[serde(with = "humantime_serde")]
    pub(crate) lease: Duration,
    /// Retry limit of enqueued events.
    pub(crate) max_retries: u32,
    /// Backoff unit.
    #[serde(with = "humantime_serde")]
    pub(crate) backoff_base: Duration,
    /// Longest backoff.
    #[serde(with = "humantime_serde")]
    pub(crate) backoff_cap: Duration,
    /// Timeout of one publish.
    #[serde(with = "humantime_serde")]
    pub(crate) publish_timeout: Duration,
    /// Events published at once.
    pub(crate) concurrency: usize,
    /// Log format.
    pub(crate) log_format: LogFormat,
    /// Log filter.
    pub(crate) log_level: String,
    /// Largest payload enqueued.
    pub(crate) payload_limit: ByteSize,
}

impl Default for Config {
    fn default() -> Self {
        let relay = postbox::RelayConfig::default();
        Config {
            database_url: None,
            schema: "public".to_owned(),
            batch_size: relay.batch_size,
            poll_interval: relay.poll_interval,
            lease: relay.lease,
            max_retries: 5,
            backoff_base: relay.retry.base,
            backoff_cap: relay.retry.cap,
            publish_timeout: relay.publish_timeout,
            concurrency: relay.concurrency,
            log_format: LogFormat::Text,
            log_level: "info".to_owned(),
            payload_limit: ByteSize(postbox::DEFAULT_PAYLOAD_LIMIT),
        }
    }
}

impl Config {
    /// The settings of the relay.
    pub(crate) fn relay_config(&self) -> postbox::RelayConfig {
        postbox::RelayConfig {
            batch_size: self.batch_size,
            poll_interval: self.poll_interval,
            lease: self.lease,
            retry: postbox::RetryPolicy {
                base: self.backoff_base,
                cap: self.backoff_cap,
            },
            publish_timeout: self.publish_timeout,
            concurrency: self.concurrency,
            ..postbox::RelayConfig::default()
        }
    }

    /// The validated default schema.
    pub(crate) fn schema_name(&self) -> anyhow::Result<postbox::SchemaName> {
        postbox::SchemaName::new(&self.schema).context("invalid configuration key `schema`")
    }

    /// Where the database is.
    pub(crate) fn location(&self) -> anyhow::Result<Location> {
        Location::parse(self.database_url.as_ref())
            .context("invalid configuration key `database_url`")
    }
}

/// Values given on the command line; `None` leaves the key to the lower layers.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Overrides {
    /// `--database-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) database_url: Option<String>,
    /// `--schema`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) schema: Option<String>,
    /// `--batch-size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) batch_size: Option<u32>,
    /// `--poll-interval`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) poll_interval: Option<Duration>,
    /// `--lease`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) lease: Option<Duration>,
    /// `--backoff-base`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) backoff_base: Option<Duration>,
    /// `--backoff-cap`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) backoff_cap: Option<Duration>,
    /// `--publish-timeout`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) publish_timeout: Option<Duration>,
    /// `--concurrency`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<usize>,
    /// `--log-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_format: Option<LogFormat>,
    /// `--log-level`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_level: Option<String>,
}

impl Provider for Overrides {
    fn metadata(&self) -> Metadata {
        Metadata::named(FLAGS_SOURCE).interpolater(|_: &Profile, keys: &[&str]| {
            format!("--{}", keys.join(".").replace('_', "-"))
        })
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Serialized::defaults(self).data()
    }
}

/// The built-in defaults as a figment layer.
struct Defaults(Config);

impl Provider for Defaults {
    fn metadata(&self) -> Metadata {
        Metadata::named(DEFAULTS_SOURCE)
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        Serialized::defaults(&self.0).data()
    }
}

/// A loaded configuration and the layers it came from.
#[derive(Debug)]
pub(crate) struct Loaded {
    /// The effective values.
    pub(crate) config: Config,
    figment: Figment,
}

impl Loaded {
    /// Where the value of `key` came from: `--flag`, `POSTBOX_KEY`, a file path, or
    /// `built-in default`.
    pub(crate) fn source_of(&self, key: &str) -> String {
        let Some(md) = self.figment.find_metadata(key) else {
            return DEFAULTS_SOURCE.to_owned();
        };
        if md.name == FLAGS_SOURCE {
            format!("--{}", key.replace('_', "-"))
        } else if md.name.contains("environment") {
            format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
        } else if let Some(Source::File(path)) = &md.source {
            path.display().to_string()
        } else {
            md.name.to_string()
        }
    }
}

/// Loads the configuration: `defaults`, then the file (`explicit_file`, which must exist, or
/// `postbox.toml` in the working directory if there is one), then `POSTBOX_*` variables, then
/// `overrides`. Every error names the key and where its value came from.
pub(crate) fn load(
    defaults: Config,
    explicit_file: Option<&Path>,
    overrides: &Overrides,
) -> anyhow::Result<Loaded> {
    let file: Option<PathBuf> = match explicit_file {
        Some(path) if !path.is_file() => {
            bail!("configuration file {} does not exist", path.display())
        }
        Some(path) => Some(path.to_owned()),
        None => Some(PathBuf::from(DEFAULT_FILE)).filter(|p| p.is_file()),
    };
    let keys: Vec<&str> = KEYS.iter().map(|k| k.key).collect();
    let mut figment = Figment::from(Defaults(defaults));
    if let Some(file) = &file {
        figment = figment.merge(Toml::file_exact(file));
    }
    let figment = figment
        .merge(Env::prefixed(ENV_PREFIX).only(&keys))
        .merge(overrides.clone());
    let config: Config = figment.extract().map_err(|e| {
        let all: Vec<String> = e.into_iter().map(|e| describe(&e)).collect();
        anyhow!("invalid configuration {}", all.join("; "))
    })?;
    let loaded = Loaded { config, figment };
    validate(&loaded)?;
    Ok(loaded)
}

/// One figment error as "key `k` (set by SOURCE): what is wrong", SOURCE being the flag, the
/// variable or the file.
fn describe(e: &figment::Error) -> String {
    let key = e.path.join(".");
    let source = match &e.metadata {
        Some(md) if md.name == FLAGS_SOURCE => format!("--{}", key.replace('_', "-")),
        Some(md) if md.name.contains("environment") => {
            format!("{ENV_PREFIX}{}", key.to_ascii_uppercase())
        }
        Some(md) => match &md.source {
            Some(Source::File(path)) => path.display().to_string(),
            _ => md.name.to_string(),
        },
        None => "an unknown source".to_owned(),
    };
    if key.is_empty() {
        format!("in {source}: {}", e.kind)
    } else {
        format!("key `{key}` (set by {source}): {}", e.kind)
    }
}

/// Range and consistency checks the types cannot express; errors name the key and its source.
fn validate(loaded: &Loaded) -> anyhow::Result<()> {
    let c = &loaded.config;
    let bad = |key: &str, msg: String| -> anyhow::Result<()> {
        Err(anyhow!(
            "invalid configuration key `{key}` (set by {}): {msg}",
            loaded.source_of(key)
        ))
    };
    if c.batch_size == 0 || c.batch_size > 10_000 {
        return bad(
            "batch_size",
            format!("{} is out of range; use 1 to 10000", c.batch_size),
        );
    }
    if c.poll_interval.is_zero() {
        return bad("poll_interval", "must be above zero".into());
    }
    if c.lease < Duration::from_millis(100) {
        return bad(
            "lease",
            format!("{} is too short; use at least 100ms", show(c.lease)),
        );
    }
    if c.publish_timeout.is_zero() || c.publish_timeout >= c.lease {
        return bad(
            "publish_timeout",
            format!(
                "{} must be above zero and shorter than lease ({}, set by {}), or a slow publish \
                 would outlive its claim; lower publish_timeout (--publish-timeout, \
                 POSTBOX_PUBLISH_TIMEOUT) or raise lease",
                show(c.publish_timeout),
                show(c.lease),
                loaded.source_of("lease")
            ),
        );
    }
    if c.concurrency == 0 {
        return bad("concurrency", "must be at least 1".into());
    }
    if c.backoff_base.is_zero() {
        return bad("backoff_base", "must be above zero".into());
    }
    if c.backoff_cap < c.backoff_base {
        return bad(
            "backoff_cap",
            format!(
                "{} is below backoff_base ({})",
                show(c.backoff_cap),
                show(c.backoff_base)
            ),
        );
    }
    if i32::try_from(c.max_retries).is_err() {
        return bad("max_retries", format!("{} is too large", c.max_retries));
    }
    if c.payload_limit.0 == 0 {
        return bad("payload_limit", "must be above zero".into());
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&c.log_level) {
        return bad(
            "log_level",
            format!("{:?} is not a log filter: {e}", c.log_level),
        );
    }
    if let Err(e) = postbox::SchemaName::new(&c.schema) {
        return bad("schema", e.to_string());
    }
    if let Err(e) = Location::parse(c.database_url.as_ref()) {
        return bad("database_url", format!("{e:#}"));
    }
    c.relay_config()
        .validate()
        .context("invalid relay configuration")?;
    Ok(())
}

/// A duration as configuration writes it (`1s`, `500ms`).
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
#[allow(
    clippy::result_large_err,
    reason = "figment::Jail's closures must return figment::Error"
)]
mod tests {
    use super::*;
    use figment::Jail;

    fn load_in_jail(overrides: &Overrides) -> Result<Config, figment::Error> {
        load(Config::default(), None, overrides)
            .map(|l| l.config)
            .map_err(|e| figment::Error::from(format!("{e:#}")))
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let c = load_in_jail(&Overrides::default())?;
            assert_eq!(c, Config::default());
            assert_eq!(c.batch_size, 100);
            assert_eq!(c.poll_interval, Duration::from_secs(5));
            assert_eq!(c.lease, Duration::from_secs(30));
            assert_eq!(c.max_retries, 5);
            assert_eq!(c.backoff_base, Duration::from_secs(1));
            assert_eq!(c.backoff_cap, Duration::from_secs(300));
            assert_eq!(c.publish_timeout, Duration::from_secs(10));
            assert_eq!(c.concurrency, 64);
            assert_eq!(c.payload_limit, ByteSize(1024 * 1024));
            assert_eq!(c.database_url, None);
            // The documented defaults parse to the same values.
            let mut toml = String::new();
            for k in KEYS.iter().filter(|k| k.key != "database_url") {
                toml.push_str(&format!("{} = {}\n", k.key, k.default));
            }
            jail.create_file("postbox.toml", &toml)?;
            assert_eq!(load_in_jail(&Overrides::default())?, Config::default());
            Ok(())
        });
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "postbox.toml",
                "batch_size = 10\nlease = \"40s\"\nschema = \"from_file\"\nconcurrency = 3\n",
            )?;
            jail.set_env("POSTBOX_BATCH_SIZE", 20);
            jail.set_env("POSTBOX_SCHEMA", "from_env");
            let flags = Overrides {
                batch_size: Some(30),
                ..Overrides::default()
            };
            let loaded = load(Config::default(), None, &flags)
                .map_err(|e| figment::Error::from(e.to_string()))?;
            let c = &loaded.config;
            assert_eq!(c.batch_size, 30, "flag wins");
            assert_eq!(c.schema, "from_env", "env beats file");
            assert_eq!(c.lease, Duration::from_secs(40), "file beats default");
            assert_eq!(c.concurrency, 3);
            assert_eq!(c.poll_interval, Duration::from_secs(5), "default");
            assert_eq!(loaded.source_of("batch_size"), "--batch-size");
            assert_eq!(loaded.source_of("schema"), "POSTBOX_SCHEMA");
            assert!(loaded.source_of("lease").ends_with("postbox.toml"));
            assert_eq!(loaded.source_of("poll_interval"), DEFAULTS_SOURCE);

            let no_flag = load_in_jail(&Overrides::default())?;
            assert_eq!(no_flag.batch_size, 20, "env beats file");
            Ok(())
        });
    }

    #[test]
    fn an_explicit_file_replaces_the_working_directory_one() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("postbox.toml", "batch_size = 10\n")?;
            jail.create_file("other.toml", "batch_size = 11\n")?;
            let c = load(
                Config::default(),
                Some(Path::new("other.toml")),
                &Overrides::default(),
            )
            .map_err(|e| figment::Error::from(e.to_string()))?
            .config;
            assert_eq!(c.batch_size, 11);
            let err = load(
                Config::default(),
                Some(Path::new("missing.toml")),
                &Overrides::default(),
            )
            .expect_err("a missing explicit file is an error");
            assert!(err.to_string().contains("missing.toml"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("POSTBOX_BATCH_SIZE", "0", "batch_size"),
            ("POSTBOX_BATCH_SIZE", "lots", "BATCH_SIZE"),
            ("POSTBOX_LEASE", "soon", "LEASE"),
            ("POSTBOX_LEASE", "50ms", "lease"),
            ("POSTBOX_PUBLISH_TIMEOUT", "1m", "publish_timeout"),
            ("POSTBOX_SCHEMA", "bad;name", "schema"),
            ("POSTBOX_LOG_FORMAT", "xml", "LOG_FORMAT"),
            ("POSTBOX_LOG_LEVEL", "info,[", "log_level"),
            ("POSTBOX_PAYLOAD_LIMIT", "1 parsec", "PAYLOAD_LIMIT"),
            ("POSTBOX_DATABASE_URL", "mysql://x/y", "database_url"),
            ("POSTBOX_BACKOFF_CAP", "1ms", "backoff_cap"),
        ];
        for (var, value, key) in cases {
            Jail::expect_with(|jail| {
                jail.clear_env();
                jail.set_env(var, value);
                let err = load(Config::default(), None, &Overrides::default())
                    .expect_err(var)
                    .to_string();
                assert!(err.contains(key), "{var}={value}: {err}");
                Ok(())
            });
        }
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("postbox.toml", "batch_sise = 10\n")?;
            let err = load(Config::default(), None, &Overrides::default())
                .expect_err("typo")
                .to_string();
            assert!(err.contains("batch_sise"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn unrelated_postbox_variables_are_ignored() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("POSTBOX_TEST_DATABASE_URL", "postgres://elsewhere/x");
            jail.set_env("POSTBOX_CONFIG", "x.toml");
            assert_eq!(load_in_jail(&Overrides::default())?, Config::default());
            Ok(())
        });
    }
}
