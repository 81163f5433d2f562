//! The simulated node's exec credential-provider plugin: a stand-in for the
//! executable ([`PluginRunner`]) that answers as the plan says, on the
//! node's paused clock. The provider around it is imaged's own code (the
//! `matchImages` check, the request, the timeout, single flight, the
//! response's checks, the cache), registered from a real
//! `CredentialProviderConfig` file as the daemon registers its plugins.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::log::{Log, PluginOutcome, What};
use super::plan::{
    CacheKey, Malformed, PLUGIN_REGISTRY, PLUGIN_TOKEN, PLUGIN_USER, PluginBehaviour, PluginMode, PluginPlan,
    ROBOT_PASSWORD, ROBOT_USER, STALE_TOKEN,
};
use crate::credentials::plugin::ProviderSpec;
use crate::credentials::{PluginOutput, PluginRunner};

/// The provider's name (and its executable's, in the bin directory).
pub const NAME: &str = "sim-registry-plugin";

/// The provider API version it is configured with.
const API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

/// What a failing run writes on its stderr (never to be shown).
pub const STDERR_TOKEN: &str = "refresh-token=rt-5b0d";

/// The plugin: its behaviour now, and where its runs are logged.
#[derive(Debug)]
pub struct SimPlugin {
    plan: PluginPlan,
    now: Mutex<PluginBehaviour>,
    log: Log,
    start: Instant,
    runs: Mutex<u64>,
}

impl SimPlugin {
    /// The plugin of `plan`, healthy, logging to `log` (times since `start`).
    pub fn new(plan: PluginPlan, log: Log, start: Instant) -> Arc<Self> {
        Arc::new(Self { plan, now: Mutex::new(plan.healthy), log, start, runs: Mutex::new(0) })
    }

    /// From now on it behaves like `b`.
    pub fn set(&self, b: PluginBehaviour) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = b;
    }

    /// Healthy again, as at the start.
    pub fn heal(&self) {
        self.set(self.plan.healthy);
    }

    /// Writes its `CredentialProviderConfig` and an executable (never run)
    /// under `dir`; returns the config file and the bin directory.
    pub fn install(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        std::fs::write(bin.join(NAME), "#!/bin/sh\nexit 1\n")?;
        let mut matches = format!("\"{PLUGIN_REGISTRY}\"");
        if self.plan.covers_private {
            matches.push_str(", \"private.example\"");
        }
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: {NAME}\n    matchImages: [{matches}]\n    defaultCacheDuration: \"{}s\"\n    apiVersion: {API_VERSION}\n",
            self.plan.default_cache.as_secs()
        );
        let file = dir.join("providers.yaml");
        std::fs::write(&file, config)?;
        Ok((file, bin))
    }

    fn response(&self, key: CacheKey, duration: Option<Duration>, token: &str) -> String {
        let duration = duration.map(|d| format!(",\"cacheDuration\":\"{}s\"", d.as_secs())).unwrap_or_default();
        let registry = format!("\"{PLUGIN_REGISTRY}\":{{\"username\":\"{PLUGIN_USER}\",\"password\":\"{token}\"}}");
        let robot = format!("\"private.example\":{{\"username\":\"{ROBOT_USER}\",\"password\":\"{ROBOT_PASSWORD}\"}}");
        let auth = if self.plan.covers_private { format!("{registry},{robot}") } else { registry };
        format!(
            "{{\"apiVersion\":\"{API_VERSION}\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"{key:?}\"{duration},\"auth\":{{{auth}}}}}"
        )
    }

    /// What a run in `mode` writes and how it exits.
    fn output(&self, mode: PluginMode) -> (PluginOutcome, PluginOutput) {
        let ok = |stdout: String| PluginOutput { code: Some(0), stdout: stdout.into_bytes(), stderr: Vec::new() };
        match mode {
            PluginMode::Healthy { key, duration } => {
                (PluginOutcome::Credentials { stale: false }, ok(self.response(key, duration, PLUGIN_TOKEN)))
            }
            PluginMode::Stale { key, duration } => {
                (PluginOutcome::Credentials { stale: true }, ok(self.response(key, duration, STALE_TOKEN)))
            }
            PluginMode::Exits(code) => (
                PluginOutcome::Exited(code),
                PluginOutput {
                    code: Some(code),
                    stdout: Vec::new(),
                    stderr: format!("error: the registry refused {STALE_TOKEN}; {STDERR_TOKEN}\n").into_bytes(),
                },
            ),
            PluginMode::Malformed(m) => {
                let body = match m {
                    Malformed::NotJson => format!("{{\"apiVersion\":\"{API_VERSION}\",\"kind\":"),
                    Malformed::WrongVersion => self
                        .response(CacheKey::Image, None, PLUGIN_TOKEN)
                        .replace(API_VERSION, "credentialprovider.kubelet.k8s.io/v1alpha1"),
                    Malformed::BadCacheKeyType => {
                        self.response(CacheKey::Image, None, PLUGIN_TOKEN).replace("\"Image\"", "\"Forever\"")
                    }
                };
                (PluginOutcome::Malformed(m), ok(body))
            }
            // Not reached: a hanging run never answers.
            PluginMode::Hangs => (PluginOutcome::CutOff, PluginOutput::default()),
        }
    }
}

/// Logs a run that did not answer when it is dropped (the provider's
/// timeout, or the process killed).
struct Unanswered {
    log: Log,
    start: Instant,
    run: u64,
    answered: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.answered {
            self.log.push(self.start.elapsed(), What::PluginEnded { run: self.run, outcome: PluginOutcome::CutOff });
        }
    }
}

/// The image a request asks about.
fn requested_image(stdin: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("image").and_then(serde_json::Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

impl PluginRunner for SimPlugin {
    fn run<'a>(
        &'a self,
        _executable: &'a Path,
        _spec: &'a ProviderSpec,
        stdin: Vec<u8>,
    ) -> BoxFuture<'a, Result<PluginOutput, String>> {
        let behaviour = *self.now.lock().unwrap_or_else(PoisonError::into_inner);
        let run = {
            let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            *runs += 1;
            *runs
        };
        let image = requested_image(&stdin);
        self.log.push(self.start.elapsed(), What::PluginRun { run, image });
        let guard = Unanswered { log: self.log.clone(), start: self.start, run, answered: false };
        Box::pin(async move {
            // The whole guard moves in: dropped with the run.
            let mut guard = guard;
            tokio::time::sleep(behaviour.latency).await;
            if behaviour.mode == PluginMode::Hangs {
                std::future::pending::<()>().await;
            }
            let (outcome, output) = self.output(behaviour.mode);
            guard.answered = true;
            self.log.push(self.start.elapsed(), What::PluginEnded { run, outcome });
            Ok(output)
        })
    }
}
