//! The demo's consumers: a flaky notification handler (by event type) and an audit handler
//! (catch-all), both narrating what they see.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use postbox::{OutboxEvent, handlers::Handlers};

use super::invoices::InvoiceCreated;

/// How the notification handler treats one invoice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mailer {
    /// Mailed at the first try.
    Works,
    /// The mail server is busy for this many tries, then the mail goes out.
    BusyFor(u32),
    /// The mailbox does not exist: every try fails.
    Bounces,
}

/// What the handlers saw, for the tally.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Notification tries per invoice.
    pub(super) tries: HashMap<String, u32>,
    /// Invoices whose customer was notified.
    pub(super) notified: BTreeSet<String>,
    /// Aggregate ids of every event the audit handler saw (on any try).
    pub(super) audited: BTreeSet<String>,
    /// Failed notification tries.
    pub(super) failed_tries: u32,
}

/// The shared record of what the handlers saw.
pub(super) type SeenLog = Arc<Mutex<Seen>>;

/// Locks the record, even after a handler panicked holding it.
fn lock(seen: &SeenLog) -> std::sync::MutexGuard<'_, Seen> {
    // A handler that panicked mid-update leaves counts that are still usable.
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The demo's handlers. `mailer` says how each invoice's notification goes; `max_retries` is
/// only used to narrate the last try.
pub(super) fn handlers(
    mailer: HashMap<String, Mailer>,
    max_retries: u32,
    seen: SeenLog,
) -> Handlers {
    let mailer = Arc::new(mailer);
    let for_notify = Arc::clone(&seen);
    Handlers::new()
        .on(move |invoice: InvoiceCreated| {
            let seen = Arc::clone(&for_notify);
            let mailer = Arc::clone(&mailer);
            async move { notify(&invoice, &mailer, max_retries, &seen) }
        })
        .on_any(move |event: Arc<OutboxEvent>| {
            let seen = Arc::clone(&seen);
            async move {
                audit(&event, &seen);
                Ok::<_, std::io::Error>(())
            }
        })
}

/// Sends (pretends to send) the invoice mail.
fn notify(
    invoice: &InvoiceCreated,
    mailer: &HashMap<String, Mailer>,
    max_retries: u32,
    seen: &SeenLog,
) -> Result<(), std::io::Error> {
    let number = &invoice.number;
    let try_no = {
        let mut s = lock(seen);
        let n = s.tries.entry(number.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let error = match mailer.get(number).copied().unwrap_or(Mailer::Works) {
        Mailer::BusyFor(n) if try_no <= n => Some("mail server busy (421)".to_owned()),
        Mailer::Bounces => Some(format!(
            "mailbox of {} does not exist (550)",
            invoice.customer
        )),
        _ => None,
    };
    match error {
        None => {
            lock(seen).notified.insert(number.clone());
            println!(
                "  ✉  {number}  {} notified (try {try_no})",
                invoice.customer
            );
            Ok(())
        }
        Some(error) => {
            lock(seen).failed_tries += 1;
            let next = if try_no >= max_retries {
                "out of tries: the event goes FAILED".to_owned()
            } else {
                "the relay retries after a backoff".to_owned()
            };
            println!(
                "  ↻  {number}  notification failed (try {try_no} of {max_retries}): {error}; {next}"
            );
            Err(std::io::Error::other(error))
        }
    }
}

/// Records every event, first sighting narrated.
fn audit(event: &OutboxEvent, seen: &SeenLog) {
    let key = event.aggregate_id.clone().unwrap_or_default();
    if lock(seen).audited.insert(key) {
        println!(
            "  ☰  audit: event #{} {} {}/{}",
            event.id,
            event.event_type,
            event.aggregate_type.as_deref().unwrap_or("-"),
            event.aggregate_id.as_deref().unwrap_or("-")
        );
    }
}
