//! Waiting on conditions instead of sleeping.

/// Waits until `check` returns true, polling every few milliseconds; panics with `what` if it has
/// not happened within `timeout`. Tests wait on conditions with it instead of sleeping blindly.
pub async fn wait_until<F, Fut>(what: &str, timeout: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
