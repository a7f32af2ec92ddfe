//! One chaos run, start to finish: set up, produce under faults, drain, check, clean up.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use postbox_testkit::proxy::Proxy;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::cli::{Args, Source};
use crate::faults::{self, Targets};
use crate::fleet::{self, Fleet, RelaySpec};
use crate::producers::{self, LEDGER_DDL, ProducerParams};
use crate::report::{Evidence, LedgerRow, OutboxRow, Report, Settings};
use crate::schedule::{FaultKind, Schedule, ScheduleParams};
use crate::stream::StreamReader;
use postbox_testkit::cluster::{self, Cluster};

/// Runs the kit; `Ok(true)` when every check passed.
pub(crate) async fn run(args: Args) -> anyhow::Result<bool> {
    if args.source == Source::Poll && args.faults.contains(&FaultKind::SlotDrop) {
        bail!("--faults slot-drop needs --source cdc: polling relays read no slot");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let duration = args.duration();
    let schedule = Schedule::generate(&ScheduleParams {
        seed,
        duration,
        relays: args.relays,
        kinds: args.fault_kinds(),
        gap: args.fault_gap,
        lease: args.lease,
        max_outage: args.max_outage,
        max_pg_downtime: args.max_pg_downtime,
        overlap: args.overlap,
    });
    // With --json, stdout carries the report alone.
    let say = |text: &str| {
        if args.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    };
    say(&format!(
        "postbox-chaos --seed {seed}: {} relays, {} events over {} min, schedule {} ({} faults):",
        args.relays,
        args.events,
        args.minutes,
        schedule.fingerprint(),
        schedule.faults.len()
    ));
    for fault in &schedule.faults {
        say(&format!("  {fault}"));
    }
    if args.schedule_only {
        return Ok(true);
    }
    if args.publish_timeout >= args.lease {
        bail!("--publish-timeout must be shorter than --lease");
    }
    let postbox_bin = postbox_binary(args.postbox_bin.as_deref())?;
    let pg_bin = match &args.pg_bin_dir {
        Some(dir) => dir.clone(),
        None => cluster::find_bin_dir()?,
    };

    // The run directory: PostgreSQL's data in pg/ (owned by its OS user, who must be able to
    // reach it), the relays' logs beside.
    let dir = tempfile::Builder::new()
        .prefix(&format!("postbox-chaos-{seed}-"))
        .tempdir()
        .context("create the run directory")?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    std::fs::create_dir_all(dir.path().join("logs"))?;
    info!(dir = %dir.path().display(), "run directory");

    let outcome = chaos(&args, seed, &schedule, postbox_bin, pg_bin, dir.path()).await;

    // By now the relays and PostgreSQL are stopped. A run that failed, or could not be carried
    // out, keeps the relay logs.
    if args.keep {
        let kept = dir.keep();
        eprintln!(
            "kept: run directory {} (PostgreSQL data in pg/data, relay logs in logs/)",
            kept.display()
        );
    } else if !matches!(outcome, Ok(true)) {
        let _ = std::fs::remove_dir_all(dir.path().join("pg"));
        let kept = dir.keep();
        eprintln!("relay logs kept in {}", kept.join("logs").display());
    }
    outcome
}

/// The run itself, in `dir`: everything it starts is stopped when it returns.
async fn chaos(
    args: &Args,
    seed: u64,
    schedule: &Schedule,
    postbox_bin: PathBuf,
    pg_bin: PathBuf,
    dir: &Path,
) -> anyhow::Result<bool> {
    let duration = args.duration();
    let logs = dir.join("logs");
    let started = std::time::Instant::now();
    // A CDC relay reads the WAL logically.
    let settings: &[(&str, &str)] = match args.source {
        Source::Poll => &[],
        Source::Cdc => &[("wal_level", "logical")],
    };
    let cluster = Cluster::start(&dir.join("pg"), pg_bin, &args.pg_user, settings).await?;
    info!(url = %cluster.url(), elapsed = ?started.elapsed(), "private PostgreSQL cluster started");
    migrate(&postbox_bin, &logs, &cluster.url()).await?;
    let pool = PgPoolOptions::new()
        .max_connections(args.producers + 4)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&cluster.url())
        .await
        .context("connect to the private cluster")?;
    sqlx::raw_sql(LEDGER_DDL).execute(&pool).await?;
    let tenants = add_tenants(&pool, args.tenants).await?;

    let (broker, broker_auth_and_db) = split_redis_url(&args.redis_url)?;
    let upstream = tokio::net::lookup_host(&broker)
        .await
        .with_context(|| format!("resolve Redis at {broker}"))?
        .next()
        .with_context(|| format!("no address for Redis at {broker}"))?;
    let proxy = Proxy::try_start(upstream)
        .await
        .context("start the fault proxy")?;
    proxy.set_latency(args.broker_latency);
    let topic = format!(
        "postbox-chaos:{seed}:{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let reader = StreamReader::connect(&args.redis_url, topic.clone()).await?;
    let (reader_stop, reader_stop_rx) = watch::channel(false);
    let reader = tokio::spawn(reader.follow(reader_stop_rx));

    let mut fleet = Fleet::start(
        RelaySpec {
            bin: postbox_bin,
            database_url: cluster.url(),
            sink_url: format!(
                "redis://{}",
                broker_auth_and_db.replace("{}", &proxy.addr().to_string())
            ),
            topic: topic.clone(),
            lease: args.lease,
            publish_timeout: args.publish_timeout,
            batch_size: args.batch_size,
            ordered: args.ordered_aggregates > 0,
            source: args.source,
            cdc_claim: args.relays > 1,
            dir: logs.clone(),
        },
        args.relays,
    );

    for slot in 0..args.relays {
        if !fleet.wait_serving(slot, None, faults::READY_WAIT).await {
            bail!(
                "relay {slot} did not start within a minute; see its log in {}",
                logs.display()
            );
        }
    }
    let started = Instant::now();
    let producing = tokio::spawn(producers::run(
        pool.clone(),
        ProducerParams {
            seed,
            producers: args.producers,
            events: args.events,
            duration,
            rollback_percent: args.rollback_percent,
            sql_percent: args.sql_percent,
            ordered_aggregates: args.ordered_aggregates,
            tenants,
        },
    ));
    let injected = faults::inject(
        schedule,
        started,
        &Targets {
            fleet: &fleet,
            cluster: &cluster,
            proxy: &proxy,
            pool: &pool,
        },
    )
    .await?;
    info!("fault schedule done; waiting for the producers");
    let tally = producing.await.context("the producers panicked")??;
    let drain_started = Instant::now();
    let drained = drain(&pool, args.drain_timeout).await;
    let drained_in = drained.then(|| drain_started.elapsed());
    fleet.stop().await;
    reader_stop.send_replace(true);
    let deliveries = reader.await.context("the stream reader panicked")??;
    let (ledger, rows) = read_back(&pool).await?;

    let report = Report::new(
        Settings {
            seed,
            minutes: args.minutes,
            events: args.events,
            relays: args.relays,
            producers: args.producers,
            batch_size: args.batch_size,
            ordered_aggregates: args.ordered_aggregates,
            tenants: args.tenants,
            source: args.source,
            lease: args.lease,
            publish_timeout: args.publish_timeout,
            schedule_fingerprint: schedule.fingerprint(),
            faults_scheduled: schedule.faults.len(),
        },
        Evidence {
            ledger,
            rows,
            deliveries,
            tally,
            injected,
            unplanned_exits: fleet.unplanned_exits(),
            relays_started: fleet.started(),
            relay_logs: crate::relay_logs::RelayLogs::read(&logs),
            drained_in,
            elapsed: started.elapsed(),
        },
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }

    drop(pool);
    drop(cluster);
    drop(fleet);
    if args.keep {
        eprintln!("kept: Redis stream {topic}");
    } else if let Err(e) = StreamReader::remove(&args.redis_url, &topic).await {
        warn!(error = %format!("{e:#}"), stream = %topic, "cannot delete the Redis stream");
    }
    Ok(report.passed)
}

/// `--postbox-bin`, else `postbox` next to this binary (both are built into the same target
/// directory).
fn postbox_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .context("locate this binary")?
            .with_file_name("postbox"),
    };
    if !path.is_file() {
        bail!(
            "no postbox binary at {}: build it (cargo build --release -p postbox-cli) or pass \
             --postbox-bin",
            path.display()
        );
    }
    // Absolute: the relays run in the run directory.
    path.canonicalize()
        .with_context(|| format!("locate {}", path.display()))
}

/// `postbox migrate` on the private cluster, its output in `logs/migrate.log`.
async fn migrate(bin: &Path, logs: &Path, url: &str) -> anyhow::Result<()> {
    let output = fleet::postbox_command(bin, logs, url)
        .arg("migrate")
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("run {} migrate", bin.display()))?;
    let mut text = output.stdout.clone();
    text.extend_from_slice(&output.stderr);
    std::fs::write(logs.join("migrate.log"), &text)?;
    if !output.status.success() {
        bail!(
            "postbox migrate failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&text).trim()
        );
    }
    Ok(())
}

/// Splits `redis://[auth@]host[:port][/db]` into `host:port` and the URL around it, with `{}`
/// where `host:port` goes, so relays can be pointed at the proxy instead.
fn split_redis_url(url: &str) -> anyhow::Result<(String, String)> {
    let rest = url
        .strip_prefix("redis://")
        .with_context(|| format!("--redis-url {url:?} must start with redis://"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (auth, host) = match authority.rfind('@') {
        Some(i) => (&authority[..=i], &authority[i + 1..]),
        None => ("", authority),
    };
    if host.is_empty() {
        bail!("--redis-url {url:?} names no host");
    }
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:6379")
    };
    Ok((host, format!("{auth}{{}}{path}")))
}

/// Every event of every outbox, the default schema's and each tenant's: what the drain and the
/// report read.
const ALL_EVENTS: &str = "chaos_all_events";

/// Adds `n` tenants (`t0` …) and gives each tenant's ids a range of their own (tenant `k`'s
/// start past `(k + 1) × 10^12`), so that an event id names one event across every schema, as
/// the report and the stream's `postbox-event-id` count them; then the view of every outbox's
/// events ([`ALL_EVENTS`]).
async fn add_tenants(pool: &PgPool, n: u32) -> anyhow::Result<Vec<postbox::store::Tenant>> {
    use postbox::ops::StoreOps;
    let store = postbox::PgStore::new(pool.clone());
    let mut tenants = Vec::with_capacity(n as usize);
    let mut view = vec![
        "SELECT id, status, retry_count, last_error, aggregate_id FROM public.outbox_events"
            .to_owned(),
    ];
    for k in 0..n {
        let id = postbox::schema::TenantId::new(&format!("t{k}"))?;
        let tenant = store
            .tenant_add(&postbox::store::TenantAddParams {
                id: &id,
                schema: None,
            })
            .await
            .with_context(|| format!("add tenant {id}"))?;
        // The schema is a validated `SchemaName`, quoted; the number is the tenant's place.
        let table = format!("{}.outbox_events", tenant.schema.quoted());
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} ALTER COLUMN id RESTART WITH {}",
            (u64::from(k) + 1) * 1_000_000_000_000 + 1
        )))
        .execute(pool)
        .await
        .with_context(|| format!("give tenant {id} its ids"))?;
        view.push(format!(
            "SELECT id, status, retry_count, last_error, aggregate_id FROM {table}"
        ));
        tenants.push(tenant);
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE VIEW {ALL_EVENTS} AS {}",
        view.join(" UNION ALL ")
    )))
    .execute(pool)
    .await
    .context("create the view of every outbox")?;
    if n > 0 {
        info!(tenants = n, "tenants added");
    }
    Ok(tenants)
}

/// Waits until no event is `PENDING` or `PROCESSING`; false at `timeout`.
async fn drain(pool: &PgPool, timeout: Duration) -> bool {
    let started = Instant::now();
    let mut last_log = Instant::now();
    loop {
        let left: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM chaos_all_events WHERE status IN ('PENDING', 'PROCESSING')",
        )
        .fetch_one(pool)
        .await;
        match left {
            Ok(0) => {
                info!(elapsed = ?started.elapsed(), "outbox drained");
                return true;
            }
            Ok(n) if last_log.elapsed() >= Duration::from_secs(10) => {
                info!(left = n, elapsed = ?started.elapsed(), "draining");
                last_log = Instant::now();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot count the events left; retrying"),
        }
        if started.elapsed() >= timeout {
            warn!(?timeout, "outbox not drained in time");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The ledger and the outbox table, as they are at the end.
async fn read_back(pool: &PgPool) -> anyhow::Result<(Vec<LedgerRow>, Vec<OutboxRow>)> {
    let ledger = sqlx::query("SELECT marker, event_id, path FROM chaos_ledger")
        .fetch_all(pool)
        .await
        .context("read the ledger")?
        .into_iter()
        .map(|r| {
            Ok(LedgerRow {
                marker: r.try_get("marker")?,
                event_id: r.try_get("event_id")?,
                path: r.try_get("path")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let rows = sqlx::query(
        "SELECT id, status, retry_count, last_error, aggregate_id FROM chaos_all_events",
    )
    .fetch_all(pool)
    .await
    .context("read the outbox table")?
    .into_iter()
    .map(|r| {
        Ok(OutboxRow {
            id: r.try_get("id")?,
            status: r.try_get("status")?,
            retry_count: r.try_get("retry_count")?,
            last_error: r.try_get("last_error")?,
            aggregate_id: r.try_get("aggregate_id")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok((ledger, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls_are_pointed_at_the_proxy() {
        let (host, around) = split_redis_url("redis://127.0.0.1:6379").unwrap_or_default();
        assert_eq!(host, "127.0.0.1:6379");
        assert_eq!(around, "{}");
        let (host, around) = split_redis_url("redis://:pw@cache/2").unwrap_or_default();
        assert_eq!(host, "cache:6379");
        assert_eq!(
            around.replace("{}", "127.0.0.1:4000"),
            ":pw@127.0.0.1:4000/2"
        );
        assert!(split_redis_url("rediss://x").is_err());
    }
}
