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
    C: postbox::OutboxConnection + ?Sized,
{
    let received = inbox.receive(conn, message_id).await?;
    if received.is_new() {
        let effect = Event::new("Handled", &serde_json::json!({ "message": message_id }))?;
        outbox.enqueue(conn, effect).await?;
    }
    Ok(received)
}
