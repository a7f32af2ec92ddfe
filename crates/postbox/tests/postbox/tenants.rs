//! Tenant isolation (G7), suspension, fairness and hostile names, on PostgreSQL.
//!
//! Each test has a database of its own and waits on conditions, never on guessed sleeps.

#![allow(
    clippy::unwrap_used,
    reason = "tests fail loudly on the first unexpected error"
)]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::common::{Running, config, default_target, enqueue, own_store, pg, row};
use postbox::StoreExt;
use postbox::ops::StoreOps;
use postbox::{
    Error, Event, OutboxEvent, PgStore, Relay, SchemaName, schema::TenantId, store::TenantStatus,
};
use postbox_testkit::{Behaviour, RecordingSink, TestDb, wait_until};

// ---- G7: tenants ---------------------------------------------------------------------------

async fn add_tenant(store: &PgStore, id: &str) -> postbox::store::Tenant {
    store
        .tenant_add(&postbox::store::TenantAddParams {
            id: &TenantId::new(id).unwrap(),
            schema: None,
        })
        .await
        .unwrap()
}

/// Enqueues `n` events into `tenant`'s schema, each naming its tenant in the payload.
async fn enqueue_for(
    db: &TestDb,
    tenant: Option<&postbox::store::Tenant>,
    event_type: &str,
    n: usize,
) -> Vec<i64> {
    let outbox = match tenant {
        Some(t) => db.outbox_builder().tenant(t).build(),
        None => db.outbox(),
    };
    let name = tenant.map(|t| t.id.to_string());
    let batch = (0..n)
        .map(|i| {
            Event::new(event_type, &serde_json::json!({ "tenant": name, "i": i }))
                .unwrap()
                .without_idempotency_key()
        })
        .collect();
    enqueue(db, &outbox, batch).await
}

fn payload_tenant(e: &OutboxEvent) -> Option<String> {
    let payload: serde_json::Value = e.payload_as().unwrap();
    payload["tenant"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_each_tenant_is_published_as_itself_and_never_mixed() {
    let (db, store) = pg().await;
    let a = add_tenant(&store, "a").await;
    let b = add_tenant(&store, "b").await;
    assert_eq!(a.schema.as_str(), "s_a");
    enqueue_for(&db, Some(&a), "E", 20).await;
    enqueue_for(&db, Some(&b), "E", 20).await;
    enqueue_for(&db, None, "E", 5).await;
    let bad = enqueue_for(&db, Some(&a), "Bad", 1).await[0];
    let sink = RecordingSink::new();
    sink.script("Bad", Behaviour::FailPermanently);
    let relay = Relay::new(store, sink.clone(), config()).unwrap();
    let stats = relay.drain(std::future::pending()).await.unwrap();

    let published = sink.published();
    assert_eq!(published.len(), 45);
    let mut per_tenant: BTreeMap<Option<String>, HashSet<i64>> = BTreeMap::new();
    for e in &published {
        assert_eq!(
            e.tenant.as_deref().map(str::to_owned),
            payload_tenant(e),
            "event {} of {:?}",
            e.id,
            e.tenant
        );
        assert!(
            per_tenant
                .entry(e.tenant.as_deref().map(str::to_owned))
                .or_default()
                .insert(e.id),
            "{:?} event {} published twice",
            e.tenant,
            e.id
        );
    }
    let sizes: Vec<usize> = per_tenant.values().map(HashSet::len).collect();
    assert_eq!(sizes, [5, 20, 20], "{per_tenant:?}");
    assert_eq!((stats.published, stats.gave_up), (45, 1));

    // The failure is tenant a's, stored and shown as a's only.
    let relay_store = PgStore::new(db.pool().clone());
    let counts_a = relay_store.status_counts(&a.target()).await.unwrap();
    let counts_b = relay_store.status_counts(&b.target()).await.unwrap();
    let counts_default = relay_store.status_counts(&default_target()).await.unwrap();
    assert_eq!((counts_a.processed, counts_a.failed), (20, 1));
    assert_eq!((counts_b.processed, counts_b.failed), (20, 0));
    assert_eq!((counts_default.processed, counts_default.failed), (5, 0));
    assert_eq!(row(&db, "s_a", bad).await.status, "FAILED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_tenant_is_not_served_until_resumed() {
    let (db, store) = pg().await;
    let a = add_tenant(&store, "a").await;
    let b = add_tenant(&store, "b").await;
    store
        .tenant_set_status(&b.id, TenantStatus::Suspended)
        .await
        .unwrap();
    enqueue_for(&db, Some(&a), "E", 5).await;
    let b_ids = enqueue_for(&db, Some(&b), "E", 5).await;
    let sink = RecordingSink::new();
    let relay = Relay::new(own_store(&db, 3).await, sink.clone(), config()).unwrap();
    relay.drain(std::future::pending()).await.unwrap();
    assert!(
        sink.published()
            .iter()
            .all(|e| e.tenant.as_deref() == Some("a"))
    );
    assert_eq!(sink.published().len(), 5);
    let counts_b = store.status_counts(&b.target()).await.unwrap();
    assert_eq!(
        (counts_b.pending, counts_b.processing),
        (5, 0),
        "b's events wait"
    );

    let running = Running::start(relay);
    store
        .tenant_set_status(&b.id, TenantStatus::Active)
        .await
        .unwrap();
    wait_until(
        "b's events are published once b is resumed",
        Duration::from_secs(5),
        || async {
            sink.published()
                .iter()
                .filter(|e| e.tenant.as_deref() == Some("b"))
                .count()
                == 5
        },
    )
    .await;
    running.stop().await;
    let got: HashSet<i64> = sink
        .published()
        .iter()
        .filter(|e| e.tenant.as_deref() == Some("b"))
        .map(|e| e.id)
        .collect();
    assert_eq!(got, b_ids.into_iter().collect());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tenant_does_not_starve_a_small_one() {
    let (db, store) = pg().await;
    let a = add_tenant(&store, "a").await;
    let b = add_tenant(&store, "b").await;
    enqueue_for(&db, Some(&a), "E", 5000).await;
    enqueue_for(&db, Some(&b), "E", 10).await;
    let sink = RecordingSink::new();
    // Claims of one size: what is fair is one claim per tenant per round (with growth on, the
    // small tenant waits for one of the busy tenant's grown claims per round instead).
    let relay = Relay::new(store, sink.clone(), config().max_batch_size(100)).unwrap();
    relay.drain(std::future::pending()).await.unwrap();

    let order: Vec<Option<String>> = sink
        .published()
        .into_iter()
        .map(|e| e.tenant.as_deref().map(str::to_owned))
        .collect();
    assert_eq!(order.len(), 5010);
    let last_b = order
        .iter()
        .rposition(|t| t.as_deref() == Some("b"))
        .expect("b was published");
    let a_before = order[..last_b]
        .iter()
        .filter(|t| t.as_deref() == Some("a"))
        .count();
    assert!(
        a_before <= 200,
        "b's 10 events waited for {a_before} of a's (one batch of 100 per round is fair)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_tenant_does_not_stop_the_others() {
    let (db, store) = pg().await;
    let a = add_tenant(&store, "a").await;
    let b = add_tenant(&store, "b").await;
    // Someone dropped tenant a's table by hand; every claim in a fails.
    sqlx::raw_sql("DROP TABLE s_a.outbox_events")
        .execute(db.pool())
        .await
        .unwrap();
    let b_ids = enqueue_for(&db, Some(&b), "E", 250).await;
    let sink = RecordingSink::new();
    let cfg = config().poll_interval(Duration::from_secs(2));
    let running = Running::start(Relay::new(store, sink.clone(), cfg).unwrap());
    wait_until(
        "b's 250 events are published",
        Duration::from_secs(3),
        || async { sink.published().len() == b_ids.len() },
    )
    .await;
    running.stop().await;
    assert_eq!(a.schema.as_str(), "s_a");
}

/// A registry row added by hand with an id Postbox refuses (`Acme`) is refused by the table's
/// CHECK now; one that predates it is skipped and reported, and every other tenant is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_inserted_tenant_row_is_refused_or_skipped_never_fatal() {
    let (db, store) = pg().await;
    let b = add_tenant(&store, "b").await;
    let insert = "INSERT INTO postbox_tenants (id, schema_name) VALUES ('Acme', 's_acme')";
    let err = sqlx::raw_sql(insert).execute(db.pool()).await.unwrap_err();
    assert!(
        err.to_string().contains("postbox_tenants_id_format"),
        "{err}"
    );
    // A row from before the constraint.
    sqlx::raw_sql("ALTER TABLE postbox_tenants DROP CONSTRAINT postbox_tenants_id_format")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::raw_sql(insert).execute(db.pool()).await.unwrap();
    assert_eq!(store.tenant_list().await.unwrap(), std::slice::from_ref(&b));
    let rejected = store.tenant_rejected().await.unwrap();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].id, "Acme");
    assert!(
        rejected[0].reason.contains("invalid tenant name"),
        "{rejected:?}"
    );
    postbox::migrate(&store)
        .await
        .expect("migrate skips the row");

    let ids = enqueue_for(&db, Some(&b), "E", 5).await;
    let sink = RecordingSink::new();
    let running = Running::start(Relay::new(store, sink.clone(), config()).unwrap());
    wait_until(
        "b's events are published",
        Duration::from_secs(5),
        || async { sink.published_ids().len() == ids.len() },
    )
    .await;
    running.stop().await;
}

/// A tenant schema dropped by hand and a database error on the default schema in the same
/// round do not stop the relay: only a default outbox that is not migrated does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_tenant_schema_and_a_database_blip_do_not_stop_the_relay() {
    let (db, store) = pg().await;
    add_tenant(&store, "gone").await;
    sqlx::raw_sql("DROP SCHEMA s_gone CASCADE")
        .execute(db.pool())
        .await
        .unwrap();
    let faulty = postbox_testkit::FaultyStore::new(own_store(&db, 3).await);
    // The first round: the default schema's claim fails as if the connection dropped, the
    // tenant's with missing tables. Once, that round's last error decided, and the relay quit.
    faulty.fail_next(postbox_testkit::StoreOp::Claim, 1);
    let ids = enqueue(&db, &db.outbox(), crate::common::events("E", 5)).await;
    let sink = RecordingSink::new();
    let running = Running::start(Relay::new(faulty, sink.clone(), config()).unwrap());
    wait_until(
        "the default schema's events are published",
        Duration::from_secs(10),
        || async { sink.published_ids().len() == ids.len() },
    )
    .await;
    running.stop().await;
}

#[tokio::test]
async fn hostile_schema_and_tenant_names_are_refused_and_create_nothing() {
    let (db, store) = pg().await;
    let schemas = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM information_schema.schemata")
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    let before = schemas().await;
    let too_long = "a".repeat(64);
    for bad in [
        "a\"b",
        "a'b",
        "x; DROP SCHEMA public CASCADE",
        "with space",
        "tab\tname",
        "dash-ed",
        "Upper",
        "1st",
        "é",
        "",
        "nul\0byte",
        too_long.as_str(),
        "pg_catalog",
        "pg_toast",
        "information_schema",
    ] {
        let err = SchemaName::new(bad).expect_err(bad);
        assert!(
            matches!(err, Error::InvalidName { kind: "schema", .. }),
            "{bad:?}: {err:?}"
        );
        if !bad.starts_with("pg_") && bad != "information_schema" {
            let err = TenantId::new(bad).expect_err(bad);
            assert!(
                matches!(err, Error::InvalidName { kind: "tenant", .. }),
                "{bad:?}: {err:?}"
            );
        }
    }
    // A tenant id whose default schema `s_<id>` would pass 63 bytes.
    let err = TenantId::new(&"t".repeat(62)).unwrap_err();
    assert!(matches!(err, Error::InvalidName { .. }), "{err:?}");
    // Valid names that would collide are refused too.
    let err = store
        .tenant_add(&postbox::store::TenantAddParams {
            id: &TenantId::new("evil").unwrap(),
            schema: Some(&SchemaName::public()),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TenantExists(_)), "{err:?}");
    assert_eq!(schemas().await, before, "no schema was created");

    add_tenant(&store, "acme").await;
    let err = store
        .tenant_add(&postbox::store::TenantAddParams {
            id: &TenantId::new("acme2").unwrap(),
            schema: Some(&SchemaName::new("s_acme").unwrap()),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TenantExists(_)), "{err:?}");
    let err = store
        .tenant_add(&postbox::store::TenantAddParams {
            id: &TenantId::new("acme").unwrap(),
            schema: Some(&SchemaName::new("s_other").unwrap()),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TenantExists(_)), "{err:?}");
    assert_eq!(schemas().await, before + 1, "only s_acme was created");
    assert_eq!(store.tenant_list().await.unwrap().len(), 1);
}

/// Autovacuum analyzes every outbox table, the default one and each tenant's: migration
/// `0003_no_auto_analyze` turned it off while claims walked the dead rows an ANALYZE's
/// snapshot keeps; since claims take new work from a floor, `0009_ordered_heads` turns
/// it back on (`tests/postbox/floor.rs` drains while ANALYZE runs).
#[tokio::test]
async fn every_outbox_table_is_analyzed_by_autovacuum() {
    let (db, store) = pg().await;
    let a = add_tenant(&store, "a").await;
    for schema in ["public", a.schema.as_str()] {
        let options: Vec<String> = sqlx::query_scalar(
            "SELECT unnest(c.reloptions) FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = 'outbox_events'",
        )
        .bind(schema)
        .fetch_all(db.pool())
        .await
        .unwrap();
        assert!(
            options
                .iter()
                .all(|o| !o.starts_with("autovacuum_analyze_threshold")),
            "{schema}: {options:?}"
        );
    }
}

/// A tenant's table gets the retry index (migration `0008_claim`) in the transaction that adds
/// it, valid and the same as the default table's, so tenants added side by side never wait for
/// each other's concurrent index builds.
#[tokio::test]
async fn a_new_tenant_has_a_valid_retry_index_like_the_default_table() {
    let (db, store) = pg().await;
    let a = add_tenant(&store, "a").await;
    let b = add_tenant(&store, "b").await;
    let mut definitions = Vec::new();
    for schema in ["public", a.schema.as_str(), b.schema.as_str()] {
        let (valid, definition): (bool, String) = sqlx::query_as(
            "SELECT i.indisvalid, replace(pg_get_indexdef(i.indexrelid), n.nspname || '.', '')
             FROM pg_index i
             JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = 'outbox_events_retry_idx'",
        )
        .bind(schema)
        .fetch_one(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{schema} has no retry index: {e}"));
        assert!(valid, "{schema}: the retry index is valid");
        definitions.push(definition);
    }
    assert!(
        definitions.windows(2).all(|w| w[0] == w[1]),
        "one definition everywhere: {definitions:#?}"
    );
}

/// The one resolver of targets and the one status report (`postbox status`, `postbox events
/// --tenant`, the admin API): `default` names the default outbox and cannot be registered; a
/// tenant not in the registry and a name that cannot be one are refused by name; the report
/// lists the default outbox, each tenant with its state and parked aggregates, and the rows of
/// the registry that are not served, with their reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_resolver_and_one_status_report_for_every_view() {
    use postbox::status::{StatusReport, target, targets};
    let (db, store) = pg().await;
    let acme = add_tenant(&store, "acme").await;
    let refused = store
        .tenant_add(&postbox::store::TenantAddParams {
            id: &TenantId::new("default").unwrap(),
            schema: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidName { name, .. } if name == "default"),
        "{refused}"
    );

    let all = targets(&store, None).await.unwrap();
    assert_eq!(
        all.iter().map(|t| t.label()).collect::<Vec<_>>(),
        ["default", "acme"]
    );
    assert_eq!(target(&store, None).await.unwrap(), default_target());
    assert_eq!(
        target(&store, Some("default")).await.unwrap(),
        default_target()
    );
    assert_eq!(target(&store, Some("acme")).await.unwrap(), acme.target());
    assert!(matches!(
        target(&store, Some("nobody")).await,
        Err(Error::UnknownTenant(id)) if id == "nobody"
    ));
    assert!(matches!(
        targets(&store, Some("Not A Name")).await,
        Err(Error::InvalidName { .. })
    ));

    // Acme: an ordered aggregate parked by a FAILED head, and the tenant suspended; a registry
    // row from before the id constraint, not served.
    let ids = enqueue_for(&db, Some(&acme), "E", 3).await;
    sqlx::query(
        "UPDATE s_acme.outbox_events SET aggregate_type = 'Invoice', aggregate_id = '1',
                status = CASE WHEN id = $1 THEN 'FAILED' ELSE 'PENDING' END,
                last_error = CASE WHEN id = $1 THEN 'boom' END",
    )
    .bind(ids[0])
    .execute(db.pool())
    .await
    .unwrap();
    store
        .tenant_set_status(&acme.id, TenantStatus::Suspended)
        .await
        .unwrap();
    sqlx::raw_sql(
        "ALTER TABLE postbox_tenants DROP CONSTRAINT postbox_tenants_id_format;
         INSERT INTO postbox_tenants (id, schema_name) VALUES ('Bad Id', 's_bad')",
    )
    .execute(db.pool())
    .await
    .unwrap();

    // Acme's inbox: a consumer that handled one message and skipped its repeat.
    let inbox = store.inbox("billing").unwrap().tenant(&acme);
    for _ in 0..2 {
        let mut tx = db.pool().begin().await.unwrap();
        let _ = inbox.receive(&mut tx, "m-1").await.unwrap();
        tx.commit().await.unwrap();
    }

    // A report held open elsewhere.
    let mut held = db.pool().begin().await.unwrap();
    sqlx::raw_sql(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_events",
    )
    .execute(&mut *held)
    .await
    .unwrap();
    // The subject: the held transaction has an age the report must show.
    tokio::time::sleep(Duration::from_millis(20)).await;

    let report = StatusReport::read(&store).await.unwrap();
    held.rollback().await.unwrap();
    assert!(!report.all_read(), "the row not served is reported");
    let lines: Vec<_> = report
        .targets
        .iter()
        .map(|t| (t.tenant.as_deref(), t.tenant_status, t.parked_aggregates))
        .collect();
    assert_eq!(
        lines,
        [
            (None, None, 0),
            (Some("acme"), Some(TenantStatus::Suspended), 1),
            (Some("Bad Id"), None, 0),
        ]
    );
    let acme_counts = report.targets[1].counts.as_ref().unwrap();
    assert_eq!((acme_counts.pending, acme_counts.failed), (2, 1));
    let inboxes: Vec<Vec<(&str, i64, i64)>> = report
        .targets
        .iter()
        .map(|t| {
            t.inbox
                .iter()
                .map(|i| (i.consumer.as_str(), i.messages, i.duplicates))
                .collect()
        })
        .collect();
    assert_eq!(
        inboxes,
        [vec![], vec![("billing", 1, 1)], vec![]],
        "acme's inbox, acme's alone"
    );
    assert!(report.targets[2].counts.is_none());
    assert!(
        report.targets[2]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("not served: ")),
        "{:?}",
        report.targets[2]
    );
    assert!(
        report
            .oldest_transaction_age
            .is_some_and(|age| age >= Duration::from_millis(20)),
        "PostgreSQL tells the age of the oldest open transaction: {:?}",
        report.oldest_transaction_age
    );
}
