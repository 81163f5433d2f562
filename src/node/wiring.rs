//! The one place a node is wired: configuration in, every actor spawned,
//! in the order they depend on each other. Read top to bottom, [`start`] is
//! the architecture (`actors.md`, "Start order"): the runtime and its
//! gateway were connected by [`crate::connect`]; then the fault plan, the
//! durable state, the pull side (queue, back-off registry, the ensure
//! handle over their ports) and the GC side (detector, executor, cache
//! refresher). No actor starts another.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use actix::prelude::*;

use super::Node;
use crate::actors::backoff_registry::BackoffRegistryActor;
use crate::actors::cache_refresher::{CacheRefresherActor, CacheRefresherSettings, ImageListReader};
use crate::actors::cri_gateway::{CriGatewayActor, GetReader, ListImages, SetFaultPlan};
use crate::actors::detector::{DetectorActor, DetectorCri, DetectorSettings};
use crate::actors::gc_executor::{GcExecutorActor, GcExecutorSettings};
use crate::actors::pull_queue::PullQueueActor;
use crate::clock::Clock;
use crate::config::{Config, GcSettings};
use crate::connect::ConnectedRuntime;
use crate::credentials::NodeCredentials;
use crate::ensure::ImageManager;
use crate::error::AppError;
use crate::events::EventSink;
use crate::gc::capacity::CapacitySource;
use crate::gc::in_use_hints::InUseHints;
use crate::pull_records::PullRecords;
use crate::store::Store;

/// Builds and spawns every actor of a node over a connected runtime.
pub(super) async fn start(
    cfg: Config,
    runtime: ConnectedRuntime,
    node_credentials: Arc<NodeCredentials>,
    clock: Clock,
    opened: Option<Arc<Store>>,
) -> Result<Node, AppError> {
    let gateway = &runtime.gateway;
    let mailbox = |_| AppError::Mailbox("CRI gateway".into());
    if let Some(path) = &cfg.fault_plan {
        // Validated with the configuration; read again here, so a file
        // changed since is still a configuration error (exit code 64).
        let plan = crate::config::load_fault_plan(path).map_err(|reason| crate::config::ConfigError::Invalid {
            key: "runtime.fault_plan".into(),
            value: path.display().to_string(),
            reason,
        })?;
        tracing::warn!(plan = %path.display(), rules = plan.rules().len(), "a fault plan is active at the CRI gateway");
        gateway.send(SetFaultPlan(plan)).await.map_err(mailbox)?;
    }

    // Durable state, and the KEP-2535 pull records in it; intents a crash
    // left are turned into records every pod must re-verify.
    let store = match (&cfg.state_dir, opened) {
        (Some(_), Some(store)) => Some(store),
        (Some(dir), None) => Some(open_store(dir, &cfg.pull.metrics)?),
        (None, Some(_)) => {
            return Err(AppError::Other("a store was given to a node with no state directory".into()));
        }
        (None, None) => {
            warn_if_forgetting_opens_private_images(&cfg, &runtime);
            None
        }
    };
    let records = PullRecords::open(cfg.verification.clone(), store.clone())
        .map_err(|e| AppError::Other(format!("opening the pull records: {e}")))?
        .with_clock(clock)
        .with_metrics(cfg.pull.metrics.clone());
    match recover_intents_from_runtime(&records, gateway).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(recovered = n, "pull intents left by an earlier run recovered"),
        Err(e) => tracing::warn!(error = %e, "pull intents not recovered; their images keep needing verification"),
    }

    // The pull side: the queue pulls through the gateway's reader (no
    // mailbox hop); the ensure handle talks to the queue and the back-off
    // registry through the messages it sends.
    let reader = gateway.send(GetReader).await.map_err(mailbox)?;
    let queue =
        PullQueueActor::new(cfg.pull.clone(), reader.clone()).with_downloads_clock(runtime.downloads_clock()).start();
    let (backoff, port) = BackoffRegistryActor::from_settings(&cfg.backoff).start_with_port();
    let manager = ImageManager::new(reader, queue.clone().recipient(), port, cfg.ensure.clone())
        .with_records_due(cfg.pull.records_due.clone())
        .with_metrics(cfg.pull.metrics.clone())
        .with_pull_records(records.clone())
        .with_node_credentials(node_credentials);

    // The GC side: what the runtime's image filesystem is measured with,
    // then the three GC actors, sharing the manager's in-use hints and
    // event sink, pruning its pull records.
    let capacity = match &runtime.embedded {
        Some(e) => e.capacity_source(),
        None => CapacitySource::Statvfs { remote_capacity: cfg.gc.image_fs_capacity },
    };
    let parts = GcParts {
        store: store.clone(),
        hints: manager.hints().clone(),
        events: manager.events().clone(),
        pull_records: Some(records),
    };
    let gc = GcService::start(gateway, &cfg.gc, capacity, parts);

    // The declared prefetch list, once the rest is up (none: no actor).
    let (prefetch, declared) = if cfg.prefetch.images.is_empty() {
        (None, super::prefetch_ticker::DeclaredImages::default())
    } else {
        let ticker = super::prefetch_ticker::PrefetchTickerActor::new(
            manager.clone(),
            cfg.prefetch.images.clone(),
            cfg.prefetch.refresh,
            cfg.pull.metrics.clone(),
        );
        let declared = ticker.declared();
        (Some(ticker.start()), declared)
    };

    let live_gc = tokio::sync::watch::Sender::new(cfg.gc.clone());
    Ok(Node {
        in_force: std::sync::Mutex::new(cfg.clone()),
        cfg,
        runtime,
        manager,
        queue,
        backoff,
        gc,
        store,
        accepting: Arc::new(AtomicBool::new(true)),
        live_gc,
        prefetch,
        declared,
    })
}

/// Opens the durable state in `dir`. A damaged database does not fail the
/// start: [`Store::open`] moves it aside and starts an empty one (logged as
/// an error), counted here in `imaged_store_recovered_total`. What moving
/// aside cannot fix fails it, naming the directory: permissions, I/O
/// errors, another imaged holding the database, a newer schema.
pub(crate) fn open_store(dir: &std::path::Path, metrics: &crate::metrics::Metrics) -> Result<Arc<Store>, AppError> {
    let store = Store::open(dir).map_err(|e| {
        let mut msg = format!("opening the state in {}: {e}", dir.display());
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let _ = write!(msg, ": {s}");
            source = s.source();
        }
        AppError::Other(msg)
    })?;
    if store.recovery().is_some() {
        metrics.store_recovered();
    }
    store.set_metrics(metrics);
    let store = Arc::new(store);
    metrics.count_pull_records_in(&store);
    Ok(store)
}

/// [`PullRecords::recover_intents`] over the images the runtime behind
/// `gateway` lists (listed only when intents are stored, as the kubelet
/// does). A listing failure leaves the intents as they are (the images keep
/// counting as pulled by imaged) and is returned.
pub async fn recover_intents_from_runtime(
    records: &PullRecords,
    gateway: &Addr<CriGatewayActor>,
) -> Result<usize, String> {
    if !records.has_stored_intents() {
        return Ok(0);
    }
    let images = gateway
        .send(ListImages::default())
        .await
        .map_err(|_| "the CRI gateway stopped".to_string())?
        .map_err(|e| format!("failed to list images: {e}"))?;
    records.recover_intents(&images).await.map_err(|e| e.to_string())
}

/// What the GC actors share with the rest of the node.
#[derive(Default)]
pub struct GcParts {
    /// The durable image records (`None` = memory only).
    pub store: Option<Arc<Store>>,
    /// The `ImageManager`'s in-use hints (images it ensured count as in use
    /// for the min-age window, pulls in flight always).
    pub hints: InUseHints,
    /// Where the node events go (`InvalidDiskCapacity`, `FreeDiskSpaceFailed`,
    /// `ImageGCFailed`).
    pub events: EventSink,
    /// With the `ImageManager`'s pull records, the GC executor prunes them
    /// after each run, and the actors run on the records' clock
    /// ([`PullRecords::clock`]), so the prune compares the run's start with
    /// the records' stamps on one clock.
    pub pull_records: Option<PullRecords>,
}

/// The running GC actors.
#[derive(Clone)]
pub struct GcService {
    /// The detector ticker (records' only writer).
    pub detector: Addr<DetectorActor>,
    /// The GC executor (`RunGc`, `DeleteUnusedImages`, `GetLastGcReport`).
    pub executor: Addr<GcExecutorActor>,
    /// The cache refresher.
    pub refresher: Addr<CacheRefresherActor>,
    /// Node-status image list, read without a round trip.
    pub images: ImageListReader,
}

impl std::fmt::Debug for GcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcService").finish_non_exhaustive()
    }
}

impl GcService {
    /// Starts the three GC actors on the current arbiter over `gateway`,
    /// measuring the image filesystem with `capacity`, sharing `parts` with
    /// the rest of the node. [`Node::start`] calls it; tests that want GC
    /// without a node do too.
    pub fn start(
        gateway: &Addr<CriGatewayActor>,
        settings: &GcSettings,
        capacity: CapacitySource,
        parts: GcParts,
    ) -> Self {
        let GcParts { store, hints, events, pull_records } = parts;
        // Records are stamped with their own clock; GC compares the start
        // of its run with those stamps when it prunes, so it runs on it too.
        let clock = pull_records.as_ref().map_or_else(Clock::new, PullRecords::clock);
        let cri = DetectorCri {
            list_images: gateway.clone().recipient(),
            list_containers: gateway.clone().recipient(),
            list_sandboxes: gateway.clone().recipient(),
            image_status: gateway.clone().recipient(),
        };
        // The kubelet's `beganGC` is this start; with durable records and
        // `max_age_survives_restarts`, the first start's, kept in the state.
        let began = store.as_ref().filter(|_| settings.max_age_survives_restarts).and_then(|s| {
            s.gc_began_once(clock.now())
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "the GC loop's first start could not be read or kept; max age counts from now");
                })
                .ok()
        });
        let dcfg = DetectorSettings {
            period: settings.detect_period,
            sandbox_image: settings.sandbox_image.clone(),
            recent_window: settings.min_age,
            mailbox_capacity: settings.detector_mailbox_capacity,
        };
        let detector = DetectorActor::new(dcfg, cri, store, hints.clone(), clock.clone()).start();
        let ecfg = GcExecutorSettings {
            policy: settings.policy(),
            rules: settings.rules(),
            period: settings.gc_period,
            capacity,
            pressure_check: settings.pressure_check_period,
            eviction: settings.eviction_available.clone(),
            mailbox_capacity: settings.executor_mailbox_capacity,
        };
        let mut executor = GcExecutorActor::new(
            ecfg,
            detector.clone().recipient(),
            gateway.clone().recipient(),
            gateway.clone().recipient(),
            events,
            clock,
        )
        .with_metrics(settings.metrics.clone())
        .with_hints(hints)
        .with_status_check(gateway.clone().recipient());
        if let Some(records) = pull_records {
            executor = executor.with_pull_records(records);
        }
        if let Some(began) = began {
            executor = executor.with_began(began);
        }
        let executor = executor.start();
        let rcfg = CacheRefresherSettings {
            period: settings.cache_refresh_period,
            max_images: settings.node_status_max_images,
            mailbox_capacity: settings.refresher_mailbox_capacity,
        };
        let (refresher, images) = CacheRefresherActor::new(gateway.clone().recipient(), rcfg);
        Self { detector, executor, refresher: refresher.start(), images }
    }
}

/// Records kept in memory while the runtime's images outlive imaged: after a
/// restart every image on the node counts as preloaded, which the policy
/// may exempt from verification. Said once at start, with the way out.
fn warn_if_forgetting_opens_private_images(cfg: &Config, runtime: &ConnectedRuntime) {
    use crate::pull_records::VerificationPolicy as P;
    // NeverVerify verifies nothing anyway; AlwaysVerify exempts nothing.
    let exempts_preloaded =
        matches!(cfg.verification.policy, P::NeverVerifyPreloadedImages | P::NeverVerifyAllowlistedImages);
    if runtime.embedded.is_none() && exempts_preloaded {
        tracing::warn!(
            policy = ?cfg.verification.policy,
            "state.dir = \"memory\": pull records are forgotten on restart, and then every image on the node \
             counts as preloaded, which this policy lets any pod use, private or not; set state.dir to a \
             directory, or credential_verification.policy = \"AlwaysVerify\""
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_store_is_counted_and_does_not_fail_the_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(crate::store::FILE_NAME), vec![0x5a; 8192]).unwrap();
        let metrics = crate::metrics::Metrics::new();
        let store = open_store(dir.path(), &metrics).unwrap();
        assert!(store.recovery().is_some());
        assert!(metrics.encode().contains("imaged_store_recovered_total 1\n"), "{}", metrics.encode());
        drop(store);
        // A healthy reopen counts nothing more.
        let metrics = crate::metrics::Metrics::new();
        open_store(dir.path(), &metrics).unwrap();
        assert!(metrics.encode().contains("imaged_store_recovered_total 0\n"), "{}", metrics.encode());
    }

    #[test]
    fn what_moving_aside_cannot_fix_still_fails_naming_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        // The database path is a directory: not damage, an environment error.
        std::fs::create_dir(dir.path().join(crate::store::FILE_NAME)).unwrap();
        let err = open_store(dir.path(), &crate::metrics::Metrics::new()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()) && err.contains("Is a directory"), "{err}");
    }
}
