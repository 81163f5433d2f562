//! The embedded CRI runtime: an in-memory ImageService and RuntimeService
//! served by tonic on a unix socket, behaving like containerd's CRI plugin
//! where a caller can tell. It is imaged's default runtime (README, demos)
//! and the runtime of most tests.
//!
//! It holds a catalogue of remote images (name → digest, size, pull latency,
//! required credentials), the pulled images, containers and sandboxes that
//! tests set, and a simulated image filesystem (capacity; used = sum of image
//! sizes). An RPC-level [`FaultPlan`] makes any call fail, stall or lose its
//! reply on the wire.
//!
//! The server runs on a thread of its own, so it never competes with the
//! caller's actix arbiter. [`EmbeddedRuntime::stop`] drops every connection
//! at once, like a killed runtime; [`EmbeddedRuntime::resume`] serves the
//! same state again on the same socket.
//!
//! With a state directory ([`EmbeddedRuntime::start_persistent`]) the local
//! images, containers and sandboxes survive a restart of the process; see
//! `persist.rs` for the files and what they guarantee.

mod catalogue;
mod clock;
mod in_process;
mod persist;
mod reference;
mod server;
mod state;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

pub use catalogue::{RemoteImage, demo_catalogue};
pub use in_process::{IN_PROCESS_ENDPOINT, InProcessRuntime, InProcessSocket};
pub use persist::{LOCK_FILE, STATE_FILE, SaveError};
pub use server::{PULL_LOG_MAX, RuntimeStats};
pub use state::IMAGE_FS_MOUNTPOINT;

use crate::cri::proto::image_service_server::ImageServiceServer;
use crate::cri::proto::runtime_service_server::RuntimeServiceServer;
use crate::cri::{CriEndpoint, CriError};
use crate::domain::{Container, Image, PodSandbox};
use crate::fault::FaultPlan;
use server::{CriService, Shared};

/// `runtime_name` the embedded runtime reports in `Version`.
pub const RUNTIME_NAME: &str = "imaged-embedded";

/// Largest message the embedded runtime accepts or sends.
const MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// The runtime's services on one server, on a socket or in process
/// alike: bounded streams and window (a burst cannot close the
/// connection) and the message limit.
fn router(service: CriService) -> tonic::transport::server::Router {
    crate::cri::transport::server()
        .add_service(
            ImageServiceServer::new(service.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
        .add_service(
            RuntimeServiceServer::new(service.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
        // containerd's content service, as the embedded runtime plays it:
        // its pulls in their simulated time, as downloads.
        .add_service(crate::cri::proto::content::content_server::ContentServer::new(service))
}

/// Why the embedded runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The socket could not be bound.
    #[error("embedded runtime: cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The server thread could not be started or died while starting.
    #[error("embedded runtime: server thread failed: {0}")]
    Thread(String),
    /// The state directory cannot be used (the reason says why and what to do).
    #[error("embedded runtime: state directory {path} {reason}")]
    StateDir {
        /// The directory.
        path: String,
        /// Why not.
        reason: String,
    },
}

/// What the runtime does, told to an [`Observer`] as it happens (the
/// simulator's invariants watch the runtime's side of every call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// A `PullImage` arrived (before any fault): the image as asked, its
    /// runtime handler, and its credentials' identity
    /// ([`AuthConfig::identity`](crate::domain::AuthConfig::identity)).
    PullStarted {
        /// Numbers the pull for its `PullEnded`.
        call: u64,
        /// The image as the call names it.
        image: String,
        /// The call's runtime handler.
        runtime_handler: String,
        /// The credentials' identity, `None` when anonymous.
        auth: Option<String>,
    },
    /// That pull ended: with the image id once the image is in place, or
    /// without (it failed, or its call was dropped).
    PullEnded {
        /// The `PullStarted` call.
        call: u64,
        /// The image pulled, `None` when it did not finish.
        image_id: Option<String>,
    },
    /// That pull began to download (its registry answered): stalling this
    /// far into it, and then still writing `drips` bytes a second, when
    /// its registry stalls ([`RemoteImage::stalling`]).
    Downloading {
        /// The `PullStarted` call.
        call: u64,
        /// When its download stops moving, if it does.
        stalls_after: Option<std::time::Duration>,
        /// Bytes a second it writes once stalled.
        drips: u64,
        /// Its size in bytes.
        size: u64,
        /// Its pull time: it writes in proportion until it stalls.
        takes: std::time::Duration,
    },
    /// A `RemoveImage` is about to remove this image.
    Removing {
        /// Image id.
        id: String,
        /// Its tags and digests.
        names: Vec<String>,
        /// The runtime's pinned flag.
        pinned: bool,
        /// Containers (any state) whose image it is.
        used_by: Vec<String>,
    },
}

/// Receives [`Observed`]s, on the thread serving the call, at times with
/// the runtime's state locked: it must not call the runtime.
#[derive(Clone)]
pub struct Observer(Arc<dyn Fn(&Observed) + Send + Sync>);

impl Observer {
    /// An observer calling `f`.
    pub fn new(f: impl Fn(&Observed) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    fn tell(&self, what: &Observed) {
        (self.0)(what);
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

struct ServerThread {
    stop: oneshot::Sender<()>,
    join: JoinHandle<()>,
}

/// A running (or stopped) embedded runtime and the embedder's handle to it.
/// Dropping it stops the server and removes the socket.
pub struct EmbeddedRuntime {
    shared: Arc<Shared>,
    socket: PathBuf,
    server: Option<ServerThread>,
}

impl std::fmt::Debug for EmbeddedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedRuntime")
            .field("socket", &self.socket)
            .field("serving", &self.server.is_some())
            .finish_non_exhaustive()
    }
}

impl EmbeddedRuntime {
    /// Starts serving on `socket` (a stale socket file there is replaced).
    pub fn start(socket: impl Into<PathBuf>) -> Result<Self, EmbeddedError> {
        let mut rt = Self { shared: Arc::new(Shared::default()), socket: socket.into(), server: None };
        rt.resume()?;
        Ok(rt)
    }

    /// A handle on `shared` that serves nothing and stops nothing (an
    /// [`InProcessRuntime`]'s).
    fn detached(shared: Arc<Shared>) -> Self {
        Self { shared, socket: PathBuf::new(), server: None }
    }

    /// Starts serving on `socket` with its state kept in `state_dir`
    /// (created, mode 0700, if missing): the images, containers and
    /// sandboxes a previous runtime left there are loaded, and every change
    /// is written there before it is answered (see the module docs). The
    /// catalogue and the capacity are not kept: set them again.
    ///
    /// # Errors
    ///
    /// [`EmbeddedError::StateDir`] when the directory cannot be used (not a
    /// directory, group- or world-writable, not writable, used by another
    /// runtime, or a state file that does not read), and the errors of
    /// [`start`](Self::start).
    pub fn start_persistent(socket: impl Into<PathBuf>, state_dir: &Path) -> Result<Self, EmbeddedError> {
        let (dir, loaded) = persist::StateDir::open(state_dir)?;
        let state = state::State {
            images: loaded.images.into_iter().map(|i| (i.id.clone(), i)).collect(),
            containers: loaded.containers,
            sandboxes: loaded.sandboxes,
            ..state::State::default()
        };
        tracing::info!(
            dir = %state_dir.display(),
            images = state.images.len(),
            containers = state.containers.len(),
            "embedded runtime: state loaded"
        );
        let shared = Shared { state: std::sync::Mutex::new(state), state_dir: Some(dir), ..Shared::default() };
        let mut rt = Self { shared: Arc::new(shared), socket: socket.into(), server: None };
        rt.resume()?;
        Ok(rt)
    }

    /// The state directory, when it has one.
    pub fn state_dir(&self) -> Option<&Path> {
        self.shared.state_dir.as_ref().map(persist::StateDir::dir)
    }

    /// Writes the state to its state directory now, if it is behind
    /// (changes made through this handle are written as they are made; a
    /// failed write is retried here).
    pub fn save(&self) -> Result<(), SaveError> {
        self.shared.save()
    }

    /// Writes a change made through this handle, logging a failure (the
    /// next write that succeeds stores it).
    fn saved(&self) {
        if let Err(e) = self.shared.save() {
            tracing::error!(error = %e, "embedded runtime: a change is not on disk yet");
        }
    }

    /// Starts serving on `<dir>/embedded-cri.sock`.
    pub fn start_in(dir: &Path) -> Result<Self, EmbeddedError> {
        Self::start(dir.join("embedded-cri.sock"))
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The endpoint to give a CRI client (`unix://<socket>`).
    pub fn endpoint(&self) -> CriEndpoint {
        CriEndpoint::Unix(self.socket.clone())
    }

    /// Whether it is serving.
    pub fn is_serving(&self) -> bool {
        self.server.is_some()
    }

    /// Serves again (after [`stop`](Self::stop)) with the same state.
    pub fn resume(&mut self) -> Result<(), EmbeddedError> {
        if self.server.is_some() {
            return Ok(());
        }
        let bind_err = |source| EmbeddedError::Bind { path: self.socket.display().to_string(), source };
        if self.socket.exists() {
            std::fs::remove_file(&self.socket).map_err(bind_err)?;
        }
        // Bind here so the socket exists when this returns; serve on a thread.
        let std_listener = std::os::unix::net::UnixListener::bind(&self.socket).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let service = CriService::new(self.shared.clone());
        let join = std::thread::Builder::new()
            .name("imaged-embedded-cri".into())
            .spawn(move || serve(std_listener, service, stop_rx))
            .map_err(|e| EmbeddedError::Thread(e.to_string()))?;
        self.server = Some(ServerThread { stop: stop_tx, join });
        Ok(())
    }

    /// Stops serving at once: open connections are dropped and the socket is
    /// removed, as when a runtime is killed. State is kept for [`resume`](Self::resume).
    pub fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.stop.send(());
            let _ = s.join.join();
        }
        if !self.socket.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.socket);
        }
    }

    /// Adds a remote image the runtime can pull (its name is normalised).
    pub fn add_remote(&self, image: RemoteImage) -> Result<(), CriError> {
        self.shared.state().add_remote(image)
    }

    /// Adds a remote image and makes it present locally at once, as if pulled.
    pub fn preload(&self, image: RemoteImage) -> Result<String, CriError> {
        let mut st = self.shared.state();
        st.add_remote(image.clone())?;
        let spec = crate::domain::ImageSpec::new(image.name.clone());
        let planned = st.plan_pull(&spec, None).or_else(|e| {
            // A private image is preloaded as if pulled with its own credentials.
            match &image.credentials {
                Some((u, p)) => st.plan_pull(&spec, Some(&crate::domain::AuthConfig::basic("", u.clone(), p.clone()))),
                None => Err(e),
            }
        })?;
        let id = st.finish_pull(&planned, &spec);
        drop(st);
        self.shared.save().map_err(|e| CriError::from_status(crate::cri::StatusCode::Internal, e.to_string()))?;
        Ok(id)
    }

    /// Marks a local image pinned (or not). Returns false if it is absent.
    pub fn set_pinned(&self, image: &str, pinned: bool) -> bool {
        let mut st = self.shared.state();
        let Some(id) = st.resolve(image).map(|i| i.id.clone()) else { return false };
        if let Some(img) = st.images.get_mut(&id)
            && img.pinned != pinned
        {
            img.pinned = pinned;
            st.touch();
        }
        drop(st);
        self.saved();
        true
    }

    /// Adds a container (marks its image in use for GC).
    pub fn add_container(&self, c: Container) {
        {
            let mut st = self.shared.state();
            st.containers.push(c);
            st.touch();
        }
        self.saved();
    }

    /// The containers (any state).
    pub fn containers(&self) -> Vec<Container> {
        self.shared.state().containers.clone()
    }

    /// Removes a container by id.
    pub fn remove_container(&self, id: &str) {
        {
            let mut st = self.shared.state();
            st.containers.retain(|c| c.id != id);
            st.touch();
        }
        self.saved();
    }

    /// Adds a pod sandbox.
    pub fn add_sandbox(&self, s: PodSandbox) {
        {
            let mut st = self.shared.state();
            st.sandboxes.push(s);
            st.touch();
        }
        self.saved();
    }

    /// Removes a pod sandbox by id.
    pub fn remove_sandbox(&self, id: &str) {
        self.shared.state().sandboxes.retain(|s| s.id != id);
    }

    /// Sets the simulated image filesystem's capacity in bytes.
    pub fn set_capacity(&self, bytes: u64) {
        self.shared.state().capacity_bytes = bytes;
    }

    /// The clock its downloads' times are on (the system's, or tokio's for
    /// an [`InProcessRuntime`]): what a stall check compares them with.
    pub fn downloads_clock(&self) -> crate::clock::Clock {
        self.shared.clock.0.clone()
    }

    /// The simulated filesystem's capacity, as a GC capacity source.
    pub fn capacity_source(&self) -> crate::gc::capacity::CapacitySource {
        let shared = self.shared.clone();
        crate::gc::capacity::CapacitySource::Simulated(std::sync::Arc::new(move || shared.state().capacity_bytes))
    }

    /// Capacity of the simulated image filesystem in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.shared.state().capacity_bytes
    }

    /// Bytes used on the simulated image filesystem (sum of image sizes).
    pub fn used_bytes(&self) -> u64 {
        self.shared.state().used_bytes()
    }

    /// The local images.
    pub fn images(&self) -> Vec<Image> {
        self.shared.state().images.values().cloned().collect()
    }

    /// Replaces the RPC-level fault plan (empty = none).
    pub fn set_fault_plan(&self, plan: FaultPlan) {
        *self.shared.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = plan;
    }

    /// Serve `StreamImages` (the default) or answer it `Unimplemented`, as
    /// a runtime without KEP-5825 does (to test a client's fallback).
    pub fn set_stream_images(&self, serve: bool) {
        self.shared.stream_images_off.store(!serve, std::sync::atomic::Ordering::Relaxed);
    }

    /// `StreamImages` calls received so far (served or refused).
    pub fn stream_images_calls(&self) -> u64 {
        self.shared.stream_calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What reached the runtime so far.
    pub fn stats(&self) -> RuntimeStats {
        self.shared.counters.snapshot()
    }

    /// Zeroes the counters and clears the pull log.
    pub fn reset_stats(&self) {
        self.shared.counters.reset();
        self.shared.pull_log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }

    /// The images of the PullImage calls received, in arrival order: every
    /// one since the last [`reset_stats`](Self::reset_stats), up to
    /// [`PULL_LOG_MAX`] (beyond it, the older half is dropped).
    pub fn pull_log(&self) -> Vec<String> {
        self.shared.pull_log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl Drop for EmbeddedRuntime {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: std::os::unix::net::UnixListener, service: CriService, stop: oneshot::Receiver<()>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "embedded runtime: cannot build its tokio runtime");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "embedded runtime: cannot use its socket");
                return;
            }
        };
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let server = router(service).serve_with_incoming(incoming);
        tokio::select! {
            // Biased: no random branch order in a module the simulator runs
            // (actors.md, "Determinism"); either branch ends the serving.
            biased;
            _ = stop => {}
            r = server => if let Err(e) = r { tracing::error!(error = %e, "embedded runtime: server failed") },
        }
    });
    // Dropping the runtime cancels every connection task: an abrupt stop.
    rt.shutdown_background();
}
