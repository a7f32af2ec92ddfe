//! The event filters of `events list` and `replay`, from the command line to the library's
//! [`EventFilter`], refused with a message naming the flag before anything is read.

use chrono::Utc;
use clap::Args;
use postbox::Target;
use postbox::store::{EventFilter, FilterText};

use crate::database::Database;

/// The filter the flags describe, and the target they name.
pub(crate) async fn resolve(
    db: &Database,
    args: &FilterArgs,
) -> anyhow::Result<(Target, EventFilter)> {
    let filter = parse(args)?;
    let target = db.target(args.tenant.as_deref()).await?;
    Ok((target, filter))
}

/// Parses the flags, without the database; an error names the flag.
pub(crate) fn parse(args: &FilterArgs) -> anyhow::Result<EventFilter> {
    let mut text = FilterText::default();
    text.statuses = args.status.iter().map(String::as_str).collect();
    text.event_type = args.event_type.as_deref();
    text.aggregate_type = args.aggregate_type.as_deref();
    text.aggregate_id = args.aggregate_id.as_deref();
    text.since = args.since.as_deref();
    text.until = args.until.as_deref();
    text.archive = args.archive;
    EventFilter::parse(&text, Utc::now()).map_err(|e| match e {
        postbox::Error::InvalidFilter { field, reason } => {
            let flag = match field {
                "status" => "--status",
                "type" => "--type",
                "aggregate_type" => "--aggregate-type",
                "aggregate_id" => "--aggregate-id",
                "since" => "--since",
                "until" => "--until",
                "since/until" => "--since/--until",
                other => other,
            };
            anyhow::anyhow!("{flag}: {reason}")
        }
        e => anyhow::Error::new(e),
    })
}

/// Which events: the filters shared by `events list` and `replay`.
#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only events with this status (repeat for several): pending, processing, processed,
    /// failed
    #[arg(long, value_name = "STATUS")]
    pub(crate) status: Vec<String>,

    /// Event types matching this glob (`*` any run, `?` one character), e.g. 'Invoice*'
    #[arg(long = "type", value_name = "GLOB")]
    pub(crate) event_type: Option<String>,

    /// Aggregate types matching this glob
    #[arg(long, value_name = "GLOB")]
    pub(crate) aggregate_type: Option<String>,

    /// This aggregate id exactly
    #[arg(long, value_name = "ID")]
    pub(crate) aggregate_id: Option<String>,

    /// Created at or after this time: RFC 3339 (2026-11-30T12:00:00Z), a date (2026-11-30,
    /// UTC) or an age (2h, 7d: that long ago)
    #[arg(long, value_name = "TIME")]
    pub(crate) since: Option<String>,

    /// Created before this time (same forms as --since)
    #[arg(long, value_name = "TIME")]
    pub(crate) until: Option<String>,

    /// Read outbox_events_archive too
    #[arg(long)]
    pub(crate) archive: bool,

    /// The tenant whose events to read (`default`: the default schema) [default: the default schema]
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use chrono::DateTime;
    use postbox::store::EventStatus;

    fn args() -> FilterArgs {
        FilterArgs {
            status: Vec::new(),
            event_type: None,
            aggregate_type: None,
            aggregate_id: None,
            since: None,
            until: None,
            archive: false,
            tenant: None,
        }
    }

    fn time(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
        postbox::store::parse_time(text, now).map_err(|e| e.to_string())
    }

    #[test]
    fn times_are_rfc3339_dates_or_ages() {
        let now = "2026-11-30T12:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(
            time("2026-11-29T10:00:00+02:00", now).unwrap().to_rfc3339(),
            "2026-11-29T08:00:00+00:00"
        );
        assert_eq!(
            time("2026-11-01", now).unwrap().to_rfc3339(),
            "2026-11-01T00:00:00+00:00"
        );
        assert_eq!(
            time("2h", now).unwrap().to_rfc3339(),
            "2026-11-30T10:00:00+00:00"
        );
        let err = time("yesterday", now).unwrap_err();
        assert!(err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn bad_filters_name_their_flag() {
        let mut a = args();
        a.status = vec!["done".into()];
        let err = format!("{:#}", parse(&a).unwrap_err());
        assert!(
            err.starts_with("--status") && err.contains("PENDING"),
            "{err}"
        );
        let mut a = args();
        a.event_type = Some("Invoice[0-9]".into());
        let err = format!("{:#}", parse(&a).unwrap_err());
        assert!(
            err.starts_with("--type") && err.contains("only `*`"),
            "{err}"
        );
        let mut a = args();
        a.since = Some("1d".into());
        a.until = Some("2d".into());
        let err = format!("{:#}", parse(&a).unwrap_err());
        assert!(err.contains("swap"), "{err}");
        let mut a = args();
        a.status = vec!["failed".into(), "FAILED".into(), "processed".into()];
        assert_eq!(
            parse(&a).unwrap().statuses,
            [EventStatus::Failed, EventStatus::Processed]
        );
    }
}
