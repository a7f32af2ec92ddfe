//! The event filters of `events list` and `replay`, from the command line to the library's
//! [`EventFilter`], refused with a message naming the flag before anything is read.

use anyhow::Context;
use chrono::{DateTime, Utc};
use postbox::Target;
use postbox::store::{EventFilter, EventStatus};

use crate::cli::FilterArgs;
use crate::database::Database;

/// The filter the flags describe, and the target they name.
pub(crate) async fn resolve(
    db: &Database,
    args: &FilterArgs,
) -> anyhow::Result<(Target, EventFilter)> {
    let filter = parse(args)?;
    let target = match args.tenant.as_deref() {
        None => db.default_target(),
        Some(tenant) => db.targets(Some(tenant)).await?.remove(0),
    };
    Ok((target, filter))
}

/// Parses the flags, without the database.
pub(crate) fn parse(args: &FilterArgs) -> anyhow::Result<EventFilter> {
    let mut filter = EventFilter::default();
    for status in &args.status {
        let status: EventStatus = status.parse().context("--status")?;
        if !filter.statuses.contains(&status) {
            filter.statuses.push(status);
        }
    }
    filter.event_type = args
        .event_type
        .as_deref()
        .map(str::parse)
        .transpose()
        .context("--type")?;
    filter.aggregate_type = args
        .aggregate_type
        .as_deref()
        .map(str::parse)
        .transpose()
        .context("--aggregate-type")?;
    filter.aggregate_id = args.aggregate_id.clone();
    let now = Utc::now();
    filter.since = args
        .since
        .as_deref()
        .map(|t| time(t, now))
        .transpose()
        .context("--since")?;
    filter.until = args
        .until
        .as_deref()
        .map(|t| time(t, now))
        .transpose()
        .context("--until")?;
    filter.archive = args.archive;
    filter.validate()?;
    Ok(filter)
}

/// A point in time: RFC 3339, a date (midnight UTC), or an age before `now`.
fn time(text: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    postbox::store::parse_time(text, now).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
        let err = time("yesterday", now).unwrap_err().to_string();
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
