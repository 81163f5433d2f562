//! containerd's `ParseDockerRef` for the embedded runtime: normalise a
//! reference and add `:latest` when it has neither tag nor digest; a
//! reference with both keeps only the digest.

/// The normalised reference containerd would store, or the parse error text.
pub fn docker_ref(s: &str) -> Result<String, String> {
    // TEMPORARY: replaced by domain::reference once it lands.
    if s.is_empty() || s.contains(char::is_whitespace) || s.contains("://") {
        return Err("invalid reference format".into());
    }
    let (name, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (s, None),
    };
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match name[slash..].rfind(':') {
        Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
        None => (name, None),
    };
    let first = repo.split('/').next().unwrap_or("");
    let full = if repo.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost") {
        repo.to_string()
    } else if repo.contains('/') {
        format!("docker.io/{repo}")
    } else {
        format!("docker.io/library/{repo}")
    };
    Ok(match (tag, digest) {
        (_, Some(d)) => format!("{full}@{d}"),
        (Some(t), None) => format!("{full}:{t}"),
        (None, None) => format!("{full}:latest"),
    })
}
