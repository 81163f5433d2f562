//! The embedded runtime served in-process, for the simulator (`crate::sim`):
//! the same tonic services as on a unix socket, but on the caller's tokio
//! runtime (no thread of its own) and over in-memory streams
//! (`tokio::io::duplex`) a client's channel dials. Nothing in it reads the
//! OS clock or waits on the OS: on a paused, single-threaded runtime every
//! call — HTTP/2, the services, the simulated pull times — happens in an
//! order the runtime alone decides, the same on every run.
//!
//! [`InProcessRuntime::stop`] is a killed runtime: every open connection
//! fails at once (the client sees its calls end `Unavailable`, the services'
//! calls in flight are dropped) and new ones are refused until
//! [`resume`](InProcessRuntime::resume). The state is kept, as with
//! [`EmbeddedRuntime::stop`].

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::EmbeddedRuntime;
use super::server::{CriService, DownloadsClock, Shared};
use crate::cri::{CriClient, CriEndpoint};

/// Bytes each direction of an in-memory connection buffers.
const PIPE_BYTES: usize = 256 * 1024;

/// The endpoint an in-process runtime's clients name in logs.
pub const IN_PROCESS_ENDPOINT: &str = "/in-process/embedded-cri.sock";

/// One serving of the runtime: connections are handed to its server task;
/// stopping kills every one of them.
struct Serving {
    connections: mpsc::UnboundedSender<KillableIo>,
    server: JoinHandle<()>,
    kill: Arc<KillSwitch>,
}

/// The embedded runtime served on the current tokio runtime over in-memory
/// connections. Clones share it.
#[derive(Clone)]
pub struct InProcessRuntime {
    shared: Arc<Shared>,
    serving: Arc<Mutex<Option<Serving>>>,
}

impl std::fmt::Debug for InProcessRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessRuntime").field("serving", &self.is_serving()).finish_non_exhaustive()
    }
}

impl InProcessRuntime {
    /// An empty runtime serving on the current tokio runtime; its simulated
    /// pull times are tokio sleeps (paused time drives them). Must be called
    /// within a tokio runtime.
    pub fn start() -> Self {
        Self::start_at(std::time::SystemTime::now())
    }

    /// [`start`](Self::start), its downloads stamped on tokio's time from
    /// `base` (the simulator's epoch: its runs do not read the system's
    /// time).
    pub fn start_at(base: std::time::SystemTime) -> Self {
        let shared = Shared { clock: DownloadsClock(crate::clock::Clock::starting_at(base)), ..Shared::default() };
        shared.tokio_time.store(true, Ordering::Relaxed);
        let rt = Self { shared: Arc::new(shared), serving: Arc::default() };
        rt.resume();
        rt
    }

    fn serving(&self) -> MutexGuard<'_, Option<Serving>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether it serves (new connections are accepted).
    pub fn is_serving(&self) -> bool {
        self.serving().is_some()
    }

    /// Serves again after [`stop`](Self::stop), with the same state.
    pub fn resume(&self) {
        let mut serving = self.serving();
        if serving.is_some() {
            return;
        }
        *serving = Some(Serving::start(super::router(CriService::new(self.shared.clone()))));
    }

    /// Stops at once, like a killed runtime: every connection fails, calls
    /// in flight end, new connections are refused. The state stays.
    pub fn stop(&self) {
        if let Some(s) = self.serving().take() {
            s.stop();
        }
    }

    /// A connection to the runtime, or `ConnectionRefused` while stopped.
    fn connect(&self) -> io::Result<DuplexStream> {
        connect(&self.serving)
    }

    /// A CRI client of this runtime: its channel dials a new in-memory
    /// connection whenever it (re)connects.
    pub fn client(&self, connect_timeout: Duration) -> CriClient {
        let rt = self.clone();
        let channel = tonic::transport::Endpoint::from_static("http://in-process.embedded")
            .connect_timeout(connect_timeout)
            .http2_reset_stream_duration(KEEP_RESET_STREAMS)
            .connect_with_connector_lazy(tower::service_fn(move |_| {
                let conn = rt.connect();
                async move { conn.map(TokioIo::new) }
            }));
        CriClient::over_channel(CriEndpoint::Unix(IN_PROCESS_ENDPOINT.into()), channel)
    }

    /// The embedder's handle on the state (catalogue, images, containers,
    /// capacity, faults, counters): an [`EmbeddedRuntime`] that serves
    /// nothing itself and stops nothing when dropped.
    pub fn handle(&self) -> EmbeddedRuntime {
        EmbeddedRuntime::detached(self.shared.clone())
    }

    /// Tells `observer` what the runtime does (pulls beginning and ending,
    /// removals), as it does it; `None` stops telling.
    pub fn set_observer(&self, observer: Option<super::Observer>) {
        *self.shared.observer.lock().unwrap_or_else(PoisonError::into_inner) = observer;
    }
}

impl Serving {
    /// Serves `router` on a task of the current runtime, over the
    /// connections handed to it.
    fn start(router: tonic::transport::server::Router) -> Self {
        let (tx, rx) = mpsc::unbounded_channel::<KillableIo>();
        let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::UnboundedReceiverStream::new(rx), |io| {
            Ok::<_, io::Error>(io)
        });
        let server = router.serve_with_incoming(incoming);
        let server = tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "in-process server failed");
            }
        });
        Serving { connections: tx, server, kill: Arc::default() }
    }

    /// Stops at once: every connection fails.
    fn stop(self) {
        self.server.abort();
        self.kill.kill();
    }
}

/// A new connection to what `serving` serves, or `ConnectionRefused`.
fn connect(serving: &Mutex<Option<Serving>>) -> io::Result<DuplexStream> {
    let serving = serving.lock().unwrap_or_else(PoisonError::into_inner);
    let refused = || io::Error::new(io::ErrorKind::ConnectionRefused, "nothing serves the in-process socket");
    let Some(s) = serving.as_ref() else { return Err(refused()) };
    let (client, server) = tokio::io::duplex(PIPE_BYTES);
    s.connections.send(KillableIo::new(server, &s.kill)).map_err(|_| refused())?;
    Ok(client)
}

/// An in-memory socket any tonic server can be bound to, in turn, and its
/// clients dial (the simulator's CRI front: each imaged process serves it
/// while it lives, the kubelet's channel keeps dialling it). Closing it is
/// a killed server's socket: every connection fails at once and new ones
/// are refused until the next bind. Clones share it.
#[derive(Clone, Default)]
pub struct InProcessSocket {
    serving: Arc<Mutex<Option<Serving>>>,
}

impl std::fmt::Debug for InProcessSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = self.serving.lock().unwrap_or_else(PoisonError::into_inner).is_some();
        f.debug_struct("InProcessSocket").field("bound", &bound).finish()
    }
}

impl InProcessSocket {
    /// Serves `router` on it (closing what served it before). Must be
    /// called within a tokio runtime.
    pub fn bind(&self, router: tonic::transport::server::Router) {
        let old = self.serving.lock().unwrap_or_else(PoisonError::into_inner).replace(Serving::start(router));
        if let Some(old) = old {
            old.stop();
        }
    }

    /// Stops serving at once: every connection fails.
    pub fn close(&self) {
        let old = self.serving.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(old) = old {
            old.stop();
        }
    }

    /// A channel that dials a new connection whenever it (re)connects.
    pub fn channel(&self, connect_timeout: Duration) -> tonic::transport::Channel {
        let socket = self.clone();
        tonic::transport::Endpoint::from_static("http://in-process.socket")
            .connect_timeout(connect_timeout)
            .http2_reset_stream_duration(KEEP_RESET_STREAMS)
            .connect_with_connector_lazy(tower::service_fn(move |_| {
                let conn = connect(&socket.serving);
                async move { conn.map(TokioIo::new) }
            }))
    }
}

/// How long a client keeps a stream it reset (a cancelled call). h2
/// forgets such streams after this much *real* time (`std::time::Instant`),
/// and forgetting one reorders its stream store, which is the order a
/// connection error wakes the calls still open. Under paused tokio time
/// (the simulator) that made the order of Failed events at a runtime kill
/// depend on how loaded the machine was. A day keeps them until the count
/// limit (`max_concurrent_reset_streams`, counted, so deterministic) or the
/// connection's end evicts them; a reset stream costs a few hundred bytes.
const KEEP_RESET_STREAMS: Duration = Duration::from_secs(86_400);

/// Kills every connection of one serving.
#[derive(Default)]
struct KillSwitch {
    killed: AtomicBool,
    /// The connections' kill flags, to fail and wake each.
    connections: Mutex<Vec<Arc<Kill>>>,
}

impl KillSwitch {
    fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        let connections = std::mem::take(&mut *self.connections.lock().unwrap_or_else(PoisonError::into_inner));
        for c in connections {
            c.kill();
        }
    }
}

/// One connection's kill flag and the tasks waiting on it.
#[derive(Default)]
struct Kill {
    killed: AtomicBool,
    read: Mutex<Option<Waker>>,
    write: Mutex<Option<Waker>>,
}

impl Kill {
    fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        for slot in [&self.read, &self.write] {
            if let Some(w) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                w.wake();
            }
        }
    }

    /// Registers `cx` to be woken by a kill; whether killed already.
    fn check(&self, slot: &Mutex<Option<Waker>>, cx: &Context<'_>) -> bool {
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        self.killed.load(Ordering::Acquire)
    }
}

/// The server's end of an in-memory connection, failing once killed.
struct KillableIo {
    io: DuplexStream,
    kill: Arc<Kill>,
}

impl KillableIo {
    fn new(io: DuplexStream, switch: &KillSwitch) -> Self {
        let kill = Arc::new(Kill::default());
        if switch.killed.load(Ordering::Acquire) {
            kill.kill();
        }
        switch.connections.lock().unwrap_or_else(PoisonError::into_inner).push(kill.clone());
        Self { io, kill }
    }
}

fn reset() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "the embedded runtime was stopped")
}

impl AsyncRead for KillableIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.kill.check(&self.kill.read, cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.kill.check(&self.kill.write, cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.kill.check(&self.kill.write, cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for KillableIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}
