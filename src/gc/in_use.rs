//! Which images are in use, and by whom, from one listing of the runtime:
//! every container's image (in any state, as the kubelet), the sandbox
//! image (by its resolved id), and, beyond the kubelet, images ensured
//! within the min-age window and images a pull in flight would replace.
//! Pure: the detector lists and passes the results in; the users named
//! here explain the GC report's `keep: in use by …`.

use std::collections::{BTreeMap, HashMap};

use crate::domain::{Container, Image, PodSandbox};

/// The user named for the sandbox image.
pub const SANDBOX_IMAGE: &str = "sandbox image";
/// The user named for an image ensured within the min-age window.
pub const ENSURED_RECENTLY: &str = "ensured recently";
/// The user named for an image whose tag or digest a pull in flight names.
pub const PULL_IN_FLIGHT: &str = "pull in flight";
/// The user named, for one min-age window after a start on durable
/// records, for every image those records knew: it may have been ensured
/// just before the restart, and the hints of that are gone with the process.
pub const ENSURED_BEFORE_RESTART: &str = "maybe ensured before imaged started";

/// Image id → who uses it, in this order: containers
/// (`namespace/pod/container`, or `sandbox-id/container` when the pod is
/// not listed), [`SANDBOX_IMAGE`], [`ENSURED_RECENTLY`], [`PULL_IN_FLIGHT`].
pub type InUse = BTreeMap<String, Vec<String>>;

/// What one detection found that can make an image in use.
#[derive(Debug, Clone, Copy)]
pub struct InUseSources<'a> {
    /// The runtime's images (for pulls in flight, matched by tag or digest).
    pub images: &'a [Image],
    /// Every container, whatever its state.
    pub containers: &'a [Container],
    /// Pod sandboxes, only to name a container's pod.
    pub sandboxes: &'a [PodSandbox],
    /// The sandbox image's id, when it resolved.
    pub sandbox_image_id: Option<&'a str>,
    /// Ids of images ensured within the min-age window.
    pub ensured_recently: &'a [String],
}

/// Who uses which image (see [`InUse`]). A container names its image by
/// `image_id`, else by `image_ref`; one naming neither uses nothing.
/// `pull_in_flight` says whether a pull in flight names one of an image's
/// tags or digests.
pub fn images_in_use(sources: InUseSources<'_>, pull_in_flight: impl Fn(&Image) -> bool) -> InUse {
    let pods: HashMap<&str, String> =
        sources.sandboxes.iter().map(|s| (s.id.as_str(), format!("{}/{}", s.namespace, s.name))).collect();
    let mut in_use = InUse::new();
    for c in sources.containers {
        let id = if c.image_id.is_empty() { &c.image_ref } else { &c.image_id };
        if id.is_empty() {
            continue;
        }
        let pod = pods.get(c.pod_sandbox_id.as_str()).cloned().unwrap_or_else(|| c.pod_sandbox_id.clone());
        in_use.entry(id.clone()).or_default().push(format!("{pod}/{}", c.name));
    }
    if let Some(id) = sources.sandbox_image_id {
        in_use.entry(id.to_owned()).or_default().push(SANDBOX_IMAGE.into());
    }
    for id in sources.ensured_recently {
        in_use.entry(id.clone()).or_default().push(ENSURED_RECENTLY.into());
    }
    for i in sources.images {
        if pull_in_flight(i) {
            in_use.entry(i.id.clone()).or_default().push(PULL_IN_FLIGHT.into());
        }
    }
    in_use
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(name: &str, image_id: &str, image_ref: &str, sandbox: &str) -> Container {
        Container {
            id: format!("id-{name}"),
            name: name.into(),
            image_id: image_id.into(),
            image_ref: image_ref.into(),
            pod_sandbox_id: sandbox.into(),
            ..Container::default()
        }
    }

    fn image(id: &str, tag: &str) -> Image {
        Image { id: id.into(), repo_tags: vec![tag.into()], ..Image::default() }
    }

    fn sources<'a>(containers: &'a [Container], sandboxes: &'a [PodSandbox]) -> InUseSources<'a> {
        InUseSources { images: &[], containers, sandboxes, sandbox_image_id: None, ensured_recently: &[] }
    }

    #[test]
    fn containers_use_their_image_id_else_their_image_ref_named_by_pod() {
        let containers = [
            container("web", "sha256:a", "nginx:1", "sb1"),
            container("side", "", "sha256:b", "sb1"),
            container("orphan", "sha256:a", "", "sb-gone"),
            container("nameless", "", "", "sb1"),
        ];
        let pods =
            [PodSandbox { id: "sb1".into(), name: "web".into(), namespace: "prod".into(), ..PodSandbox::default() }];
        let in_use = images_in_use(sources(&containers, &pods), |_| false);
        assert_eq!(in_use.len(), 2, "{in_use:?}");
        assert_eq!(in_use["sha256:a"], ["prod/web/web", "sb-gone/orphan"], "an unlisted pod: its sandbox id");
        assert_eq!(in_use["sha256:b"], ["prod/web/side"]);
    }

    #[test]
    fn the_sandbox_image_recent_ensures_and_pulls_in_flight_count_in_that_order() {
        let containers = [container("c", "sha256:p", "", "sb")];
        let images = [image("sha256:p", "pause:3.10"), image("sha256:n", "nginx:1"), image("sha256:x", "x:1")];
        let recent = ["sha256:p".to_string(), "sha256:r".to_string()];
        let src = InUseSources {
            images: &images,
            containers: &containers,
            sandboxes: &[],
            sandbox_image_id: Some("sha256:p"),
            ensured_recently: &recent,
        };
        let in_use = images_in_use(src, |i| i.repo_tags.iter().any(|t| t == "nginx:1" || t == "pause:3.10"));
        assert_eq!(in_use["sha256:p"], ["sb/c", SANDBOX_IMAGE, ENSURED_RECENTLY, PULL_IN_FLIGHT]);
        assert_eq!(in_use["sha256:r"], [ENSURED_RECENTLY], "ensured, even if not listed");
        assert_eq!(in_use["sha256:n"], [PULL_IN_FLIGHT]);
        assert!(!in_use.contains_key("sha256:x"), "unused");
    }

    #[test]
    fn nothing_listed_uses_nothing() {
        assert!(images_in_use(sources(&[], &[]), |_| true).is_empty());
    }
}
