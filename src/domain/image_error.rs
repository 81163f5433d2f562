//! The kubelet's image error taxonomy and `evalCRIPullErr`, plus imaged's
//! permanent/transient classification.

use std::fmt;

/// The reason a container waits on its image (the kubelet's error values,
/// shown as the container's waiting reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageErrorKind {
    /// `ImagePullBackOff`: a previous pull failed and back-off is running.
    ImagePullBackOff,
    /// `ImageInspectError`: the runtime could not be asked about the image.
    ImageInspectError,
    /// `ErrImagePull`: the pull failed.
    ErrImagePull,
    /// `ErrImageNeverPull`: absent and the policy is `Never`.
    ErrImageNeverPull,
    /// `InvalidImageName`: the image reference does not parse.
    InvalidImageName,
    /// `RegistryUnavailable`: the runtime said the registry is unavailable.
    RegistryUnavailable,
    /// `SignatureValidationFailed`: the runtime rejected the image's signature.
    SignatureValidationFailed,
}

impl ImageErrorKind {
    /// The kubelet's text for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageErrorKind::ImagePullBackOff => "ImagePullBackOff",
            ImageErrorKind::ImageInspectError => "ImageInspectError",
            ImageErrorKind::ErrImagePull => "ErrImagePull",
            ImageErrorKind::ErrImageNeverPull => "ErrImageNeverPull",
            ImageErrorKind::InvalidImageName => "InvalidImageName",
            ImageErrorKind::RegistryUnavailable => "RegistryUnavailable",
            ImageErrorKind::SignatureValidationFailed => "SignatureValidationFailed",
        }
    }
}

impl fmt::Display for ImageErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether retrying can help without anything changing (imaged's addition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Retrying the same request will fail the same way until something
    /// changes (image missing, credentials refused, bad name, bad signature).
    Permanent,
    /// Retrying may succeed (registry or runtime down, throttle, deadline).
    Transient,
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorClass::Permanent => "permanent",
            ErrorClass::Transient => "transient",
        })
    }
}

/// The kubelet's `evalCRIPullErr`: the message and error kind for a failed
/// pull of `image` whose error text is `err` (prefix matching, as the
/// kubelet does; `image` is not quoted here, as in the kubelet).
pub fn eval_cri_pull_err(image: &str, err: &str) -> (String, ImageErrorKind) {
    if let Some(rest) = err.strip_prefix(ImageErrorKind::RegistryUnavailable.as_str()) {
        return (
            format!("image pull failed for {image} because the registry is unavailable{rest}"),
            ImageErrorKind::RegistryUnavailable,
        );
    }
    if let Some(rest) = err.strip_prefix(ImageErrorKind::SignatureValidationFailed.as_str()) {
        return (
            format!("image pull failed for {image} because the signature validation failed{rest}"),
            ImageErrorKind::SignatureValidationFailed,
        );
    }
    (err.to_string(), ImageErrorKind::ErrImagePull)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_cri_pull_err_matches_the_kubelet() {
        assert_eq!(
            eval_cri_pull_err("busybox", "RegistryUnavailable: dial tcp: connection refused"),
            (
                "image pull failed for busybox because the registry is unavailable: dial tcp: connection refused"
                    .into(),
                ImageErrorKind::RegistryUnavailable
            )
        );
        assert_eq!(
            eval_cri_pull_err("x:1", "SignatureValidationFailed"),
            (
                "image pull failed for x:1 because the signature validation failed".into(),
                ImageErrorKind::SignatureValidationFailed
            )
        );
        assert_eq!(
            eval_cri_pull_err("x", "rpc error: code = NotFound desc = nope"),
            ("rpc error: code = NotFound desc = nope".into(), ImageErrorKind::ErrImagePull)
        );
        // An aggregate ("[e1, e2]") never maps to the special kinds.
        assert_eq!(eval_cri_pull_err("x", "[RegistryUnavailable: a, b]").1, ImageErrorKind::ErrImagePull);
    }

    #[test]
    fn kinds_print_the_kubelet_names() {
        assert_eq!(ImageErrorKind::ImagePullBackOff.to_string(), "ImagePullBackOff");
        assert_eq!(ImageErrorKind::ErrImageNeverPull.to_string(), "ErrImageNeverPull");
        assert_eq!(ErrorClass::Permanent.to_string(), "permanent");
    }
}
