//! Service-account tokens for credential plugins (KEP-4412): what a lookup
//! knows of the pod ([`PluginPod`]), where tokens and service accounts come
//! from ([`ServiceAccountTokenSource`]: the embedding agent, or the daemon's
//! TokenRequest client), and the kubelet's cache and single-flight keys.
//!
//! Tokens are [`Secret`]s: they print as `<redacted>`, and no error or log
//! line of this module holds one.

use std::collections::BTreeMap;
use std::fmt;

use futures_util::future::BoxFuture;
use sha2::{Digest as _, Sha256};

use super::config::TokenCacheType;
use crate::domain::Secret;
use crate::domain::pull_record::ImagePullServiceAccount;

/// The pod a credential lookup is for: what the kubelet takes from the
/// pod's sandbox metadata and `spec.serviceAccountName`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginPod {
    /// The pod's namespace (also the service account's).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (the token is bound to it).
    pub uid: String,
    /// The pod's service account; `None` for a pod without one (a static
    /// pod, a prefetch).
    pub service_account: Option<PodServiceAccount>,
}

/// A pod's service account as an ensure request names it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PodServiceAccount {
    /// `spec.serviceAccountName`.
    pub name: String,
    /// The service account's `metadata.uid`. Empty: imaged asks its
    /// [`ServiceAccountTokenSource`] for the account (uid and annotations).
    pub uid: String,
    /// The service account's annotations (used when `uid` is given); a
    /// plugin is sent those its `tokenAttributes` name.
    pub annotations: BTreeMap<String, String>,
    /// Tokens the caller minted, by audience: a plugin whose audience is
    /// here is sent this token instead of one from the token source.
    pub tokens: BTreeMap<String, Secret>,
}

impl fmt::Debug for PodServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Audiences are not secret; the tokens print as <redacted>.
        f.debug_struct("PodServiceAccount")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("annotations", &self.annotations)
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl PodServiceAccount {
    /// The service account `name`, to be looked up by the token source.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }
}

/// A service account as the API server has it: what a plugin in token mode
/// needs besides the token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAccountInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

/// A TokenRequest for a pod's service account, bound to the pod (the
/// kubelet's: one audience, the pod as bound object, default expiry).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenRequest {
    /// Namespace of the pod and its service account.
    pub namespace: String,
    /// The service account's name.
    pub service_account: String,
    /// The service account's uid (the API server checks it).
    pub service_account_uid: String,
    /// The pod the token is bound to.
    pub pod_name: String,
    /// Its uid.
    pub pod_uid: String,
    /// The plugin's `serviceAccountTokenAudience`.
    pub audience: String,
}

/// Why a token source gave nothing. Its text never holds a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenSourceError(pub String);

/// Where service accounts and their tokens come from: the embedding agent
/// (it holds the pod and can mint a bound token), or the daemon's client of
/// the API server (`credentials.kubeconfig`). Called on the ensure's task.
pub trait ServiceAccountTokenSource: Send + Sync + fmt::Debug {
    /// The service account `namespace/name`: its uid and annotations.
    fn service_account<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ServiceAccountInfo, TokenSourceError>>;

    /// A token for `request`'s service account, bound to its pod, for its audience.
    fn token<'a>(&'a self, request: &'a TokenRequest) -> BoxFuture<'a, Result<Secret, TokenSourceError>>;
}

/// The service account, token and annotations one plugin run uses, and the
/// keys they give (the kubelet's `cacheKeyParams`).
#[derive(Debug, Clone)]
pub(super) struct TokenContext {
    pub(super) coordinates: ImagePullServiceAccount,
    pub(super) token: Secret,
    pub(super) annotations: BTreeMap<String, String>,
    /// `generateServiceAccountCacheKey`.
    pub(super) cache_key: Vec<u8>,
    /// `getHashIfNotEmpty(token)`.
    pub(super) token_hash: String,
}

/// Appends `s` with a 2-byte big-endian length (cryptobyte's
/// `AddUint16LengthPrefixed`); a value over 65535 bytes cannot be keyed.
fn length_prefixed(out: &mut Vec<u8>, s: &str) -> Result<(), KeyTooLong> {
    let len = u16::try_from(s.len()).map_err(|_| KeyTooLong)?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// A part of a cache key over 65535 bytes (the kubelet's builder fails too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a cache key part is longer than 65535 bytes")]
pub(super) struct KeyTooLong;

fn add_annotations(out: &mut Vec<u8>, annotations: &BTreeMap<String, String>) -> Result<(), KeyTooLong> {
    let n = u32::try_from(annotations.len()).map_err(|_| KeyTooLong)?;
    out.extend_from_slice(&n.to_be_bytes());
    // BTreeMap: sorted by key, as the kubelet sorts them.
    for (k, v) in annotations {
        length_prefixed(out, k)?;
        length_prefixed(out, v)?;
    }
    Ok(())
}

/// The kubelet's `getHashIfNotEmpty`: `sha256:<hex>`, or empty.
pub(super) fn token_hash(token: &Secret) -> String {
    if token.is_empty() {
        return String::new();
    }
    format!("sha256:{}", crate::domain::go_text::hex(&Sha256::digest(token.expose().as_bytes())))
}

/// The kubelet's `generateServiceAccountCacheKey`: namespace, name, uid and
/// annotations; with cache type `Token` also the token's hash, so such an
/// entry serves only the token it was got with.
pub(super) fn service_account_cache_key(
    coordinates: &ImagePullServiceAccount,
    annotations: &BTreeMap<String, String>,
    cache_type: TokenCacheType,
    token_hash: &str,
) -> Result<Vec<u8>, KeyTooLong> {
    let mut out = Vec::new();
    length_prefixed(&mut out, &coordinates.namespace)?;
    length_prefixed(&mut out, &coordinates.name)?;
    length_prefixed(&mut out, &coordinates.uid)?;
    add_annotations(&mut out, annotations)?;
    if cache_type == TokenCacheType::Token {
        length_prefixed(&mut out, "token")?;
        length_prefixed(&mut out, token_hash)?;
    }
    Ok(out)
}

/// The kubelet's `generateCacheKey`: the base key (image, registry or
/// global) and the service-account key (empty without a token).
pub(super) fn cache_key(base: &str, service_account_key: &[u8]) -> Result<Vec<u8>, KeyTooLong> {
    let mut out = Vec::new();
    length_prefixed(&mut out, base)?;
    let len = u16::try_from(service_account_key.len()).map_err(|_| KeyTooLong)?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(service_account_key);
    Ok(out)
}

/// The kubelet's `generateSingleFlightKey` in token mode: concurrent runs
/// merge only for the same image, token and annotations.
pub(super) fn single_flight_key(
    image: &str,
    token_hash: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<u8>, KeyTooLong> {
    let mut out = Vec::new();
    length_prefixed(&mut out, image)?;
    length_prefixed(&mut out, token_hash)?;
    add_annotations(&mut out, annotations)?;
    Ok(out)
}

/// The kubelet's `CredentialProviderRequest` as its JSON encoder writes it:
/// `kind`, `apiVersion`, `image`, then `serviceAccountToken` and
/// `serviceAccountAnnotations` (keys sorted) when set, Go's string escaping,
/// a newline at the end. Holds the token: never log it.
pub(super) fn request_body(
    api_version: &str,
    image: &str,
    token: &Secret,
    annotations: &BTreeMap<String, String>,
) -> Vec<u8> {
    use crate::domain::go_text::json_string;
    let mut s = String::from("{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":");
    json_string(&mut s, api_version);
    s.push_str(",\"image\":");
    json_string(&mut s, image);
    if !token.is_empty() {
        s.push_str(",\"serviceAccountToken\":");
        json_string(&mut s, token.expose());
    }
    if !annotations.is_empty() {
        s.push_str(",\"serviceAccountAnnotations\":{");
        for (i, (k, v)) in annotations.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            json_string(&mut s, k);
            s.push(':');
            json_string(&mut s, v);
        }
        s.push('}');
    }
    s.push_str("}\n");
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_written_as_the_kubelets_encoder_writes_it() {
        let none = BTreeMap::new();
        assert_eq!(
            String::from_utf8(request_body(
                "credentialprovider.kubelet.k8s.io/v1",
                "r.io/a<b>",
                &Secret::default(),
                &none
            ))
            .expect("utf8"),
            "{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"image\":\"r.io/a\\u003cb\\u003e\"}\n"
        );
        let annotations =
            BTreeMap::from([("z.io/b".to_string(), "2".to_string()), ("a.io/a".to_string(), "1&".to_string())]);
        assert_eq!(
            String::from_utf8(request_body("v", "i", &Secret::new("tok"), &annotations)).expect("utf8"),
            "{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"v\",\"image\":\"i\",\"serviceAccountToken\":\"tok\",\"serviceAccountAnnotations\":{\"a.io/a\":\"1\\u0026\",\"z.io/b\":\"2\"}}\n"
        );
    }

    #[test]
    fn token_cache_keys_hold_the_token_only_for_cache_type_token() {
        let sa = ImagePullServiceAccount { uid: "u".into(), namespace: "ns".into(), name: "sa".into() };
        let none = BTreeMap::new();
        let (h1, h2) = (token_hash(&Secret::new("t1")), token_hash(&Secret::new("t2")));
        assert_ne!(h1, h2);
        assert!(h1.starts_with("sha256:") && h1.len() == 7 + 64);
        assert_eq!(token_hash(&Secret::default()), "");
        let by_sa = |h: &str| service_account_cache_key(&sa, &none, TokenCacheType::ServiceAccount, h).expect("key");
        let by_token = |h: &str| service_account_cache_key(&sa, &none, TokenCacheType::Token, h).expect("key");
        assert_eq!(by_sa(&h1), by_sa(&h2), "one entry per service account");
        assert_ne!(by_token(&h1), by_token(&h2), "one entry per token");
        // The layout: u16 length + bytes per part, u32 count of annotations.
        assert_eq!(by_sa(""), b"\x00\x02ns\x00\x02sa\x00\x01u\x00\x00\x00\x00".to_vec());
        let other = ImagePullServiceAccount { uid: "u2".into(), ..sa.clone() };
        assert_ne!(
            service_account_cache_key(&other, &none, TokenCacheType::ServiceAccount, "").expect("key"),
            by_sa("")
        );
        let annotated = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert_ne!(
            service_account_cache_key(&sa, &annotated, TokenCacheType::ServiceAccount, "").expect("key"),
            by_sa("")
        );
        assert_eq!(cache_key("img", b"").expect("key"), b"\x00\x03img\x00\x00".to_vec());
        assert_eq!(cache_key(&"x".repeat(70_000), b""), Err(KeyTooLong));
    }

    #[test]
    fn a_service_account_prints_its_tokens_redacted() {
        let sa = PodServiceAccount {
            name: "builder".into(),
            tokens: BTreeMap::from([("registry.example".to_string(), Secret::new("eyJhbGciOi.secret"))]),
            ..PodServiceAccount::default()
        };
        let shown = format!("{sa:?}");
        assert!(
            shown.contains("builder") && shown.contains("registry.example") && !shown.contains("eyJhbGciOi"),
            "{shown}"
        );
    }
}
