//! One GC run's I/O, in order: measure the image filesystem, detect, plan,
//! remove the deletions one by one in plan order, measure again, prune the
//! KEP-2535 pulled records of removed images. An async function over
//! [`GcPorts`] (recipients and handles), so it runs without the actor and
//! its state: the actor copies a [`RunSpec`] in and hands the outcome to
//! [`GcExecutor::finish`](super::executor::GcExecutor::finish).

use std::collections::HashSet;
use std::time::SystemTime;

use actix::Recipient;
use tracing::{info, warn};

use super::executor::RunSpec;
use super::report::{GcError, GcReport, KEPT_LISTED_PER_REASON, RemovedImage};
use crate::actors::cri_gateway::{GetImageFsInfo, GetImageStatus, RemoveImage};
use crate::actors::detector::{DetectImages, Detection};
use crate::clock::Clock;
use crate::domain::ImageSpec;
use crate::gc::capacity::{CapacitySource, FsCapacity, MeasuredBy};
use crate::gc::in_use_hints::{InUseHints, RemovalClaim};
use crate::gc::plan::{GcPlanError, GcRunInputs, Verdict, plan_gc};
use crate::gc::record::RecordKey;
use crate::metrics::Metrics;
use crate::pull_records::PullRecords;

/// Where a run's I/O goes.
#[derive(Clone)]
pub struct GcPorts {
    /// A fresh detection (the detector).
    pub detect: Recipient<DetectImages>,
    /// The image filesystem (the CRI gateway).
    pub fs_info: Recipient<GetImageFsInfo>,
    /// Removals (the CRI gateway).
    pub remove: Recipient<RemoveImage>,
    /// Pulled records to prune after a non-dry run (KEP-2535), if any.
    pub pull_records: Option<PullRecords>,
    /// Removals by reason and bytes freed.
    pub metrics: Metrics,
    /// The ensure path's hints, if any: each removal is claimed from them
    /// first, refused for an image ensured or pulled since the run began.
    pub hints: Option<InUseHints>,
    /// `ImageStatus` (the CRI gateway), if set: each image is looked at
    /// again just before its removal, which is refused if the runtime pins
    /// it now or its status cannot be read.
    pub status: Option<Recipient<GetImageStatus>>,
}

/// Runs GC once as `spec` says, on `clock` (the one the pulled records are
/// stamped with). A run that planned returns its report, before judging
/// (see `GcExecutor::finish`).
///
/// # Errors
///
/// Measuring the filesystem failed, detection failed, or the capacity is 0
/// (after the max-age deletions, as in the kubelet).
pub async fn run_gc(ports: GcPorts, spec: RunSpec, clock: Clock) -> Result<GcReport, GcError> {
    let started = clock.now();
    let (before, measured_by) = match spec.measured {
        Some(measured) => measured,
        None => measure(&ports.fs_info, &spec.capacity).await?,
    };
    let detection = ports.detect.send(DetectImages).await.map_err(|_| GcError::DetectorStopped)?;
    let detection = detection.map_err(GcError::Detection)?;
    let mut rules = spec.rules;
    rules.sandbox_image_id = detection.sandbox_image_id.clone();
    let inputs = GcRunInputs {
        records: &detection.records,
        in_use: &*detection,
        fs: before,
        policy: &spec.policy,
        rules: &rules,
        began: spec.began,
        now: clock.now(),
        mode: spec.mode,
    };
    // Everything the run needs from the detection is taken before its first
    // wait, and the detection let go: a detection while this run removes
    // images (the detector's tick) then updates the records in place rather
    // than copying every one of them for this run (see `Detector::apply`).
    let plan = plan_gc(inputs);
    let listed_pull_refs = match &ports.pull_records {
        Some(records) if !spec.dry_run => Some(listed_refs(&records.image_refs(), &detection)),
        _ => None,
    };
    // A run nobody asked for (the periodic one) lists what the executor
    // keeps of it: held through the removals (minutes, on a big node).
    let listed = if spec.whole_report { usize::MAX } else { KEPT_LISTED_PER_REASON };
    let mut report = match plan {
        Ok(plan) => GcReport {
            measured_by: measured_by.to_string(),
            ..GcReport::from_plan_listing(&plan, |id| detection.used_by(id), spec.dry_run, started, before, listed)
        },
        Err(GcPlanError::InvalidCapacity { age_deletions }) => {
            // As the kubelet: the max-age pass runs before the capacity check.
            if !spec.dry_run {
                let doomed = age_deletions
                    .into_iter()
                    .map(|key| {
                        let record = detection.records.get(&key);
                        let (size, names) = record.map_or((0, Vec::new()), |r| (r.size, r.repo_tags.clone()));
                        (key, size, names)
                    })
                    .collect();
                drop(detection);
                remove_for_age(&ports, doomed, started).await;
            }
            return Err(GcError::InvalidCapacity);
        }
    };
    drop(detection);
    if spec.dry_run {
        return Ok(report);
    }
    remove_in_order(&ports, &mut report, started).await;
    if let Ok((after, _)) = measure(&ports.fs_info, &spec.capacity).await {
        let measured = i128::from(after.available) - i128::from(before.available);
        // A run that removed nothing reclaimed nothing, whatever else
        // freed space meanwhile (rotated logs, a pod's deleted volume).
        if !report.removed.is_empty() {
            ports.metrics.gc_reclaimed(measured);
        }
        report.bytes_freed_measured = Some(measured);
    }
    if let Some(listed) = listed_pull_refs {
        prune_pull_records(&ports, listed, &report, started).await;
    }
    Ok(report)
}

/// Of the pulled records' image refs `refs`, those the detection listed (by
/// id, under any runtime handler): the only ids the prune asks about, kept
/// instead of every listed id.
fn listed_refs(refs: &HashSet<String>, detection: &Detection) -> HashSet<String> {
    if refs.is_empty() {
        return HashSet::new();
    }
    detection.records.iter().filter(|r| refs.contains(r.key.id.as_str())).map(|r| r.key.id.clone()).collect()
}

/// The image filesystem's capacity and free space: `ImageFsInfo`, then the
/// capacity source (on the blocking pool: `statvfs` may block).
pub(super) async fn measure(
    fs_info: &Recipient<GetImageFsInfo>,
    capacity: &CapacitySource,
) -> Result<(FsCapacity, MeasuredBy), GcError> {
    let info = fs_info.send(GetImageFsInfo).await.map_err(|_| GcError::FsInfo("CRI gateway stopped".into()))?;
    let info = info.map_err(|e| GcError::FsInfo(format!("failed to get image filesystem info: {e}")))?;
    let fs = info
        .image_filesystems
        .into_iter()
        .next()
        .ok_or_else(|| GcError::FsInfo("the runtime reported no image filesystem".into()))?;
    let capacity = capacity.clone();
    crate::blocking::unblock(move || capacity.measure_with_origin(&fs))
        .await
        .map_err(|e| GcError::FsInfo(e.to_string()))?
        .map_err(GcError::FsInfo)
}

/// What an image removal refused by the hints says in the report.
pub const IN_USE_SINCE_PLANNED: &str = "not removed: ensured or being pulled since this run began";

/// What a removal refused because the runtime pins the image now says.
pub const PINNED_SINCE_PLANNED: &str = "not removed: the runtime pins it now";

/// Why the image `spec` names may not be removed now that its removal has
/// come: the runtime pins it since the detection, or its status cannot be
/// read (`None`: it may go, or there is no status check).
async fn refused_now(ports: &GcPorts, spec: &ImageSpec) -> Option<String> {
    let status = ports.status.as_ref()?;
    let refused = match status.send(GetImageStatus { image: spec.clone(), verbose: false }).await {
        Ok(Ok(s)) if s.image.as_ref().is_some_and(|i| i.pinned) => PINNED_SINCE_PLANNED.to_string(),
        Ok(Ok(_)) => return None,
        Ok(Err(e)) => format!("not removed: its status could not be read: {e}"),
        Err(_) => "not removed: CRI gateway stopped".to_string(),
    };
    info!(image = %spec.image, "{refused}");
    Some(refused)
}

/// Claims the removal of `id` (known by `names`) from the hints, for a run
/// that began at `started`: `Err` when the image was ensured or pulled
/// since (it is kept); `Ok(None)` without hints.
fn claim(ports: &GcPorts, id: &str, names: &[String], started: SystemTime) -> Result<Option<RemovalClaim>, ()> {
    match &ports.hints {
        None => Ok(None),
        Some(hints) => match hints.claim_removal(id, names, started) {
            Some(c) => Ok(Some(c)),
            None => {
                info!(image = %id, "{IN_USE_SINCE_PLANNED}");
                Err(())
            }
        },
    }
}

/// Removes the max-age pass's deletions when the capacity is invalid: no
/// report, only the metrics.
async fn remove_for_age(ports: &GcPorts, doomed: Vec<(RecordKey, u64, Vec<String>)>, started: SystemTime) {
    for (key, size, names) in doomed {
        let Ok(_claim) = claim(ports, &key.id, &names, started) else { continue };
        let spec = ImageSpec::new(key.id).with_runtime_handler(key.runtime_handler);
        if refused_now(ports, &spec).await.is_some() {
            continue;
        }
        if let Ok(Ok(())) = ports.remove.send(RemoveImage { image: spec }).await {
            ports.metrics.image_garbage_collected("age", size);
        }
    }
}

/// Removes the report's deletions one at a time, in plan order, recording
/// each as removed or failed (a failure does not stop the rest). Each is
/// claimed from the hints first: one ensured or pulled since the run began
/// (`started`) is kept, as failed with [`IN_USE_SINCE_PLANNED`], and an
/// ensure that finds it while it is being removed waits for the removal.
/// Then its status is read again: one the runtime pins now is kept
/// ([`PINNED_SINCE_PLANNED`]), as is one whose status cannot be read.
async fn remove_in_order(ports: &GcPorts, report: &mut GcReport, started: SystemTime) {
    let deletions: Vec<_> = report.deletions().cloned().collect();
    for v in &deletions {
        let Verdict::Delete(reason) = &v.verdict else { continue };
        let Ok(_claim) = claim(ports, &v.id, &v.repo_tags, started) else {
            report.failed.push((v.id.clone(), IN_USE_SINCE_PLANNED.to_string()));
            continue;
        };
        let spec = ImageSpec::new(v.id.clone()).with_runtime_handler(v.runtime_handler.clone());
        if let Some(refused) = refused_now(ports, &spec).await {
            report.failed.push((v.id.clone(), refused));
            continue;
        }
        match ports.remove.send(RemoveImage { image: spec }).await {
            Ok(Ok(())) => {
                ports.metrics.image_garbage_collected(reason.metric_label(), v.size);
                info!(image = %v.id, reason = %reason, bytes = v.size, "image removed");
                report.removed.push(RemovedImage {
                    id: v.id.clone(),
                    repo_tags: v.repo_tags.clone(),
                    size: v.size,
                    reason: reason.to_string(),
                });
            }
            Ok(Err(e)) => report.failed.push((v.id.clone(), e.to_string())),
            Err(_) => report.failed.push((v.id.clone(), "CRI gateway stopped".into())),
        }
    }
}

/// The kubelet's post-GC hook. Unlike the kubelet (which passes only the
/// remaining GC candidates), every image still present keeps its record,
/// in use or not: `listed` holds the records' image refs the run's
/// detection listed, less what the run removed. A failure is logged; the
/// run's result is unchanged.
async fn prune_pull_records(ports: &GcPorts, mut present: HashSet<String>, report: &GcReport, started: SystemTime) {
    let Some(records) = &ports.pull_records else { return };
    for removed in &report.removed {
        present.remove(removed.id.as_str());
    }
    // An image pulled again or ensured during the run is there (or about to
    // be): its record, merged unchanged and so not newer, stays.
    if let Some(hints) = &ports.hints {
        present.extend(hints.ensured_since(started));
    }
    // `started` is before detection, read from the clock the records are
    // stamped with (`GcService` shares it): a record written since (a pull
    // during this run) is newer and stays.
    if let Err(e) = records.prune_unknown_records(present, started).await {
        warn!(error = %e, "failed to prune pulled records of removed images");
    }
}
