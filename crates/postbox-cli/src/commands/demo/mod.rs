//! `postbox demo`: an invoice service, a flaky consumer and a relay, ending with a tally that
//! proves nothing was lost and no ghost was published.

mod handlers;
mod invoices;
mod tally;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use postbox::{Relay, SchemaName};
use sqlx::AssertSqlSafe;

use crate::config::{Config, show};
use crate::database::{Create, Database, Location, Pool};
use crate::shutdown::Shutdown;

use handlers::{Mailer, Seen};
use invoices::{InvoiceCreated, InvoiceService, Written};
use postbox::StoreExt;
use tally::Tally;

/// The longest the relay may take to drain the demo's outbox before the demo gives up.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// One invoice of the script.
struct Planned {
    number: &'static str,
    customer: &'static str,
    amount_cents: i64,
    /// Why the service rolls it back, if it does.
    reject: Option<&'static str>,
    /// How its notification goes.
    mailer: Mailer,
}

/// The script: some invoices rolled back, some notifications flaky, one that never gets through.
const PLAN: &[Planned] = &[
    Planned {
        number: "INV-1001",
        customer: "Acme Corp",
        amount_cents: 120_000,
        reject: None,
        mailer: Mailer::Works,
    },
    Planned {
        number: "INV-1002",
        customer: "Globex",
        amount_cents: 8_990,
        reject: None,
        mailer: Mailer::Works,
    },
    Planned {
        number: "INV-1003",
        customer: "Initech",
        amount_cents: 45_000,
        reject: None,
        mailer: Mailer::BusyFor(1),
    },
    Planned {
        number: "INV-1004",
        customer: "Umbrella Corp",
        amount_cents: 1_500_000,
        reject: Some("credit check failed"),
        mailer: Mailer::Works,
    },
    Planned {
        number: "INV-1005",
        customer: "Hooli",
        amount_cents: 4_200,
        reject: None,
        mailer: Mailer::Works,
    },
    Planned {
        number: "INV-1006",
        customer: "Stark Industries",
        amount_cents: 99_999,
        reject: None,
        mailer: Mailer::BusyFor(2),
    },
    Planned {
        number: "INV-1007",
        customer: "Wayne Enterprises",
        amount_cents: 25_000,
        reject: Some("duplicate order detected"),
        mailer: Mailer::Works,
    },
    Planned {
        number: "INV-1008",
        customer: "Soylent",
        amount_cents: 7_550,
        reject: None,
        mailer: Mailer::Bounces,
    },
    Planned {
        number: "INV-1009",
        customer: "Tyrell",
        amount_cents: 310_000,
        reject: None,
        mailer: Mailer::Works,
    },
    Planned {
        number: "INV-1010",
        customer: "Cyberdyne",
        amount_cents: 61_000,
        reject: Some("customer account is closed"),
        mailer: Mailer::Works,
    },
];

/// The demo's defaults: quick retries so it ends in seconds, and quiet logs (it narrates).
/// postbox.toml, `POSTBOX_*` and flags still override them.
pub(crate) fn defaults() -> Config {
    Config {
        max_retries: 3,
        backoff_base: Duration::from_millis(100),
        backoff_cap: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        log_level: "off".to_owned(),
        ..Config::default()
    }
}

/// Where the demo runs, and what to clean up afterwards.
enum Place {
    /// A temporary directory holding `demo.db`.
    Temp(tempfile::TempDir),
    /// A new SQLite file named by `--database-url`.
    NewSqliteFile(PathBuf),
    /// An in-memory SQLite database.
    SqliteMemory,
    /// A schema of its own on PostgreSQL.
    Postgres,
}

/// Runs the demo; exits 0 if the tally holds.
pub(crate) async fn run(
    config: &Config,
    database_url: Option<&str>,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    let shutdown = Shutdown::install()?;
    let (place, db, schema) = prepare(database_url).await?;
    let outcome = tokio::select! {
        outcome = demo(config, &db, &schema, &place) => outcome,
        () = shutdown.requested() => Err(anyhow!("interrupted")),
    };
    let cleaned = finish(place, &db, &schema, args.keep).await;
    let code = outcome?;
    cleaned?;
    Ok(code)
}

/// Picks and opens the demo's database.
async fn prepare(database_url: Option<&str>) -> anyhow::Result<(Place, Database, SchemaName)> {
    let public = SchemaName::public();
    let Some(url) = database_url else {
        let dir = tempfile::Builder::new()
            .prefix("postbox-demo-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let path = dir.path().join("demo.db");
        let location = Location::Sqlite {
            url: path.display().to_string(),
            file: Some(path),
        };
        let db = Database::connect(&location, public.clone(), Create::IfMissing).await?;
        return Ok((Place::Temp(dir), db, public));
    };
    let location = Location::parse(Some(url)).context("invalid --database-url")?;
    match &location {
        Location::Postgres(..) => {
            let suffix = uuid::Uuid::new_v4().simple().to_string();
            let schema = SchemaName::new(&format!("postbox_demo_{}", &suffix[..8]))?;
            let db = Database::connect(&location, schema.clone(), Create::IfMissing).await?;
            Ok((Place::Postgres, db, schema))
        }
        Location::Sqlite {
            file: Some(path), ..
        } => {
            if path.exists() {
                bail!(
                    "the demo needs a new database file, and {} exists; name another one, or \
                     leave --database-url out to use a temporary one",
                    path.display()
                );
            }
            let db = Database::connect(&location, public.clone(), Create::IfMissing).await?;
            Ok((Place::NewSqliteFile(path.clone()), db, public))
        }
        Location::Sqlite { file: None, .. } => {
            let db = Database::connect(&location, public.clone(), Create::IfMissing).await?;
            Ok((Place::SqliteMemory, db, public))
        }
        Location::MySql(..) => bail!(
            "the demo runs on PostgreSQL or SQLite; leave --database-url out for a temporary \
             SQLite database"
        ),
    }
}

/// The demo proper: write invoices, relay, narrate, tally.
async fn demo(
    config: &Config,
    db: &Database,
    schema: &SchemaName,
    place: &Place,
) -> anyhow::Result<ExitCode> {
    let where_ = match place {
        Place::Temp(_) => format!("{} (temporary; --keep keeps it)", db.location),
        Place::Postgres => format!(
            "{}, schema {schema} (dropped afterwards unless --keep)",
            db.location
        ),
        _ => db.location.clone(),
    };
    println!("Postbox demo\n============\n");
    println!("Database  {where_}");
    println!(
        "Relay     max_retries {}, backoff {} doubling up to {}, batch_size {}\n",
        config.max_retries,
        show(config.backoff_base),
        show(config.backoff_cap),
        config.batch_size
    );
    postbox::migrate(&*db.store)
        .await
        .context("cannot create the outbox tables")?;
    let outbox = db
        .store
        .outbox_builder()
        .max_retries(i32::try_from(config.max_retries).unwrap_or(i32::MAX))
        .payload_limit(config.payload_limit.0)
        .build();
    let service = InvoiceService::new(db.pool.clone(), schema, outbox);
    service.create_table().await?;

    println!(
        "Step 1 · The invoice service writes each invoice and its InvoiceCreated event in one \
         transaction\n"
    );
    let mut rolled_back = BTreeSet::new();
    for p in PLAN {
        let invoice = InvoiceCreated {
            number: p.number.to_owned(),
            customer: p.customer.to_owned(),
            amount_cents: p.amount_cents,
        };
        let amount = money(p.amount_cents);
        match service.create(&invoice, p.reject).await? {
            Written::Committed(id) => println!(
                "  ✔  {}  {:<18} {amount:>13}  committed    → event #{id} waits in the outbox",
                p.number, p.customer
            ),
            Written::RolledBack => {
                rolled_back.insert(p.number.to_owned());
                println!(
                    "  ✘  {}  {:<18} {amount:>13}  rolled back  ({}): its event vanished with it",
                    p.number,
                    p.customer,
                    p.reject.unwrap_or("rejected")
                );
            }
        }
    }
    let committed: BTreeSet<String> = service.committed_numbers().await?.into_iter().collect();
    println!(
        "\n  {} committed, {} rolled back. Nothing has been published yet.\n",
        committed.len(),
        rolled_back.len()
    );

    println!("Step 2 · A relay publishes the outbox to two handlers");
    println!("  notification (InvoiceCreated): mails the customer; the mail server is flaky");
    println!("  audit (catch-all): records every event\n");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mailer: HashMap<String, Mailer> = PLAN
        .iter()
        .map(|p| (p.number.to_owned(), p.mailer))
        .collect();
    let sink = handlers::handlers(mailer, config.max_retries, Arc::clone(&seen));
    let relay = Relay::from_parts(Arc::clone(&db.store), Arc::new(sink), config.relay_config())?;
    let started = Instant::now();
    let stats = tokio::time::timeout(DRAIN_LIMIT, relay.drain(std::future::pending()))
        .await
        .map_err(|_| anyhow!("the relay did not drain the outbox within {DRAIN_LIMIT:?}"))??;
    println!(
        "\n  Drained in {:.1}s: {} published, {} failed tries retried or given up, {} FAILED.\n",
        started.elapsed().as_secs_f64(),
        stats.published,
        stats.failed_tries,
        stats.gave_up
    );

    let events_table = match db.pool {
        Pool::Postgres(_) => format!("{}.outbox_events", schema.quoted()),
        Pool::Sqlite(_) | Pool::MySql(_) => "outbox_events".to_owned(),
    };
    let rows = tally::outbox_rows(&db.pool, &events_table).await?;
    println!("Step 3 · Events that need an operator (FAILED, kept with their last error)\n");
    let failed: Vec<_> = rows.iter().filter(|r| r.status == "FAILED").collect();
    if failed.is_empty() {
        println!("  none\n");
    }
    for r in failed {
        println!(
            "  ✘  event #{} (Invoice {}) FAILED after {} tries\n     last_error: {}\n",
            r.id,
            r.aggregate_id.as_deref().unwrap_or("-"),
            r.retry_count,
            r.last_error.as_deref().unwrap_or("(none)")
        );
    }
    println!(
        "  An operator fixes the cause, then runs `postbox retry <id>`; the relay also logged an \
         error-level alert (run with --log-level info to see the relay's logs).\n"
    );

    let tally = {
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        Tally::count(&committed, &rolled_back, &rows, &seen)
    };
    print!("{}", tally.render());
    if tally.nothing_lost() && tally.no_ghost() {
        println!(
            "\n✔ The tally holds: every committed invoice's event was published or is FAILED with \
             a reason, and no rolled-back invoice was published."
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\n✘ The tally does NOT hold: see the ✘ lines above.");
        Ok(ExitCode::FAILURE)
    }
}

/// Removes the demo's database, or says where it was kept.
async fn finish(
    place: Place,
    db: &Database,
    schema: &SchemaName,
    keep: bool,
) -> anyhow::Result<()> {
    match place {
        Place::Temp(dir) => {
            db.pool.close().await;
            if keep {
                let path = dir.keep().join("demo.db");
                println!(
                    "\nKept the demo database: {0}\n  look inside: sqlite3 {0} 'SELECT id, status, retry_count, last_error FROM outbox_events'",
                    path.display()
                );
            }
        }
        Place::NewSqliteFile(path) => {
            db.pool.close().await;
            if keep {
                println!("\nKept the demo database: {}", path.display());
            } else {
                for suffix in ["", "-wal", "-shm"] {
                    let file = PathBuf::from(format!("{}{suffix}", path.display()));
                    match std::fs::remove_file(&file) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(e)
                                .with_context(|| format!("cannot remove {}", file.display()));
                        }
                        _ => {}
                    }
                }
            }
        }
        Place::SqliteMemory => {
            if keep {
                println!("\nAn in-memory database cannot be kept.");
            }
        }
        Place::Postgres => {
            if keep {
                println!("\nKept the demo schema {schema} in {}.", db.location);
            } else if let Pool::Postgres(pool) = &db.pool {
                // The only dynamic part is the demo's own schema, quoted by `SchemaName::quoted`.
                sqlx::query(AssertSqlSafe(format!(
                    "DROP SCHEMA {} CASCADE",
                    schema.quoted()
                )))
                .execute(pool)
                .await
                .with_context(|| format!("cannot drop the demo schema {schema}"))?;
            }
            db.pool.close().await;
        }
    }
    Ok(())
}

/// Cents as `1,234.56 EUR`.
fn money(cents: i64) -> String {
    let units = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, c) in units.chars().enumerate() {
        if i > 0 && (units.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{grouped}.{:02} EUR", cents % 100)
}

/// `postbox demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Keep the demo's database afterwards (its location is printed) to look around in it
    #[arg(long)]
    pub(crate) keep: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_groups_thousands() {
        assert_eq!(money(120_000), "1,200.00 EUR");
        assert_eq!(money(1_500_000), "15,000.00 EUR");
        assert_eq!(money(4_200), "42.00 EUR");
        assert_eq!(money(7), "0.07 EUR");
    }

    #[test]
    fn the_script_has_rollbacks_retries_and_a_failure() {
        assert!(PLAN.iter().any(|p| p.reject.is_some()));
        assert!(PLAN.iter().any(|p| matches!(p.mailer, Mailer::BusyFor(_))));
        assert_eq!(
            PLAN.iter()
                .filter(|p| p.mailer == Mailer::Bounces && p.reject.is_none())
                .count(),
            1
        );
        let d = defaults();
        assert!(PLAN.iter().all(|p| match p.mailer {
            Mailer::BusyFor(n) => n < d.max_retries,
            _ => true,
        }));
    }
}
