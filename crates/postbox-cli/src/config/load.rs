//! Loading the configuration: the command-line layer ([`Overrides`]), the figment provider of
//! each layer, [`load`] merging them, and every error worded with the key and where its value
//! came from ([`Loaded::source_of`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile, Provider, Source};
use serde::Serialize;

use super::validate::validate;
use super::{
    Config, DEFAULT_FILE, DEFAULTS_SOURCE, ENV_PREFIX, FLAGS_SOURCE, KEYS, LogFormat, RAW_ENV_KEYS,
    RelaySource, SinkKind,
};

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
    /// `--admin-listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// `--source`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<RelaySource>,
    /// `--cdc-slot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cdc_slot: Option<String>,
    /// `--cdc-claim`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cdc_claim: Option<bool>,
    /// `--log-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_format: Option<LogFormat>,
    /// `--log-level`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_level: Option<String>,
    /// `--sink`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sink: Option<SinkKind>,
    /// `--sink-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sink_url: Option<String>,
    /// `--topic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) topic: Option<String>,
    /// `--exchange`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exchange: Option<String>,
    /// `--sink-format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sink_format: Option<String>,
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

/// The `POSTBOX_*` variables of some keys, as plain strings.
struct RawEnv(&'static [&'static str]);

impl Provider for RawEnv {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment variable(s)")
    }

    fn data(&self) -> figment::Result<Map<Profile, Dict>> {
        let mut dict = Dict::new();
        for key in self.0 {
            let var = format!("{ENV_PREFIX}{}", key.to_ascii_uppercase());
            if let Some(value) = std::env::var_os(&var) {
                let value = value
                    .into_string()
                    .map_err(|_| figment::Error::from(format!("{var} is not valid UTF-8")))?;
                dict.insert((*key).to_owned(), figment::value::Value::from(value));
            }
        }
        Ok(Map::from([(Profile::Default, dict)]))
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
    let keys: Vec<&str> = KEYS
        .iter()
        .map(|k| k.key)
        .filter(|k| !RAW_ENV_KEYS.contains(k))
        .collect();
    let mut figment = Figment::from(Defaults(defaults));
    if let Some(file) = &file {
        figment = figment.merge(Toml::file_exact(file));
    }
    let figment = figment
        .merge(Env::prefixed(ENV_PREFIX).only(&keys))
        .merge(RawEnv(RAW_ENV_KEYS))
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

#[cfg(test)]
#[allow(
    clippy::result_large_err,
    reason = "figment::Jail's closures must return figment::Error"
)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, Secret};
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
            // The documented defaults parse to the same values (those that are values: the
            // others are explained in parentheses).
            let mut toml = String::new();
            for k in KEYS.iter().filter(|k| !k.default.starts_with('(')) {
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
            ("POSTBOX_DATABASE_URL", "oracle://x/y", "database_url"),
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
    fn sink_variables_are_taken_as_written() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("POSTBOX_SINK", "webhook");
            jail.set_env("POSTBOX_SINK_URL", "https://h.example/{event_type}");
            jail.set_env("POSTBOX_WEBHOOK_SECRET", "0123");
            let c = load_in_jail(&Overrides::default())?;
            assert_eq!(c.sink, Some(SinkKind::Webhook));
            assert_eq!(
                c.webhook_secret.as_ref().map(Secret::expose),
                Some("0123"),
                "not parsed as the number 123"
            );
            jail.set_env("POSTBOX_SINK", "redis");
            jail.set_env("POSTBOX_SINK_URL", "redis://127.0.0.1:6379");
            jail.set_env("POSTBOX_WEBHOOK_SECRET", "");
            jail.set_env("POSTBOX_TOPIC", "{event_type}");
            let loaded = load(Config::default(), None, &Overrides::default())
                .expect("the keys themselves are valid");
            let err = crate::sinks::check(&loaded).expect_err("a secret for a redis sink");
            assert!(
                err.to_string().contains("webhook_secret")
                    && err.to_string().contains("POSTBOX_WEBHOOK_SECRET"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn sink_and_routes_exclude_each_other_unless_sink_is_a_flag() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "postbox.toml",
                "[sinks.out]\nkind = \"stdout\"\n[[routes]]\nsink = \"out\"\n",
            )?;
            let c = load_in_jail(&Overrides::default())?;
            assert_eq!(c.routes.len(), 1);
            jail.set_env("POSTBOX_SINK", "null");
            let err = load(Config::default(), None, &Overrides::default())
                .expect_err("both")
                .to_string();
            assert!(
                err.contains("`sink`") && err.contains("POSTBOX_SINK"),
                "{err}"
            );
            let flag = Overrides {
                sink: Some(SinkKind::Null),
                ..Overrides::default()
            };
            assert_eq!(load_in_jail(&flag)?.sink, Some(SinkKind::Null));
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
