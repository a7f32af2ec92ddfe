//! The configurations of the kinds of sink that need no feature and no broker: stdout and null.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{ConfigError, SinkSettings};
use crate::open::Shared;
use crate::{Result, RoutableSink, Template};

/// A sink of the stdout kind: one JSON line per event on the process's stdout.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StdoutConfig {}

/// A sink of the null kind: discards every event (they are still marked `PROCESSED`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NullConfig {}

#[async_trait]
impl SinkSettings for StdoutConfig {
    const DESTINATION_KEY: Option<&'static str> = None;

    fn address(&self) -> String {
        String::new()
    }

    fn destination(&self) -> Option<&Template> {
        None
    }

    fn check_destination(&self, _: &Template) -> std::result::Result<(), ConfigError> {
        Err(ConfigError::new(
            "topic",
            "the stdout sink takes no topic; leave `topic` out",
        ))
    }

    fn publish_timeout(&self) -> Option<Duration> {
        None
    }

    async fn connect(&self, shared: &Shared) -> Result<Arc<dyn RoutableSink>> {
        Ok(shared.stdout()?)
    }
}

#[async_trait]
impl SinkSettings for NullConfig {
    const DESTINATION_KEY: Option<&'static str> = None;

    fn address(&self) -> String {
        String::new()
    }

    fn destination(&self) -> Option<&Template> {
        None
    }

    fn check_destination(&self, _: &Template) -> std::result::Result<(), ConfigError> {
        Err(ConfigError::new(
            "topic",
            "the null sink takes no topic; leave `topic` out",
        ))
    }

    fn publish_timeout(&self) -> Option<Duration> {
        None
    }

    async fn connect(&self, _: &Shared) -> Result<Arc<dyn RoutableSink>> {
        Ok(Arc::new(crate::stdout::NullSink))
    }
}
