//! Day 30: the statements the relay and the CLI run cost what the work in hand costs, not what
//! the table's history costs — with statistics, without them, and with statistics taken while a
//! large backlog was pending (the case that once made every claim walk the whole history).
//!
//! Each statement is run under `EXPLAIN (ANALYZE, BUFFERS)` with generic plans forced (what a
//! prepared statement gets after a few runs), on a young table and on one with a long processed
//! history; the buffers it touches on the latter must stay within a small multiple of the
//! former's.

use postbox::PgStore;
use postbox_testkit::TestDb;
use sqlx::{AssertSqlSafe, Executor, PgPool, Row};

/// Processed events kept in the "old" tables.
const HISTORY: i64 = 400_000;
/// Events waiting to be published in every table.
const BACKLOG: i64 = 1_000;
/// The claim size measured.
const BATCH: i32 = 100;

/// How the old table got its statistics.
#[derive(Clone, Copy, Debug)]
enum Stats {
    /// No ANALYZE ever ran.
    None,
    /// ANALYZE after the history was processed: statistics that match the table.
    Fresh,
    /// ANALYZE while the whole history was still pending, then drained: statistics that say
    /// nearly every row is due.
    TakenWhilePending,
}

/// Buffers each statement touched, by name.
#[derive(Debug)]
struct Costs(Vec<(&'static str, i64)>);

impl Costs {
    fn get(&self, name: &str) -> i64 {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| *b)
            .unwrap_or_else(|| panic!("no cost for {name}"))
    }
}

async fn table(history: i64, stats: Stats) -> TestDb {
    let db = TestDb::new().await;
    postbox::migrate(&PgStore::new(db.pool().clone()))
        .await
        .expect("migrate");
    let pool = db.pool();
    let insert = |status: &'static str, n: i64| {
        format!(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status)
             SELECT 'InvoiceCreated', 'Invoice', g::text, jsonb_build_object('invoice_id', g), '{status}'
             FROM generate_series(1, {n}) g"
        )
    };
    match stats {
        Stats::TakenWhilePending => {
            run(pool, &insert("PENDING", history + BACKLOG)).await;
            run(pool, "ANALYZE outbox_events").await;
            run(
                pool,
                &format!(
                    "UPDATE outbox_events SET status = 'PROCESSED', processed_at = now()
                     WHERE id <= {history}"
                ),
            )
            .await;
            // Removes the dead row versions the drain left (relays and autovacuum do), without
            // touching the column statistics.
            run(pool, "VACUUM outbox_events").await;
        }
        Stats::None | Stats::Fresh => {
            run(pool, &insert("PROCESSED", history)).await;
            run(pool, &insert("PENDING", BACKLOG)).await;
            run(pool, "VACUUM outbox_events").await;
            if matches!(stats, Stats::Fresh) {
                run(pool, "ANALYZE outbox_events").await;
            }
        }
    }
    let analyzed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stats WHERE tablename = 'outbox_events' AND schemaname = 'public'",
    )
    .fetch_one(pool)
    .await
    .expect("pg_stats");
    assert_eq!(
        analyzed > 0,
        !matches!(stats, Stats::None),
        "statistics as the case says"
    );
    db
}

async fn run(pool: &PgPool, sql: &str) {
    pool.execute(AssertSqlSafe(sql.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Shared buffers `sql` (with `$n` parameters bound to the literal `args`) touches, as a
/// prepared statement with a generic plan.
async fn buffers(conn: &mut sqlx::PgConnection, name: &str, sql: &str, args: &str) -> i64 {
    let sql = sql.replace("{schema}", "\"public\"");
    conn.execute(AssertSqlSafe(format!("PREPARE {name} AS {sql}")))
        .await
        .unwrap_or_else(|e| panic!("prepare {name}: {e}"));
    let args = if args.is_empty() {
        String::new()
    } else {
        format!("({args})")
    };
    let row = sqlx::query(AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}{args}"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap_or_else(|e| panic!("explain {name}: {e}"));
    let plan: serde_json::Value = row.get(0);
    let top = &plan[0]["Plan"];
    let blocks = |k: &str| top[k].as_i64().unwrap_or(0);
    blocks("Shared Hit Blocks") + blocks("Shared Read Blocks")
}

/// Runs every hot-path statement once against `db` and returns what each touched.
async fn costs(db: &TestDb) -> Costs {
    let mut conn = db.pool().acquire().await.expect("connection");
    conn.execute("SET plan_cache_mode = force_generic_plan")
        .await
        .expect("generic plans");
    let token = "'00000000-0000-0000-0000-000000000001'::uuid";
    let claim = include_str!("../../sql/postgres/queries/claim.sql");
    let mut out = Vec::new();
    // A relay's first floor (and its sweep every minute): from the start of the polling index.
    let floor_sql = include_str!("../../sql/postgres/queries/claim_floor.sql");
    let max = i64::MAX;
    // (Read once first: the session's first call plans the function, reading the catalog.)
    let floor: i64 = sqlx::query_scalar("SELECT postbox_floor(0, $1)")
        .bind(max)
        .fetch_one(&mut *conn)
        .await
        .expect("floor");
    out.push((
        "floor_sweep",
        buffers(&mut conn, "floor_sweep", floor_sql, &format!("0, {max}")).await,
    ));
    out.push((
        "floor",
        buffers(&mut conn, "floor", floor_sql, &format!("{floor}, {max}")).await,
    ));
    // Claims from the relay's floor, as relays make them.
    out.push((
        "claim",
        buffers(
            &mut conn,
            "claim",
            include_str!("../../sql/postgres/queries/claim_unordered.sql"),
            &format!("{BATCH}, 30000, 'r1', {token}, ARRAY[]::text[], 0, 'lease expired', {floor}"),
        )
        .await,
    ));
    // The claimed events, for the statements that act on them.
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_events WHERE claim_token = $1")
        .bind(uuid::Uuid::from_u128(1))
        .fetch_all(&mut *conn)
        .await
        .expect("claimed ids");
    assert_eq!(ids.len(), BATCH as usize, "a full batch was claimed");
    let (half, rest) = ids.split_at(ids.len() / 2);
    let (rest, released) = rest.split_at(rest.len() / 2);
    let array = |ids: &[i64]| {
        format!(
            "ARRAY[{}]::bigint[]",
            ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
        )
    };
    let n = rest.len();
    out.push((
        "renew",
        buffers(
            &mut conn,
            "renew",
            include_str!("../../sql/postgres/queries/renew.sql"),
            &format!("{}, {token}, 30000", array(&ids)),
        )
        .await,
    ));
    out.push((
        "mark_processed",
        buffers(
            &mut conn,
            "mark_processed",
            include_str!("../../sql/postgres/queries/mark_processed.sql"),
            &format!("{}, {token}", array(half)),
        )
        .await,
    ));
    out.push((
        "mark_failed",
        buffers(
            &mut conn,
            "mark_failed",
            include_str!("../../sql/postgres/queries/mark_failed.sql"),
            &format!(
                "{}, array_fill('down'::text, ARRAY[{n}]), array_fill(true, ARRAY[{n}]), {token}, 1000, 300000, array_fill(NULL::int, ARRAY[{n}])",
                array(rest)
            ),
        )
        .await,
    ));
    let r = released.len();
    out.push((
        "release",
        buffers(
            &mut conn,
            "release",
            include_str!("../../sql/postgres/queries/release.sql"),
            &format!(
                "{}, array_fill('unavailable'::text, ARRAY[{r}]), array_fill(1000::float8, ARRAY[{r}]), {token}",
                array(released)
            ),
        )
        .await,
    ));
    out.push((
        "retry_slow_lane",
        buffers(
            &mut conn,
            "retry_slow_lane",
            include_str!("../../sql/postgres/queries/retry_slow_lane.sql"),
            "0, 24, 1000, ARRAY['Skipped*']::text[], 'retried by the slow lane'",
        )
        .await,
    ));
    out.push((
        "retry_failed",
        buffers(
            &mut conn,
            "retry_failed",
            include_str!("../../sql/postgres/queries/retry_failed.sql"),
            &format!("{}, 'retried by an operator'", array(rest)),
        )
        .await,
    ));
    out.push((
        "backlog",
        buffers(
            &mut conn,
            "backlog",
            include_str!("../../sql/postgres/queries/backlog.sql"),
            "",
        )
        .await,
    ));
    out.push((
        "status",
        buffers(
            &mut conn,
            "status",
            include_str!("../../sql/postgres/queries/status_counts.sql"),
            &format!("'public', {}", postbox::store::EXACT_PROCESSED_COUNT),
        )
        .await,
    ));
    // Retention's walk (a dry run reads what the archiving reads): at most a batch of rows from
    // the head of the table, however long the history behind them.
    out.push((
        "archive_walk",
        buffers(
            &mut conn,
            "archive_walk",
            include_str!("../../sql/postgres/queries/archive_count.sql"),
            "0, 0, 1000",
        )
        .await,
    ));
    out.push((
        "purge_failed_count",
        buffers(
            &mut conn,
            "purge_failed_count",
            include_str!("../../sql/postgres/queries/purge_failed_count.sql"),
            "0",
        )
        .await,
    ));
    // With per-aggregate ordering: the claim also reads, for each event it walks, the first
    // unfinished entries of its aggregate (a partial index without the history).
    out.push((
        "claim_ordered",
        buffers(
            &mut conn,
            "claim_ordered",
            claim,
            &format!(
                "{BATCH}, 30000, 'r2', '00000000-0000-0000-0000-000000000002'::uuid, \
                 ARRAY['Invoice']::text[], 9223372036854775807, 'lease expired', {floor}, {BATCH}, false"
            ),
        )
        .await,
    ));
    out.push((
        "backlog_ordered",
        buffers(
            &mut conn,
            "backlog_ordered",
            include_str!("../../sql/postgres/queries/backlog_ordered.sql"),
            "ARRAY['Invoice']::text[]",
        )
        .await,
    ));
    Costs(out)
}

/// The old table's costs stay within a small multiple of the young table's, statement by
/// statement. A statement that read the history would touch about `HISTORY` buffers.
async fn history_does_not_raise_costs(stats: Stats) {
    let young = table(0, Stats::None).await;
    let young = costs(&young).await;
    let old = table(HISTORY, stats).await;
    let old = costs(&old).await;
    for (name, base) in &young.0 {
        let cost = old.get(name);
        // Room for a deeper B-tree and for the pages a larger table spreads rows over; far
        // below the ~HISTORY/50 buffers that even an index-only pass over the history would take.
        let bound = 2 * base + 300;
        assert!(
            cost <= bound,
            "{name} touched {cost} buffers with {HISTORY} processed events in the table \
             ({stats:?} statistics) against {base} on a young table (bound {bound}); \
             all: young {young:?}, old {old:?}"
        );
    }
}

#[tokio::test]
async fn hot_path_costs_do_not_grow_with_history_without_statistics() {
    history_does_not_raise_costs(Stats::None).await;
}

#[tokio::test]
async fn hot_path_costs_do_not_grow_with_history_with_fresh_statistics() {
    history_does_not_raise_costs(Stats::Fresh).await;
}

#[tokio::test]
async fn hot_path_costs_do_not_grow_with_history_with_statistics_of_a_backlog() {
    history_does_not_raise_costs(Stats::TakenWhilePending).await;
}

/// A relay's session keeps the claim's plan, made at its first claim: on a new outbox, while
/// the table was empty (and a vacuum had said so). Its claims must still cost their batch once
/// a history has grown, whatever that plan assumed the table held: without ordered aggregate
/// types and with them.
async fn claim_planned_on_an_empty_table(ordered: bool) {
    let db = TestDb::new().await;
    postbox::migrate(&PgStore::new(db.pool().clone()))
        .await
        .expect("migrate");
    run(db.pool(), "VACUUM outbox_events").await;
    let mut conn = db.pool().acquire().await.expect("connection");
    let token = "'00000000-0000-0000-0000-000000000001'::uuid";
    let (claim, args): (&str, Box<dyn Fn(i64) -> String>) = if ordered {
        (
            include_str!("../../sql/postgres/queries/claim.sql"),
            Box::new(move |floor| {
                format!(
                    "{BATCH}, 30000, 'r1', {token}, ARRAY['*']::text[], {}, 'lease expired', \
                     {floor}, {}, false",
                    i64::MAX,
                    4 * BATCH
                )
            }),
        )
    } else {
        (
            include_str!("../../sql/postgres/queries/claim_unordered.sql"),
            Box::new(move |floor| {
                format!(
                    "{BATCH}, 30000, 'r1', {token}, ARRAY[]::text[], 0, 'lease expired', {floor}"
                )
            }),
        )
    };
    // The first claim, on the empty table, plans the claim for this session.
    conn.execute(AssertSqlSafe(format!(
        "PREPARE first AS {}",
        claim.replace("{schema}", "\"public\"")
    )))
    .await
    .expect("prepare");
    conn.execute(AssertSqlSafe(format!("EXECUTE first({})", args(0))))
        .await
        .expect("first claim");
    run(
        db.pool(),
        &format!(
            "INSERT INTO outbox_events (event_type, aggregate_type, aggregate_id, payload, status)
             SELECT 'InvoiceCreated', 'Invoice', g::text, jsonb_build_object('invoice_id', g),
                    CASE WHEN g <= {HISTORY} THEN 'PROCESSED' ELSE 'PENDING' END
             FROM generate_series(1, {}) g",
            HISTORY + BACKLOG
        ),
    )
    .await;
    let cost = buffers(&mut conn, "claim", claim, &args(HISTORY)).await;
    // A claim of 100 from its floor touched about 1,500 buffers here; one whose plan read the
    // history, 10,000.
    assert!(
        cost <= 3_000,
        "a claim of {BATCH} (ordered: {ordered}) touched {cost} buffers beside {HISTORY} \
         processed events"
    );
}

#[tokio::test]
async fn a_claim_planned_on_an_empty_table_costs_its_batch_once_a_history_grows() {
    claim_planned_on_an_empty_table(false).await;
}

#[tokio::test]
async fn an_ordered_claim_planned_on_an_empty_table_costs_its_batch_once_a_history_grows() {
    claim_planned_on_an_empty_table(true).await;
}

#[tokio::test]
async fn status_estimates_a_long_history_and_counts_the_rest() {
    let db = table(HISTORY, Stats::Fresh).await;
    let store = PgStore::new(db.pool().clone());
    let target = postbox::Target::default_schema(postbox::SchemaName::public());
    let counts = postbox::ops::StoreOps::status_counts(&store, &target)
        .await
        .expect("status");
    assert_eq!(
        (counts.pending, counts.processing, counts.failed),
        (BACKLOG, 0, 0)
    );
    assert!(!counts.processed_exact, "{counts:?}");
    // VACUUM and ANALYZE just ran, so the estimate is close.
    let off = (counts.processed - HISTORY).abs();
    assert!(off <= HISTORY / 20, "{counts:?}");
    assert!(counts.oldest_pending_age.is_some());
}
