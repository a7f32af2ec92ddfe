//! The admin routes without a port, a relay or PostgreSQL: `Admin::builder(..).into_router()`
//! over an SQLite outbox, called with `tower::ServiceExt::oneshot`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use postbox::StoreExt;
use postbox::{Event, SqliteStore, Store};
use postbox_admin::{Admin, Token};
use tower::ServiceExt;

const TOKEN: &str = "0123456789abcdef-router-token";

async fn call(app: &axum::Router, path: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn the_routes_answer_without_a_port_and_keep_their_token_rules() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("outbox.db"))
        .await
        .unwrap();
    postbox::migrate(&store).await.unwrap();
    let outbox = store.outbox();
    let mut tx = store.pool().begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            Event::new("OrderPlaced", &serde_json::json!({"id": 7})).unwrap(),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let app = Admin::builder(store)
        .token(Token::new(TOKEN).unwrap())
        .into_router();

    assert_eq!(call(&app, "/healthz", None).await.0, StatusCode::OK);
    for path in ["/api/status", "/api/events", "/no/such/path"] {
        let (status, _) = call(&app, path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} without the token");
        let (status, _) = call(&app, path, Some("0123456789abcdef-wrong-token")).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{path} with a wrong token"
        );
    }
    let (status, body) = call(&app, "/api/status", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["targets"][0]["tenant"], "default");
    assert_eq!(report["targets"][0]["pending"], 1, "{report}");
    let (status, body) = call(&app, "/api/events?status=PENDING", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("OrderPlaced"), "{body}");
    let (status, _) = call(&app, "/no/such/path", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
