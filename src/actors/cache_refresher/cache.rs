//! `ImageList`: the node's image list as the kubelet's cache keeps it, and
//! the node-status view of it. Pure.

use crate::domain::Image;

/// Most names the kubelet reports per image in node status.
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// One image in node status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeImage {
    /// Repo digests, then repo tags, at most five.
    pub names: Vec<String>,
    /// Size in bytes.
    pub size_bytes: u64,
}

/// The cached image list, sorted by size descending (ties: id descending).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageList {
    images: Vec<Image>,
}

impl ImageList {
    /// Sorts `images` as the kubelet's cache does.
    pub fn new(mut images: Vec<Image>) -> Self {
        images.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| b.id.cmp(&a.id)));
        Self { images }
    }

    /// The images, largest first.
    pub fn images(&self) -> &[Image] {
        &self.images
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// The node-status view: the first `max` images (`None` = all), each
    /// named by repo digests then repo tags, at most five names.
    pub fn node_status(&self, max: Option<usize>) -> Vec<NodeImage> {
        let n = max.map_or(self.images.len(), |m| m.min(self.images.len()));
        self.images[..n]
            .iter()
            .map(|i| NodeImage {
                names: i.repo_digests.iter().chain(&i.repo_tags).take(MAX_NAMES_PER_IMAGE).cloned().collect(),
                size_bytes: i.size,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(id: &str, size: u64, digests: usize, tags: usize) -> Image {
        Image {
            id: id.into(),
            size,
            repo_digests: (0..digests).map(|i| format!("r@sha256:{i}")).collect(),
            repo_tags: (0..tags).map(|i| format!("r:{i}")).collect(),
            ..Image::default()
        }
    }

    #[test]
    fn sorted_by_size_then_id_descending() {
        let l = ImageList::new(vec![img("a", 10, 0, 0), img("c", 30, 0, 0), img("b", 30, 0, 0), img("d", 5, 0, 0)]);
        let ids: Vec<&str> = l.images().iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "a", "d"]);
    }

    #[test]
    fn node_status_takes_the_largest_and_five_names_digests_first() {
        let l = ImageList::new(vec![img("a", 10, 4, 4), img("b", 20, 1, 1), img("c", 1, 0, 0)]);
        let s = l.node_status(Some(2));
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], NodeImage { names: vec!["r@sha256:0".into(), "r:0".into()], size_bytes: 20 });
        assert_eq!(s[1].names, ["r@sha256:0", "r@sha256:1", "r@sha256:2", "r@sha256:3", "r:0"]);
        assert_eq!(l.node_status(None).len(), 3);
        assert_eq!(l.node_status(Some(0)).len(), 0);
    }
}
