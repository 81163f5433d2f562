//! The embedded runtime's in-memory state and its CRI semantics, written to
//! behave like containerd's CRI plugin wherever a caller can tell.
//! Synchronous and free of tonic: the server maps results to statuses.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::cri::{CriError, StatusCode};
use crate::domain::{
    AuthConfig, Container, ContainerFilter, ContainerStatus, FilesystemUsage, Image, ImageFsInfo, ImageSpec,
    PodSandbox, PodSandboxFilter,
};

use super::catalogue::RemoteImage;
use super::reference::docker_ref;

/// Mountpoint the simulated image filesystem reports.
pub const IMAGE_FS_MOUNTPOINT: &str = "/var/lib/imaged/embedded";

/// The runtime's state.
#[derive(Debug)]
pub struct State {
    /// Remote images by normalised `repo:tag`.
    pub catalogue: BTreeMap<String, RemoteImage>,
    /// Local images by id.
    pub images: BTreeMap<String, Image>,
    /// Containers (tests set them to mark images in use).
    pub containers: Vec<Container>,
    /// Pod sandboxes.
    pub sandboxes: Vec<PodSandbox>,
    /// Simulated image filesystem capacity in bytes.
    pub capacity_bytes: u64,
    /// Bumped by every change a state directory keeps (images, containers,
    /// sandboxes; see [`touch`](Self::touch)): what is on disk is current
    /// when its generation is this one.
    pub generation: u64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            catalogue: BTreeMap::new(),
            images: BTreeMap::new(),
            containers: Vec::new(),
            sandboxes: Vec::new(),
            capacity_bytes: 100 * 1024 * 1024 * 1024,
            generation: 0,
        }
    }
}

/// What a pull will do once its latency has passed: checked up front (as a
/// registry answers auth and existence before the layers come).
#[derive(Debug, Clone)]
pub struct PlannedPull {
    /// The catalogue entry.
    pub remote: RemoteImage,
    /// Normalised reference pulled (`repo:tag` or `repo@digest`).
    pub reference: String,
    /// Repository (`docker.io/library/busybox`).
    pub repo: String,
    /// Whether the pull named a tag (only then is a repo tag recorded).
    pub by_tag: bool,
}

fn err(code: StatusCode, msg: String) -> CriError {
    CriError::from_status(code, msg)
}

fn split_repo(reference: &str) -> (&str, Option<&str>, Option<&str>) {
    if let Some((repo, digest)) = reference.split_once('@') {
        return (repo, None, Some(digest));
    }
    // A ':' after the last '/' starts the tag (a ':' before it is a port).
    let slash = reference.rfind('/').unwrap_or(0);
    match reference[slash..].rfind(':') {
        Some(i) => (&reference[..slash + i], Some(&reference[slash + i + 1..]), None),
        None => (reference, None, None),
    }
}

impl State {
    /// Marks a change of what a state directory keeps (images, containers,
    /// sandboxes); returns the new generation.
    pub fn touch(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// Adds (or replaces) a remote image, normalising its name.
    pub fn add_remote(&mut self, mut img: RemoteImage) -> Result<(), CriError> {
        img.name = docker_ref(&img.name).map_err(|e| err(StatusCode::InvalidArgument, e))?;
        self.catalogue.insert(img.name.clone(), img);
        Ok(())
    }

    /// The image a reference or id names, as [`lookup`](Self::lookup), with
    /// an ambiguous id prefix taken as naming nothing.
    pub fn resolve(&self, ref_or_id: &str) -> Option<&Image> {
        self.lookup(ref_or_id).ok().flatten()
    }

    /// The image a reference or id names, containerd's `localResolve`: a
    /// full digest (`sha256:<64 hex>`) is an id; anything else is first
    /// normalised and looked up among repo tags and repo digests, then taken
    /// as an id or a prefix of one, as containerd's image store looks ids up
    /// (go-digest's `digestset`): `sha256:<hex prefix>` among ids of that
    /// algorithm, a bare `<hex prefix>` among every id's hex.
    ///
    /// # Errors
    ///
    /// A prefix of more than one id: containerd's `can not resolve "<ref>"
    /// locally: ambiguous digest string` (gRPC `Unknown`).
    pub fn lookup(&self, ref_or_id: &str) -> Result<Option<&Image>, CriError> {
        if is_full_digest(ref_or_id) {
            return Ok(self.images.get(ref_or_id));
        }
        if let Ok(normalised) = docker_ref(ref_or_id)
            && let Some(image) =
                self.images.values().find(|i| i.repo_tags.iter().chain(&i.repo_digests).any(|r| *r == normalised))
        {
            return Ok(Some(image));
        }
        let (alg, prefix) = match ref_or_id.split_once(':') {
            Some((alg, hex)) => (Some(alg), hex),
            None => (None, ref_or_id),
        };
        if prefix.is_empty() {
            return Ok(None);
        }
        let mut matches = self.images.iter().filter(|(id, _)| {
            id.split_once(':').is_some_and(|(a, hex)| alg.is_none_or(|want| a == want) && hex.starts_with(prefix))
        });
        let Some((_, first)) = matches.next() else { return Ok(None) };
        if matches.next().is_some() {
            return Err(err(
                StatusCode::Unknown,
                format!("can not resolve {ref_or_id:?} locally: ambiguous digest string"),
            ));
        }
        Ok(Some(first))
    }

    /// `ImageStatus`: `None` when absent.
    ///
    /// # Errors
    ///
    /// An ambiguous id prefix ([`lookup`](Self::lookup)).
    pub fn image_status(&self, spec: &ImageSpec) -> Result<Option<Image>, CriError> {
        Ok(self.lookup(&spec.image)?.cloned())
    }

    /// `ListImages`.
    pub fn list_images(&self, filter: Option<&ImageSpec>) -> Vec<Image> {
        match filter.filter(|f| !f.image.is_empty()) {
            Some(f) => self.resolve(&f.image).cloned().into_iter().collect(),
            None => self.images.values().cloned().collect(),
        }
    }

    /// Checks a pull can go ahead: the reference parses, the registry has
    /// it, the credentials are right and there is room. Errors carry
    /// containerd's texts and codes.
    pub fn plan_pull(&self, spec: &ImageSpec, auth: Option<&AuthConfig>) -> Result<PlannedPull, CriError> {
        let reference = docker_ref(&spec.image)
            .map_err(|e| err(StatusCode::Unknown, format!("failed to parse image reference {:?}: {e}", spec.image)))?;
        let fail = |code, detail: String| {
            err(
                code,
                format!(
                    "failed to pull and unpack image {reference:?}: failed to resolve reference {reference:?}: {detail}"
                ),
            )
        };
        let (repo, tag, digest) = split_repo(&reference);
        let remote = match (tag, digest) {
            (_, Some(d)) => self.catalogue.values().find(|r| split_repo(&r.name).0 == repo && r.digest == d),
            _ => self.catalogue.get(&reference),
        };
        let Some(remote) = remote else {
            return Err(fail(StatusCode::NotFound, format!("{reference}: not found")));
        };
        if let Some((user, password)) = &remote.credentials {
            let host = repo.split('/').next().unwrap_or(repo);
            let what = match (tag, digest) {
                (_, Some(d)) => d.to_string(),
                (Some(t), None) => t.to_string(),
                (None, None) => "latest".to_string(),
            };
            let unauthorized = || {
                fail(
                    StatusCode::Unknown,
                    format!("pulling from host {host} failed with status code [manifests {what}]: 401 Unauthorized"),
                )
            };
            let Some(auth) = auth else { return Err(unauthorized()) };
            // containerd 1.6 ParseAuth: a server address that does not parse as
            // a URL fails the pull; one naming another host is ignored.
            if !auth.server_address.is_empty() {
                match server_host(&auth.server_address) {
                    Err(detail) => return Err(fail(StatusCode::Unknown, detail)),
                    Ok(h) if h != host => return Err(unauthorized()),
                    Ok(_) => {}
                }
            }
            let (u, p) = auth.basic_credentials().ok_or_else(unauthorized)?;
            let taken = |(user, password): &(String, crate::domain::Secret)| u == *user && p == *password;
            if !taken(&(user.clone(), password.clone())) && !remote.also_accepted.iter().any(taken) {
                return Err(unauthorized());
            }
        }
        let used = self.used_bytes();
        let already = self.images.contains_key(&remote.id);
        if !already && used.saturating_add(remote.size) > self.capacity_bytes {
            return Err(err(
                StatusCode::Unknown,
                format!(
                    "failed to pull and unpack image {reference:?}: failed to extract layer: write /var/lib/containerd: no space left on device"
                ),
            ));
        }
        Ok(PlannedPull { remote: remote.clone(), by_tag: digest.is_none(), repo: repo.to_string(), reference })
    }

    /// Records a finished pull and returns the image id. A tag moves to the
    /// newly pulled image, as in containerd.
    pub fn finish_pull(&mut self, p: &PlannedPull, spec: &ImageSpec) -> String {
        let tag = if p.by_tag { Some(p.reference.clone()) } else { None };
        let repo_digest = format!("{}@{}", p.repo, p.remote.digest);
        // Whether anything a state directory keeps changed (a pull of what
        // is already there changes nothing and costs no write).
        let mut changed = false;
        if let Some(t) = &tag {
            let had_it = self.images.get(&p.remote.id).is_some_and(|i| i.repo_tags.contains(t));
            changed |= !had_it;
            for img in self.images.values_mut() {
                img.repo_tags.retain(|x| x != t);
            }
        }
        let img = self.images.entry(p.remote.id.clone()).or_insert_with(|| {
            changed = true;
            Image {
                id: p.remote.id.clone(),
                size: p.remote.size,
                spec: Some(ImageSpec {
                    image: p.remote.id.clone(),
                    runtime_handler: spec.runtime_handler.clone(),
                    ..ImageSpec::default()
                }),
                ..Image::default()
            }
        });
        if let Some(t) = tag
            && !img.repo_tags.contains(&t)
        {
            img.repo_tags.push(t);
        }
        if !img.repo_digests.contains(&repo_digest) {
            img.repo_digests.push(repo_digest);
            changed = true;
        }
        let id = img.id.clone();
        // An image left with no names is gone, as containerd garbage-collects it.
        self.images.retain(|_, i| !i.repo_tags.is_empty() || !i.repo_digests.is_empty());
        if changed {
            self.touch();
        }
        id
    }

    /// `RemoveImage`: removes the image the reference, id or unambiguous id
    /// prefix resolves to (all its tags); an absent image is success, as in
    /// containerd.
    ///
    /// # Errors
    ///
    /// An ambiguous id prefix ([`lookup`](Self::lookup)); nothing is removed.
    pub fn remove_image(&mut self, spec: &ImageSpec) -> Result<(), CriError> {
        if let Some(id) = self.lookup(&spec.image)?.map(|i| i.id.clone()) {
            // containerd removes pinned images too: pinning only stops GC.
            self.images.remove(&id);
            self.touch();
        }
        Ok(())
    }

    /// Sum of image sizes.
    pub fn used_bytes(&self) -> u64 {
        self.images.values().map(|i| i.size).sum()
    }

    /// `ImageFsInfo` for the simulated filesystem.
    pub fn image_fs_info(&self) -> ImageFsInfo {
        let usage = FilesystemUsage {
            timestamp: SystemTime::now(),
            mountpoint: IMAGE_FS_MOUNTPOINT.to_string(),
            used_bytes: Some(self.used_bytes()),
            inodes_used: Some(self.images.len() as u64),
        };
        ImageFsInfo { image_filesystems: vec![usage.clone()], container_filesystems: vec![usage] }
    }

    /// `ListContainers`.
    pub fn list_containers(&self, f: &ContainerFilter) -> Vec<Container> {
        self.containers
            .iter()
            .filter(|c| f.id.as_ref().is_none_or(|id| c.id == *id))
            .filter(|c| f.state.is_none_or(|s| c.state == s))
            .filter(|c| f.pod_sandbox_id.as_ref().is_none_or(|p| c.pod_sandbox_id == *p))
            .filter(|c| f.label_selector.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .cloned()
            .collect()
    }

    /// `ListPodSandbox`.
    pub fn list_pod_sandbox(&self, f: &PodSandboxFilter) -> Vec<PodSandbox> {
        self.sandboxes
            .iter()
            .filter(|s| f.id.as_ref().is_none_or(|id| s.id == *id))
            .filter(|s| f.state.is_none_or(|st| s.state == st))
            .filter(|s| f.label_selector.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .cloned()
            .collect()
    }

    /// `ContainerStatus`; NotFound with containerd's text when absent.
    pub fn container_status(&self, id: &str) -> Result<ContainerStatus, CriError> {
        let c = self.containers.iter().find(|c| c.id == id).ok_or_else(|| {
            err(StatusCode::NotFound, format!("an error occurred when try to find container {id:?}: not found"))
        })?;
        Ok(ContainerStatus {
            id: c.id.clone(),
            name: c.name.clone(),
            state: c.state,
            created_at: c.created_at,
            image: c.image.clone(),
            image_ref: c.image_ref.clone(),
            image_id: c.image_id.clone(),
            ..ContainerStatus::default()
        })
    }
}

/// A digest go-digest parses: a known algorithm and its full hex length.
fn is_full_digest(s: &str) -> bool {
    s.split_once(':').is_some_and(|(alg, hex)| {
        let len = match alg {
            "sha256" => 64,
            "sha384" => 96,
            "sha512" => 128,
            _ => return false,
        };
        hex.len() == len && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// The host of a `server_address` as Go's `url.Parse` sees it: with a
/// scheme, the part before the first `/`; without one, a colon in the first
/// segment is a parse error and anything else has no host.
fn server_host(addr: &str) -> Result<String, String> {
    match addr.split_once("://") {
        Some((_, rest)) => Ok(rest.split('/').next().unwrap_or("").to_string()),
        None if addr.split('/').next().is_some_and(|first| first.contains(':')) => {
            Err(format!("parse server address: parse {addr:?}: first path segment in URL cannot contain colon"))
        }
        None => Ok(String::new()),
    }
}

#[cfg(test)]
mod tests;
