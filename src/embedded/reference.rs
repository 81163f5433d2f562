//! containerd's `ParseDockerRef` for the embedded runtime: normalise a
//! reference and add `:latest` when it has neither tag nor digest; a
//! reference with both keeps only the digest.

use crate::domain::reference::parse_normalized_named;

/// The normalised reference containerd would store, or the parse error text.
pub fn docker_ref(s: &str) -> Result<String, String> {
    parse_normalized_named(s).map(|n| n.docker_ref()).map_err(|e| e.to_string())
}
