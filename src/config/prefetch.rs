//! `[prefetch]`: images the node keeps pulled — prefetched at start and
//! checked again every `refresh` — and, with `keep`, kept from GC (theirs
//! and the kubelet's, through the CRI front's pins).

use std::time::Duration;

use super::ConfigError;
use super::raw::RawPrefetch;
use super::values::{duration, invalid};

/// The declared prefetch list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefetchSettings {
    /// The images, fully qualified as the runtime names them
    /// (`docker.io/library/redis:7`), in the order given, without repeats.
    pub images: Vec<String>,
    /// How often each is checked again and pulled when absent (`None`: only
    /// at start).
    pub refresh: Option<Duration>,
    /// Whether GC keeps them (added to `gc.pinned_images`).
    pub keep: bool,
}

pub(super) fn prefetch_from_raw(p: RawPrefetch) -> Result<PrefetchSettings, ConfigError> {
    let mut images: Vec<String> = Vec::with_capacity(p.images.len());
    for image in &p.images {
        let named = crate::domain::reference::parse_normalized_named(image.trim()).map_err(|e| {
            invalid(
                "prefetch.images",
                image,
                format!("not an image reference ({e}); e.g. \"docker.io/library/redis:7\""),
            )
        })?;
        // As the runtime names it (the default tag added; a digest wins
        // over a tag), so the name is also the exact GC pattern that keeps it.
        let full = named.docker_ref();
        if !images.contains(&full) {
            images.push(full);
        }
    }
    let refresh = duration("prefetch.refresh", &p.refresh)?;
    Ok(PrefetchSettings { images, refresh: (!refresh.is_zero()).then_some(refresh), keep: p.keep })
}
