//! The kubelet's image messages, byte for byte (Go `%q` quoting, Go
//! duration text).

use std::time::Duration;

use crate::domain::go_text::{duration_truncated_ms, quote};

/// `InspectFailed` for a name the default tag cannot be applied to.
pub fn failed_to_apply_default_tag(image: &str, err: &str) -> String {
    format!("Failed to apply default image tag {}: {err}", quote(image))
}

/// `InspectFailed` when ImageStatus fails (the kubelet passes the empty image ref).
pub fn failed_to_inspect(image_ref: &str, err: &str) -> String {
    format!("Failed to inspect image {}: {err}", quote(image_ref))
}

/// `ErrImageNeverPull`.
pub fn never_pull(image: &str) -> String {
    format!("Container image {} is not present with pull policy of Never", quote(image))
}

/// `Pulled` for a present image the pod may use (the kubelet with
/// KEP-2535's `KubeletEnsureSecretPulledImages` on, the 1.35 default).
pub fn already_present_accessible(image: &str) -> String {
    format!("Container image {} already present on machine and can be accessed by the pod", quote(image))
}

/// The returned message when the pull intent could not be recorded.
pub fn failed_to_record_pull_intent(image: &str, err: &str) -> String {
    format!("Failed to record image pull intent for container image {}: {err}", quote(image))
}

/// `BackOff` (the returned message appends `: <previous error>`).
pub fn back_off_pulling(image: &str) -> String {
    format!("Back-off pulling image {}", quote(image))
}

/// `Pulling`.
pub fn pulling(image: &str) -> String {
    format!("Pulling image {}", quote(image))
}

/// `Failed`.
pub fn failed_to_pull(image: &str, err: &str) -> String {
    format!("Failed to pull image {}: {err}", quote(image))
}

/// `Pulled` after a pull: durations truncated to milliseconds, Go text.
///
/// `total` is this pod's own time, waiting included. A pod that joined a
/// pull already running (imaged's shared pulls; the kubelet has none) saw
/// only the part of it since it asked, so the first figure is the pull's
/// duration capped at its own time: never larger than the time "including
/// waiting", as in the kubelet's text.
pub fn successfully_pulled(image: &str, pull: Duration, total: Duration, size: u64) -> String {
    let pull = pull.min(total);
    format!(
        "Successfully pulled image {} in {} ({} including waiting). Image size: {size} bytes.",
        quote(image),
        duration_truncated_ms(pull),
        duration_truncated_ms(total)
    )
}

/// `Pulled` under the local-fallback policy when the registry is unreachable
/// (imaged's addition).
pub fn using_local_image(image: &str, err: &str) -> String {
    format!(
        "Container image {} already present on machine; the registry is unreachable ({err}), so the local image is used",
        quote(image)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_kubelets() {
        assert_eq!(
            failed_to_inspect("", "rpc error: code = Unavailable desc = x"),
            "Failed to inspect image \"\": rpc error: code = Unavailable desc = x"
        );
        assert_eq!(never_pull("busybox"), "Container image \"busybox\" is not present with pull policy of Never");
        assert_eq!(
            already_present_accessible("busybox:1"),
            "Container image \"busybox:1\" already present on machine and can be accessed by the pod"
        );
        assert_eq!(
            failed_to_record_pull_intent("a:1", "disk full"),
            "Failed to record image pull intent for container image \"a:1\": disk full"
        );
        assert_eq!(back_off_pulling("a\"b"), "Back-off pulling image \"a\\\"b\"");
        assert_eq!(pulling("nginx"), "Pulling image \"nginx\"");
        assert_eq!(failed_to_pull("nginx", "pull QPS exceeded"), "Failed to pull image \"nginx\": pull QPS exceeded");
        assert_eq!(
            successfully_pulled("nginx", Duration::from_micros(981_400), Duration::from_millis(62_500), 1234),
            "Successfully pulled image \"nginx\" in 981ms (1m2.5s including waiting). Image size: 1234 bytes."
        );
        // A pod that joined a 45 ms pull 32 ms ago saw 32 ms of it.
        assert_eq!(
            successfully_pulled("nginx", Duration::from_millis(45), Duration::from_millis(32), 1),
            "Successfully pulled image \"nginx\" in 32ms (32ms including waiting). Image size: 1 bytes."
        );
        assert_eq!(failed_to_apply_default_tag("UPPER", "bad"), "Failed to apply default image tag \"UPPER\": bad");
    }
}
