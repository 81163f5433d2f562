//! Build small single-layer images and push them to a registry over the Registry HTTP API v2.
//!
//! No docker, no skopeo: the layer is a tar of the given files (gzipped), the image config is a
//! minimal OCI config, and blobs and the manifest are uploaded with plain HTTP requests
//! (`reqwest` without TLS). Meant for the loopback registries started by
//! `.ci/containerd-env.sh` (`docker-registry` 2.8, optionally with htpasswd Basic auth).
//!
//! ```ignore
//! let reg = Registry::open("127.0.0.1:5000");
//! let img = reg.push_image("demo/hello", "v1", &[("hello.txt", b"hi\n")]).await?;
//! // img.reference == "127.0.0.1:5000/demo/hello:v1"
//! // img.config_digest is the image id containerd reports (`sha256:...`).
//! ```
//!
//! Determinism: tar headers use mtime 0, uid/gid 0, mode 0644 (files) / 0755 (directories),
//! the gzip header has mtime 0 and no file name, and JSON is serialized with sorted keys, so the
//! same `files` (and the same machine architecture) always give the same digests. Two pushes
//! with identical files therefore give the *same image id*: vary the file contents when a test
//! needs distinct images.
//!
//! Every HTTP request has a bounded timeout ([`HTTP_TIMEOUT`]); nothing follows redirects or
//! reads proxy settings. Errors are returned, never panicked on.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Error type of this module.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Upper bound for one HTTP request (connect + send + response body).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for establishing a TCP connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image config media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI gzipped layer media type.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Docker schema2 manifest media type.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker schema2 image config media type.
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// Docker schema2 gzipped layer media type.
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// A registry reachable over plain HTTP.
#[derive(Debug, Clone)]
pub struct Registry {
    /// `host:port`, e.g. `"127.0.0.1:5000"` (no scheme).
    pub addr: String,
    /// Basic-auth credentials `(user, password)`, sent on every request when set.
    pub auth: Option<(String, String)>,
}

/// What [`Registry::push_image`] pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedImage {
    /// `"127.0.0.1:PORT/repo:tag"`, ready for a CRI `PullImage`.
    pub reference: String,
    /// `"sha256:..."` of the manifest bytes (the repo digest: `127.0.0.1:PORT/repo@<this>`).
    pub manifest_digest: String,
    /// `"sha256:..."` of the image config: the image id containerd/CRI report.
    pub config_digest: String,
    /// Compressed layer + config + manifest bytes. This is the sum containerd 1.6 walks for the
    /// CRI `Image.size` (every descriptor under the manifest, plus the manifest itself).
    pub size: u64,
    /// `"sha256:..."` of the gzipped layer blob.
    pub layer_digest: String,
    /// `"sha256:..."` of the uncompressed layer tar (the config's `rootfs.diff_ids[0]`).
    pub diff_id: String,
}

/// Which manifest schema to push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ManifestFormat {
    /// `application/vnd.oci.image.manifest.v1+json` with OCI config/layer media types.
    #[default]
    Oci,
    /// Docker schema2 `application/vnd.docker.distribution.manifest.v2+json`.
    Docker,
}

impl ManifestFormat {
    fn media_types(self) -> (&'static str, &'static str, &'static str) {
        match self {
            ManifestFormat::Oci => (OCI_MANIFEST, OCI_CONFIG, OCI_LAYER_GZIP),
            ManifestFormat::Docker => (DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER_GZIP),
        }
    }
}

/// A built (not yet pushed) image: all blobs plus their digests.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    /// Gzipped layer tar.
    pub layer_gz: Vec<u8>,
    /// `sha256:` of `layer_gz`.
    pub layer_digest: String,
    /// `sha256:` of the uncompressed tar.
    pub diff_id: String,
    /// Image config JSON.
    pub config: Vec<u8>,
    /// `sha256:` of `config`.
    pub config_digest: String,
    /// Manifest JSON.
    pub manifest: Vec<u8>,
    /// `sha256:` of `manifest`.
    pub manifest_digest: String,
    /// The manifest's media type.
    pub manifest_media_type: &'static str,
}

/// `"sha256:<hex>"` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in &hash {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The OCI `architecture` name of the machine running the tests (`x86_64` -> `amd64`, ...).
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        other => other,
    }
}

/// The OCI `os` name of the machine (`linux`, ...).
pub fn oci_os() -> &'static str {
    std::env::consts::OS
}

/// Normalizes a file path for the layer: drops leading `/`, empty and `.` components; rejects
/// `..` components and paths that end up empty.
fn layer_path(path: &str) -> Result<String, BoxError> {
    let trimmed = path.trim_start_matches('/');
    let mut parts = Vec::new();
    for part in trimmed.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("invalid path component \"..\" in {path:?}").into()),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(format!("empty file path {path:?}").into());
    }
    Ok(parts.join("/"))
}

/// Builds the uncompressed layer tar: parent directories first (sorted), then the files in the
/// given order. All headers are deterministic (mtime 0, uid/gid 0, ustar).
pub fn build_layer_tar(files: &[(&str, &[u8])]) -> Result<Vec<u8>, BoxError> {
    let mut normalized = Vec::with_capacity(files.len());
    let mut dirs = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (path, data) in files {
        let p = layer_path(path)?;
        if !seen.insert(p.clone()) {
            return Err(format!("duplicate file path {p:?}").into());
        }
        let mut acc = String::new();
        let comps: Vec<&str> = p.split('/').collect();
        for comp in &comps[..comps.len() - 1] {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(comp);
            dirs.insert(acc.clone());
        }
        normalized.push((p, *data));
    }
    for (p, _) in &normalized {
        if dirs.contains(p) {
            return Err(format!("{p:?} is both a file and a directory").into());
        }
    }

    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    for dir in &dirs {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(0);
        builder.append_data(&mut header, format!("{dir}/"), std::io::empty())?;
    }
    for (p, data) in &normalized {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(u64::try_from(data.len())?);
        builder.append_data(&mut header, p, *data)?;
    }
    Ok(builder.into_inner()?)
}

/// Gzips `data` deterministically (header mtime 0, no file name).
pub fn gzip(data: &[u8]) -> Result<Vec<u8>, BoxError> {
    let mut enc = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    enc.write_all(data)?;
    Ok(enc.finish()?)
}

/// What an image's config says besides its layer (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageOptions {
    /// The config's `User` (`"1002"`, `"www-data"`, `"1003:1004"`, `"name:group"`); unset when `None`.
    pub user: Option<String>,
}

/// Builds layer, config and manifest for `files` without touching the network.
pub fn build_image(files: &[(&str, &[u8])], format: ManifestFormat) -> Result<BuiltImage, BoxError> {
    build_image_with(files, format, &ImageOptions::default())
}

/// Like [`build_image`], with the config's optional fields from `options`.
pub fn build_image_with(
    files: &[(&str, &[u8])],
    format: ManifestFormat,
    options: &ImageOptions,
) -> Result<BuiltImage, BoxError> {
    let (manifest_mt, config_mt, layer_mt) = format.media_types();
    let tar = build_layer_tar(files)?;
    let diff_id = sha256_digest(&tar);
    let layer_gz = gzip(&tar)?;
    let layer_digest = sha256_digest(&layer_gz);

    let mut config_json = serde_json::json!({
        "architecture": oci_arch(),
        "os": oci_os(),
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [
            { "created": "1970-01-01T00:00:00Z", "created_by": "imaged tests/support/oci.rs" }
        ],
    });
    if let Some(user) = &options.user {
        config_json["config"]["User"] = serde_json::Value::String(user.clone());
    }
    let config = serde_json::to_vec(&config_json)?;
    let config_digest = sha256_digest(&config);

    let manifest_json = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": manifest_mt,
        "config": { "mediaType": config_mt, "digest": config_digest, "size": config.len() },
        "layers": [ { "mediaType": layer_mt, "digest": layer_digest, "size": layer_gz.len() } ],
    });
    let manifest = serde_json::to_vec(&manifest_json)?;
    let manifest_digest = sha256_digest(&manifest);

    Ok(BuiltImage {
        layer_gz,
        layer_digest,
        diff_id,
        config,
        config_digest,
        manifest,
        manifest_digest,
        manifest_media_type: manifest_mt,
    })
}

/// Checks a repository name against the distribution grammar (lowercase path components of
/// `[a-z0-9]+(?:[._-][a-z0-9]+)*` joined by `/`).
fn check_repo(repo: &str) -> Result<(), BoxError> {
    let ok = !repo.is_empty()
        && repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
                && c.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
        });
    if ok { Ok(()) } else { Err(format!("invalid repository name {repo:?}").into()) }
}

/// Checks a tag against `[\w][\w.-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), BoxError> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag.as_bytes().first().is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok { Ok(()) } else { Err(format!("invalid tag {tag:?}").into()) }
}

/// The monolithic-upload URL: the upload `Location` (absolute `http://host/v2/...` as
/// registry 2.8 sends it, or relative `/v2/...`) resolved against the URL of the `POST`,
/// with `digest=<digest>` appended to any query it already has (registry 2.8 puts `_state` there).
pub fn upload_put_url(start_url: &str, location: &str, digest: &str) -> Result<reqwest::Url, BoxError> {
    let base = reqwest::Url::parse(start_url)?;
    let mut url = base.join(location)?;
    url.query_pairs_mut().append_pair("digest", digest);
    Ok(url)
}

/// Errors if the response's `Docker-Content-Digest` header is present and differs from `expected`.
fn check_reported_digest(resp: &reqwest::Response, expected: &str, what: &str) -> Result<(), BoxError> {
    match resp.headers().get("docker-content-digest") {
        Some(got) if got.as_bytes() != expected.as_bytes() => {
            Err(format!("{what}: registry reports digest {got:?}, expected {expected}").into())
        }
        _ => Ok(()),
    }
}

/// Reads at most 512 bytes of a response body for an error message.
async fn body_snippet(resp: reqwest::Response) -> String {
    match resp.bytes().await {
        Ok(b) => {
            let s = String::from_utf8_lossy(&b[..b.len().min(512)]).into_owned();
            s.trim().to_string()
        }
        Err(e) => format!("<body unreadable: {e}>"),
    }
}

impl Registry {
    /// A registry without authentication.
    pub fn open(addr: impl Into<String>) -> Self {
        Registry { addr: addr.into(), auth: None }
    }

    /// A registry with Basic-auth credentials.
    pub fn with_auth(addr: impl Into<String>, user: impl Into<String>, pass: impl Into<String>) -> Self {
        Registry { addr: addr.into(), auth: Some((user.into(), pass.into())) }
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn client() -> Result<reqwest::Client, BoxError> {
        Ok(reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?)
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.auth {
            Some((user, pass)) => req.basic_auth(user, Some(pass)),
            None => req,
        }
    }

    /// Builds a one-layer image from `files` (`(path in image, contents)`) and pushes it as
    /// `repo:tag` with an OCI manifest. See [`Registry::push_image_as`].
    pub async fn push_image(&self, repo: &str, tag: &str, files: &[(&str, &[u8])]) -> Result<PushedImage, BoxError> {
        self.push_image_as(repo, tag, files, ManifestFormat::Oci).await
    }

    /// Like [`Registry::push_image`], with the manifest schema chosen by `format`.
    pub async fn push_image_as(
        &self,
        repo: &str,
        tag: &str,
        files: &[(&str, &[u8])],
        format: ManifestFormat,
    ) -> Result<PushedImage, BoxError> {
        self.push_image_with(repo, tag, files, format, &ImageOptions::default()).await
    }

    /// Like [`Registry::push_image_as`], with the config's optional fields from `options`.
    pub async fn push_image_with(
        &self,
        repo: &str,
        tag: &str,
        files: &[(&str, &[u8])],
        format: ManifestFormat,
        options: &ImageOptions,
    ) -> Result<PushedImage, BoxError> {
        check_repo(repo)?;
        check_tag(tag)?;
        let image = build_image_with(files, format, options)?;
        let client = Self::client()?;
        self.upload_blob(&client, repo, &image.layer_digest, &image.layer_gz).await?;
        self.upload_blob(&client, repo, &image.config_digest, &image.config).await?;
        self.put_manifest(&client, repo, tag, &image).await?;
        let size = u64::try_from(image.layer_gz.len() + image.config.len() + image.manifest.len())?;
        Ok(PushedImage {
            reference: format!("{}/{repo}:{tag}", self.addr),
            manifest_digest: image.manifest_digest,
            config_digest: image.config_digest,
            size,
            layer_digest: image.layer_digest,
            diff_id: image.diff_id,
        })
    }

    /// True if `GET /v2/` answers 200 with these credentials (401 without valid ones).
    pub async fn ping(&self) -> Result<bool, BoxError> {
        let client = Self::client()?;
        let resp = self.authed(client.get(format!("{}/v2/", self.base()))).send().await?;
        Ok(resp.status() == reqwest::StatusCode::OK)
    }

    /// Deletes `repo@digest` (the registry must run with `storage.delete.enabled: true`, which
    /// `.ci/containerd-env.sh` sets). Handy to make a tag unpullable.
    pub async fn delete_manifest(&self, repo: &str, manifest_digest: &str) -> Result<(), BoxError> {
        check_repo(repo)?;
        let client = Self::client()?;
        let url = format!("{}/v2/{repo}/manifests/{manifest_digest}", self.base());
        let resp = self.authed(client.delete(url)).send().await?;
        let status = resp.status();
        if status != reqwest::StatusCode::ACCEPTED {
            return Err(format!(
                "DELETE manifest {repo}@{manifest_digest}: HTTP {status}: {}",
                body_snippet(resp).await
            )
            .into());
        }
        Ok(())
    }

    /// Uploads one blob (skipped if the registry already has it): `POST .../blobs/uploads/`
    /// then a monolithic `PUT <Location>?digest=...`.
    async fn upload_blob(
        &self,
        client: &reqwest::Client,
        repo: &str,
        digest: &str,
        data: &[u8],
    ) -> Result<(), BoxError> {
        let blob_url = format!("{}/v2/{repo}/blobs/{digest}", self.base());
        let head = self.authed(client.head(&blob_url)).send().await?;
        match head.status() {
            reqwest::StatusCode::OK => return Ok(()),
            reqwest::StatusCode::NOT_FOUND => {}
            status => {
                return Err(format!("HEAD {blob_url}: HTTP {status}: {}", body_snippet(head).await).into());
            }
        }

        let start_url = format!("{}/v2/{repo}/blobs/uploads/", self.base());
        let resp = self.authed(client.post(&start_url)).header(reqwest::header::CONTENT_LENGTH, "0").send().await?;
        let status = resp.status();
        if status != reqwest::StatusCode::ACCEPTED {
            return Err(format!("POST {start_url}: HTTP {status}: {}", body_snippet(resp).await).into());
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .ok_or_else(|| format!("POST {start_url}: 202 without a Location header"))?
            .to_str()
            .map_err(|e| format!("POST {start_url}: bad Location header: {e}"))?
            .to_string();
        let put_url = upload_put_url(&start_url, &location, digest)?;

        let resp = self
            .authed(client.put(put_url.clone()))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, data.len().to_string())
            .body(data.to_vec())
            .send()
            .await?;
        let status = resp.status();
        if status != reqwest::StatusCode::CREATED {
            return Err(format!("PUT blob {digest} ({put_url}): HTTP {status}: {}", body_snippet(resp).await).into());
        }
        check_reported_digest(&resp, digest, "PUT blob")
    }

    async fn put_manifest(
        &self,
        client: &reqwest::Client,
        repo: &str,
        tag: &str,
        image: &BuiltImage,
    ) -> Result<(), BoxError> {
        let url = format!("{}/v2/{repo}/manifests/{tag}", self.base());
        let resp = self
            .authed(client.put(&url))
            .header(reqwest::header::CONTENT_TYPE, image.manifest_media_type)
            .body(image.manifest.clone())
            .send()
            .await?;
        let status = resp.status();
        if status != reqwest::StatusCode::CREATED {
            return Err(format!("PUT {url}: HTTP {status}: {}", body_snippet(resp).await).into());
        }
        check_reported_digest(&resp, &image.manifest_digest, &format!("PUT {url}"))
    }
}
