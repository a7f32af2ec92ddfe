//! The case of the tenant registry: a store serves tenants (PostgreSQL, a schema each) or says
//! plainly that it does not.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test suite fails loudly on the first unexpected error"
)]

use postbox::store::TenantAddParams;
use postbox::{Error, SchemaName, schema::TenantId, store::TenantStatus};

use super::StoreHarness;
use super::helpers::ready;

/// A conformance case: a store without tenants answers [`Error::Unsupported`] to listing,
/// adding and suspending them (and has no rejected registry rows); a store with tenants lists
/// none at first, adds one with its own migrated schema (`s_<tenant>` unless named), refuses it
/// twice, suspends and resumes it, and refuses a tenant it does not know.
pub async fn tenants_are_served_or_plainly_unsupported<B: StoreHarness>() {
    let b = ready::<B>().await;
    let store = b.store();
    let acme = TenantId::new("acme").unwrap();
    let unsupported = |what: &str, err: Error| {
        assert!(matches!(err, Error::Unsupported(_)), "{what}: {err:?}");
    };
    let listed = match store.tenant_list().await {
        Err(err) => {
            unsupported("list", err);
            unsupported(
                "add",
                store
                    .tenant_add(&TenantAddParams::new(&acme))
                    .await
                    .unwrap_err(),
            );
            unsupported(
                "suspend",
                store
                    .tenant_set_status(&acme, TenantStatus::Suspended)
                    .await
                    .unwrap_err(),
            );
            match store.tenant_rejected().await {
                Ok(rejected) => assert!(rejected.is_empty(), "{rejected:?}"),
                Err(err) => unsupported("rejected", err),
            }
            return;
        }
        Ok(listed) => listed,
    };
    assert!(listed.is_empty(), "{listed:?}");

    let added = store
        .tenant_add(&TenantAddParams::new(&acme))
        .await
        .unwrap();
    assert_eq!(added.id, acme);
    assert_eq!(added.schema, acme.default_schema());
    assert_eq!(added.status, TenantStatus::Active);
    let err = store
        .tenant_add(&TenantAddParams::new(&acme))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TenantExists(_)), "{err:?}");

    let globex = TenantId::new("globex").unwrap();
    let schema = SchemaName::new("globex_events").unwrap();
    let named = store
        .tenant_add(&TenantAddParams {
            id: &globex,
            schema: Some(&schema),
        })
        .await
        .unwrap();
    assert_eq!(named.schema, schema);
    for tenant in [&added, &named] {
        let counts = store.status_counts(&tenant.target()).await.unwrap();
        assert_eq!(counts.pending, 0, "{}'s outbox is migrated", tenant.id);
    }

    let suspended = store
        .tenant_set_status(&acme, TenantStatus::Suspended)
        .await
        .unwrap();
    assert_eq!(suspended.status, TenantStatus::Suspended);
    let mut listed = store.tenant_list().await.unwrap();
    listed.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    assert_eq!(listed, [suspended, named]);
    let resumed = store
        .tenant_set_status(&acme, TenantStatus::Active)
        .await
        .unwrap();
    assert_eq!(resumed.status, TenantStatus::Active);

    let nobody = TenantId::new("nobody").unwrap();
    let err = store
        .tenant_set_status(&nobody, TenantStatus::Suspended)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnknownTenant(_)), "{err:?}");
    assert!(store.tenant_rejected().await.unwrap().is_empty());
}
