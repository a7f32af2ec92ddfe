//! A progress line on stderr for long commands: a spinner with a running count and rate, drawn
//! only when stderr is a terminal (logs and pipes get the commands' own summary lines).

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A running count of events done.
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// Starts a progress line with `message` before the count.
    pub(crate) fn start(message: String) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg} {human_pos} event(s) ({per_sec}, {elapsed})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// Starts a bar of `total` events (it grows if more come), `message` before it.
    pub(crate) fn bounded(message: String, total: u64) -> Self {
        Self::bounded_of(message, total, "event(s)")
    }

    /// Starts a bar of `total` things named `unit`, `message` before it.
    pub(crate) fn bounded_of(message: String, total: u64, unit: &str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "{{msg}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, eta {{eta}})"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// Sets the count of events done (raising the total if it passed it).
    pub(crate) fn set(&self, done: u64) {
        if self.bar.length().is_some_and(|len| done > len) {
            self.bar.set_length(done);
        }
        self.bar.set_position(done);
    }

    /// Counts `n` more events.
    pub(crate) fn add(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Clears the line (the command prints its own summary).
    pub(crate) fn finish(self) {
        self.bar.finish_and_clear();
    }
}
