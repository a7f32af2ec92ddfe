//! A TCP forwarding proxy that a test can switch off, stall and switch on again, to take a
//! broker away from one sink or relay without touching the shared broker.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forward both ways.
    Up,
    /// Drop every connection; accept new ones only to close them at once.
    Down,
    /// Forward client → broker, but throw away everything the broker answers: the broker gets
    /// (and may store) each message, the client never sees an acknowledgement.
    Stall,
}

/// Forwards connections from an ephemeral loopback port to `upstream`.
///
/// The port stays bound in every mode, so nothing else can take it.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Added to every answer's trip back, in microseconds.
    latency: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding to `upstream`, switched on.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound (a test cannot go on without one); see
    /// [`Proxy::try_start`].
    pub async fn start(upstream: SocketAddr) -> Proxy {
        Proxy::try_start(upstream).await.expect("bind proxy")
    }

    /// Starts forwarding to `upstream`, switched on; fails if no loopback port can be bound. For
    /// tools that run outside a test, such as the chaos kit.
    pub async fn try_start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(Mode::Up);
        let latency = Arc::new(AtomicU64::new(0));
        let latency_of_answers = Arc::clone(&latency);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *mode_rx.borrow() == Mode::Down {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(forward(
                    inbound,
                    upstream,
                    mode_rx.clone(),
                    Arc::clone(&latency_of_answers),
                ));
            }
        });
        Ok(Proxy {
            addr,
            mode,
            latency,
            accept,
        })
    }

    /// The proxy's own address, to give the client instead of the broker's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Drops every connection and refuses (accepts and closes) new ones.
    pub fn down(&self) {
        self.mode.send_replace(Mode::Down);
    }

    /// Keeps connections open and forwards requests, but swallows every answer.
    pub fn stall(&self) {
        self.mode.send_replace(Mode::Stall);
    }

    /// Forwards again; connections that were stalled are dropped (their streams lost bytes).
    pub fn up(&self) {
        self.mode.send_replace(Mode::Up);
    }

    /// Delays every answer by `latency` on its way back, as a broker across a network would
    /// (zero at start). Answers keep their order and overlap as they would on a real link.
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency.store(micros, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Down);
        self.accept.abort();
    }
}

async fn forward(
    inbound: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    latency: Arc<AtomicU64>,
) {
    let Ok(outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut client_read, mut client_write) = inbound.into_split();
    let (mut broker_read, mut broker_write) = outbound.into_split();
    let requests = tokio::io::copy(&mut client_read, &mut broker_write);
    let answers_mode = mode.clone();
    // Answers are read as they come and written back once each one's delay has passed, so a
    // latency delays them without slowing the link down.
    let (delayed_tx, mut delayed_rx) =
        mpsc::unbounded_channel::<(Option<tokio::time::Instant>, Vec<u8>)>();
    let read_answers = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match broker_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if *answers_mode.borrow() == Mode::Stall {
                continue;
            }
            let delay = Duration::from_micros(latency.load(Ordering::Relaxed));
            let due = (!delay.is_zero()).then(|| tokio::time::Instant::now() + delay);
            if delayed_tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write_answers = async move {
        while let Some((due, bytes)) = delayed_rx.recv().await {
            if let Some(due) = due {
                // The subject: answers held back by the delay the test set.
                tokio::time::sleep_until(due).await;
            }
            if client_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let answers = async move {
        tokio::join!(read_answers, write_answers);
    };
    let ended = async {
        let mut stalled = false;
        loop {
            match *mode.borrow_and_update() {
                Mode::Down => return,
                Mode::Stall => stalled = true,
                Mode::Up if stalled => return,
                Mode::Up => {}
            }
            if mode.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = answers => {}
        _ = ended => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a port of its own.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let addr = listener.local_addr().expect("echo address");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.into_split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<Duration> {
        let started = tokio::time::Instant::now();
        stream.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).await?;
        assert_eq!(&answer, b"ping");
        Ok(started.elapsed())
    }

    #[tokio::test]
    async fn latency_delays_answers_and_stall_swallows_them() {
        let proxy = Proxy::try_start(echo().await).await.expect("proxy");
        let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
        round_trip(&mut stream).await.expect("forwarded");

        proxy.set_latency(Duration::from_millis(150));
        let slow = round_trip(&mut stream).await.expect("forwarded late");
        assert!(slow >= Duration::from_millis(150), "{slow:?}");

        proxy.set_latency(Duration::ZERO);
        proxy.stall();
        let stalled =
            tokio::time::timeout(Duration::from_millis(300), round_trip(&mut stream)).await;
        assert!(stalled.is_err(), "a stalled proxy answers nothing");

        proxy.up();
        let mut fresh = TcpStream::connect(proxy.addr())
            .await
            .expect("connect again");
        round_trip(&mut fresh).await.expect("forwarded again");
    }
}
