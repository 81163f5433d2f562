//! TEMPORARY stand-in for the reference grammar (replaced by the full module).
#![allow(missing_docs)]
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceError(pub String);
impl fmt::Display for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(&self.0) }
}
impl std::error::Error for ReferenceError {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named { name: String, tag: Option<String>, digest: Option<String> }
impl Named {
    pub fn name(&self) -> &str { &self.name }
    pub fn tag(&self) -> Option<&str> { self.tag.as_deref() }
    pub fn digest(&self) -> Option<&str> { self.digest.as_deref() }
}
impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if let Some(t) = &self.tag { write!(f, ":{t}")?; }
        if let Some(d) = &self.digest { write!(f, "@{d}")?; }
        Ok(())
    }
}

pub fn parse_normalized_named(s: &str) -> Result<Named, ReferenceError> {
    if s.is_empty() || s.contains(char::is_whitespace) || s.contains("://") {
        return Err(ReferenceError("invalid reference format".into()));
    }
    let (name, digest) = match s.split_once('@') { Some((n, d)) => (n, Some(d.to_string())), None => (s, None) };
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let (repo, tag) = match name[slash..].rfind(':') {
        Some(i) => (&name[..slash + i], Some(name[slash + i + 1..].to_string())),
        None => (name, None),
    };
    let first = repo.split('/').next().unwrap_or("");
    let has_domain = repo.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let path = if has_domain { &repo[first.len() + 1..] } else { repo };
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(ReferenceError("invalid reference format: repository name must be lowercase".into()));
    }
    let full = if has_domain { repo.to_string() } else if repo.contains('/') { format!("docker.io/{repo}") } else { format!("docker.io/library/{repo}") };
    Ok(Named { name: full, tag, digest })
}

pub fn apply_default_image_tag(s: &str) -> Result<String, ReferenceError> {
    let n = parse_normalized_named(s)?;
    if n.digest().is_none() && n.tag().is_none() { Ok(format!("{s}:latest")) } else { Ok(s.to_string()) }
}
