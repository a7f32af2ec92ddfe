//! How an event becomes a message: the metadata every message carries and its names
//! (`headers`), and the CloudEvents 1.0 encoding of `format = "cloudevents"` (`cloudevents`).
//! The crate root re-exports both modules.

pub mod cloudevents;
pub mod headers;
