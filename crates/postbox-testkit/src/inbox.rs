//! A consumer's handling of a message, as the store suite and the consumer tests do it.

use postbox::inbox::{Inbox, Received};
use postbox::{Event, Outbox};

/// What a consumer does with a message, through `conn` (its transaction): records it in
/// `inbox`, and when it is new, applies its effect, here an event `Handled` written with
/// `outbox` (so effects are counted as rows of `outbox_events`).
pub async fn handle_message<C>(
    conn: &mut C,
    inbox: &Inbox,
    outbox: &Outbox,
    message_id: &str,
) -> postbox::Result<Received>
where
    C: postbox::outbox::OutboxConnection + ?Sized,
{
    let received = inbox.receive(conn, message_id).await?;
    if received.is_new() {
        let effect = Event::new("Handled", &serde_json::json!({ "message": message_id }))?;
        outbox.enqueue(conn, effect).await?;
    }
    Ok(received)
}

/// [`handle_message`] in a transaction of its own on `pool`, then a commit, or a rollback
/// without `commit`: what every store harness's `inbox_handle` does.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) async fn handle_in_transaction<DB>(
    pool: &sqlx::Pool<DB>,
    inbox: &Inbox,
    outbox: &Outbox,
    message_id: &str,
    commit: bool,
) -> postbox::Result<Received>
where
    DB: sqlx::Database,
    sqlx::Transaction<'static, DB>: postbox::outbox::OutboxConnection,
{
    let (received, tx) = handle_in_open_transaction(pool, inbox, outbox, message_id).await?;
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(received)
}

/// [`handle_message`] in a transaction of its own on `pool`, left open.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) async fn handle_in_open_transaction<DB>(
    pool: &sqlx::Pool<DB>,
    inbox: &Inbox,
    outbox: &Outbox,
    message_id: &str,
) -> postbox::Result<(Received, sqlx::Transaction<'static, DB>)>
where
    DB: sqlx::Database,
    sqlx::Transaction<'static, DB>: postbox::outbox::OutboxConnection,
{
    let mut tx = pool.begin().await?;
    let received = handle_message(&mut tx, inbox, outbox, message_id).await?;
    Ok((received, tx))
}
