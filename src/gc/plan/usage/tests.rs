//! The kubelet's arithmetic and texts.

use super::*;

fn fs(capacity: u64, available: u64) -> FsCapacity {
    FsCapacity { capacity, available }
}

#[test]
fn usage_and_amount_use_the_kubelets_integer_arithmetic() {
    // (capacity, available, low, usage, amount)
    let cases: [(u64, u64, i64, Option<u8>, u64); 14] = [
        (1000, 149, 80, Some(86), 51),
        (1000, 150, 80, Some(85), 50),
        (1000, 151, 80, Some(85), 49),
        (1000, 160, 80, Some(84), 40),
        (1000, 0, 80, Some(100), 200),
        (1000, 1000, 80, Some(0), 0),
        (1000, 2000, 80, Some(0), 0),
        (3, 1, 80, Some(67), 0),
        (1001, 200, 80, Some(81), 0),
        (0, 0, 80, None, 0),
        (u64::MAX, 0, 80, Some(100), 3_689_348_814_741_910_323),
        (u64::MAX, u64::MAX / 2, 80, Some(51), 0),
        (1000, 100, -50, Some(90), 1400),
        (1000, 100, 150, Some(90), 0),
    ];
    for (capacity, available, low, usage, amount) in cases {
        let f = fs(capacity, available);
        assert_eq!(usage_percent(f), usage, "usage of {f:?}");
        assert_eq!(amount_to_free(f, low), amount, "amount of {f:?} low {low}");
    }
}

#[test]
fn the_free_disk_space_failed_text_is_the_kubelets() {
    assert_eq!(
        free_disk_space_failed_message(88, 28_346_784_154, 36_018_163),
        "Insufficient free disk space on the node's image filesystem (88% of 26.4 GiB used). \
         Failed to free sufficient space by deleting unused images (freed 36018163 bytes). \
         Investigate disk usage, as it could be used by active images, logs, volumes, or other data."
    );
    assert!(free_disk_space_failed_message(90, 100 << 30, 0).contains("(90% of 100.0 GiB used)"));
}

#[test]
fn sizes_print_in_binary_units_with_one_decimal() {
    let cases = [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1280, "1.2 KiB"),
        (1792, "1.8 KiB"),
        (1536, "1.5 KiB"),
        ((1 << 20) - 1, "1024.0 KiB"),
        (1 << 20, "1.0 MiB"),
        (28_346_784_154, "26.4 GiB"),
        (100 << 30, "100.0 GiB"),
        (96_527_413_248, "89.9 GiB"),
        (1 << 40, "1.0 TiB"),
        ((3 << 40) + (1 << 39), "3.5 TiB"),
        (1 << 50, "1.0 PiB"),
        (u64::MAX, "16.0 EiB"),
    ];
    for (bytes, text) in cases {
        assert_eq!(format_size(bytes), text, "{bytes}");
    }
}
