//! `[credentials]` (node docker config files, credential-provider plugins)
//! and `[credential_verification]` (KEP-2535).

use std::path::PathBuf;

use super::ConfigError;
use super::raw::{RawCredentialVerification, RawCredentials};
use super::values::{duration, invalid};
use crate::credentials::{DockerConfigSearch, NodeCredentialSettings};

/// The `[credentials]` section: search directories (the kubelet's order
/// from `root_dir` unless given), cache period, plugins.
pub(super) fn credentials_from_raw(c: RawCredentials) -> Result<NodeCredentialSettings, ConfigError> {
    let dirs = |key: &str, list: &[String]| -> Result<Vec<PathBuf>, ConfigError> {
        list.iter()
            .map(|d| {
                if d.trim().is_empty() {
                    Err(invalid(key, d, "a directory path must not be empty"))
                } else {
                    Ok(PathBuf::from(d))
                }
            })
            .collect()
    };
    let needs_root = c.config_json_dirs.is_none() || c.dockercfg_dirs.is_none();
    if needs_root && c.root_dir.trim().is_empty() {
        return Err(invalid(
            "credentials.root_dir",
            &c.root_dir,
            "must be a directory path (searched first for config.json and .dockercfg)",
        ));
    }
    let default = DockerConfigSearch::kubelet_default(std::path::Path::new(&c.root_dir));
    let search = DockerConfigSearch {
        config_json_dirs: match &c.config_json_dirs {
            Some(list) => dirs("credentials.config_json_dirs", list)?,
            None => default.config_json_dirs,
        },
        dockercfg_dirs: match &c.dockercfg_dirs {
            Some(list) => dirs("credentials.dockercfg_dirs", list)?,
            None => default.dockercfg_dirs,
        },
    };
    let cache_period = duration("credentials.cache_period", &c.cache_period)?;
    let provider_timeout = duration("credentials.provider_timeout", &c.provider_timeout)?;
    if provider_timeout.is_zero() {
        return Err(invalid("credentials.provider_timeout", &c.provider_timeout, "must be more than 0s"));
    }
    let path = |s: &str| (!s.trim().is_empty()).then(|| PathBuf::from(s));
    let (provider_config, provider_bin_dir) = (path(&c.provider_config), path(&c.provider_bin_dir));
    match (&provider_config, &provider_bin_dir) {
        (None, Some(_)) => {
            return Err(invalid(
                "credentials.provider_config",
                &c.provider_config,
                "credential provider config path is empty (required when credentials.provider_bin_dir is set)",
            ));
        }
        (Some(_), None) => {
            return Err(invalid(
                "credentials.provider_bin_dir",
                &c.provider_bin_dir,
                "the plugin binary directory is required when credentials.provider_config is set",
            ));
        }
        _ => {}
    }
    Ok(NodeCredentialSettings {
        search,
        cache_period,
        provider_config,
        provider_bin_dir,
        provider_timeout,
        kubeconfig: path(&c.kubeconfig),
        token_source: None,
        plugin_runner: None,
        metrics: crate::metrics::Metrics::default(),
    })
}

/// The kubelet's `imagePullCredentialsVerificationPolicy` and
/// `preloadedImagesVerificationAllowlist`, with its texts.
pub(super) fn verification_from_raw(
    v: RawCredentialVerification,
) -> Result<crate::pull_records::VerifyPolicy, ConfigError> {
    use crate::pull_records::{Allowlist, VerificationPolicy, VerifyPolicy};
    let policy: VerificationPolicy = v.policy.parse().map_err(|e: crate::pull_records::UnknownPolicy| {
        invalid("credential_verification.policy", &v.policy, e.to_string())
    })?;
    for p in &v.allowlist {
        Allowlist::new(std::slice::from_ref(p))
            .map_err(|e| invalid("credential_verification.allowlist", p, e.to_string()))?;
    }
    let allowlist = Allowlist::new(&v.allowlist)
        .map_err(|e| invalid("credential_verification.allowlist", &v.allowlist.join(","), e.to_string()))?;
    Ok(VerifyPolicy { policy, allowlist })
}
