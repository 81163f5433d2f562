//! Starts image garbage collection from configuration: the detector ticker,
//! the cache refresher and the GC executor, wired to one CRI gateway.

use std::sync::Arc;

use actix::prelude::*;

use crate::actors::cache_refresher::{self, CacheRefresherActor, CacheRefresherSettings, ImageListReader};
use crate::actors::cri_gateway::CriGatewayActor;
use crate::actors::detector::{self, DetectorActor, DetectorCri, DetectorSettings};
use crate::actors::gc_executor::{self, GcExecutorActor, GcExecutorSettings};
use crate::clock::Clock;
use crate::config::GcSettings;
use crate::events::EventSink;
use crate::gc::capacity::CapacitySource;
use crate::gc::in_use_hints::InUseHints;
use crate::pull_records::PullRecords;
use crate::store::Store;

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
    /// Starts the three actors on the current arbiter. `hints` should be the
    /// `ImageManager`'s (images it ensured count as in use for the min-age
    /// window); `events` receives the node events (`InvalidDiskCapacity`,
    /// `FreeDiskSpaceFailed`, `ImageGCFailed`).
    ///
    /// With `pull_records` (the `ImageManager`'s, see
    /// `ImageManager::pull_records`), the GC executor prunes them after
    /// each run, and the actors run on the records' clock
    /// ([`PullRecords::clock`]), so the prune compares the run's start with
    /// the records' stamps on one clock.
    pub fn start(
        gateway: &Addr<CriGatewayActor>,
        settings: &GcSettings,
        capacity: CapacitySource,
        store: Option<Arc<Store>>,
        hints: InUseHints,
        events: EventSink,
        pull_records: Option<PullRecords>,
    ) -> Self {
        // Records are stamped with their own clock; GC compares the start
        // of its run with those stamps when it prunes, so it runs on it too.
        let clock = pull_records.as_ref().map_or_else(Clock::new, PullRecords::clock);
        let cri = DetectorCri {
            list_images: gateway.clone().recipient(),
            list_containers: gateway.clone().recipient(),
            list_sandboxes: gateway.clone().recipient(),
            image_status: gateway.clone().recipient(),
        };
        let dcfg = DetectorSettings {
            period: settings.detect_period,
            sandbox_image: settings.sandbox_image.clone(),
            recent_window: settings.min_age,
            mailbox_capacity: detector::DEFAULT_MAILBOX_CAPACITY,
        };
        let detector = DetectorActor::new(dcfg, cri, store, hints, clock.clone()).start();
        let ecfg = GcExecutorSettings {
            policy: settings.policy(),
            rules: settings.rules(),
            period: settings.gc_period,
            capacity,
            mailbox_capacity: gc_executor::DEFAULT_MAILBOX_CAPACITY,
        };
        let mut executor = GcExecutorActor::new(
            ecfg,
            detector.clone().recipient(),
            gateway.clone().recipient(),
            gateway.clone().recipient(),
            events,
            clock,
        )
        .with_metrics(settings.metrics.clone());
        if let Some(records) = pull_records {
            executor = executor.with_pull_records(records);
        }
        let executor = executor.start();
        let rcfg = CacheRefresherSettings {
            period: settings.cache_refresh_period,
            max_images: settings.node_status_max_images,
            mailbox_capacity: cache_refresher::DEFAULT_MAILBOX_CAPACITY,
        };
        let (refresher, images) = CacheRefresherActor::new(gateway.clone().recipient(), rcfg);
        Self { detector, executor, refresher: refresher.start(), images }
    }
}
