//! The kubelet's numbers and texts: usage in percent and the amount to free
//! (its integer arithmetic), sizes as its events print them, and the
//! `FreeDiskSpaceFailed` text.

use crate::gc::capacity::FsCapacity;

#[cfg(test)]
mod tests;

/// The kubelet's usage: `100 − ⌊available × 100 / capacity⌋`, with available
/// clamped to capacity; `None` for capacity 0.
pub fn usage_percent(fs: FsCapacity) -> Option<u8> {
    if fs.capacity == 0 {
        return None;
    }
    let available = u128::from(fs.available.min(fs.capacity));
    let free_percent = available * 100 / u128::from(fs.capacity);
    u8::try_from(100u128.saturating_sub(free_percent)).ok()
}

/// The kubelet's amount to free: `capacity × (100 − low) / 100 − available`
/// in integer arithmetic (truncating), at least 0. Available is clamped to
/// capacity.
pub fn amount_to_free(fs: FsCapacity, low_threshold_percent: i64) -> u64 {
    let capacity = i128::from(fs.capacity);
    let available = i128::from(fs.available.min(fs.capacity));
    let keep_free = i128::from(100i64).saturating_sub(i128::from(low_threshold_percent));
    let target = capacity.saturating_mul(keep_free) / 100;
    let amount = target.saturating_sub(available).max(0);
    u64::try_from(amount).unwrap_or(u64::MAX)
}

/// A size in binary units with one decimal, as the kubelet's event prints
/// capacities: `512 B`, `1.5 KiB`, `26.4 GiB`, `100.0 GiB` (KiB up to EiB;
/// rounded half to even, as Go's `%.1f`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let value = u128::from(bytes);
    let mut unit = 0;
    let mut divisor: u128 = 1024;
    while unit + 1 < UNITS.len() && value >= divisor * 1024 {
        divisor *= 1024;
        unit += 1;
    }
    let tenths = value * 10;
    let (mut q, r) = (tenths / divisor, tenths % divisor);
    if r * 2 > divisor || (r * 2 == divisor && q % 2 == 1) {
        q += 1;
    }
    format!("{}.{} {}", q / 10, q % 10, UNITS.get(unit).copied().unwrap_or("EiB"))
}

/// The kubelet's `FreeDiskSpaceFailed` event text (and GC error).
pub fn free_disk_space_failed_message(usage_percent: u8, capacity: u64, freed: u64) -> String {
    format!(
        "Insufficient free disk space on the node's image filesystem ({usage_percent}% of {} used). \
         Failed to free sufficient space by deleting unused images (freed {freed} bytes). \
         Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
        format_size(capacity)
    )
}
