//! The fields of a `kubelet.config.k8s.io/v1beta1` KubeletConfiguration, to
//! find the ones the kubelet does not know (a misspelled `imageMinimumGCAg`
//! is otherwise ignored without a word). The kubelet decodes its file
//! strictly first and, when that fails only on unknown fields, decodes it
//! again leniently and logs `Using lenient decoding as strict decoding
//! failed` with `strict decoding error: unknown field "…"` (paths as
//! sigs.k8s.io/json writes them: `authentication.x509.foo`,
//! `shutdownGracePeriodByPodPriority[0].foo`). imaged does the same.
//!
//! Structs whose fields are listed below are checked to any depth; maps
//! (`evictionHard`, `featureGates`, …) have free keys, and `logging` and
//! `tracing` (component-base types with their own versions) are not checked.

use serde_yaml_ng::Value;

/// What a field holds, as far as finding unknown fields goes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shape {
    /// A scalar, a map with free keys, or a type not checked.
    Any,
    /// An object with these fields.
    Struct(&'static [(&'static str, Shape)]),
    /// A list of objects with these fields.
    List(&'static [(&'static str, Shape)]),
}

use Shape::{Any, List, Struct};

const X509: &[(&str, Shape)] = &[("clientCAFile", Any)];
const WEBHOOK_AUTHN: &[(&str, Shape)] = &[("enabled", Any), ("cacheTTL", Any)];
const ANONYMOUS: &[(&str, Shape)] = &[("enabled", Any)];
const AUTHENTICATION: &[(&str, Shape)] =
    &[("x509", Struct(X509)), ("webhook", Struct(WEBHOOK_AUTHN)), ("anonymous", Struct(ANONYMOUS))];
const WEBHOOK_AUTHZ: &[(&str, Shape)] = &[("cacheAuthorizedTTL", Any), ("cacheUnauthorizedTTL", Any)];
const AUTHORIZATION: &[(&str, Shape)] = &[("mode", Any), ("webhook", Struct(WEBHOOK_AUTHZ))];
const MEMORY_SWAP: &[(&str, Shape)] = &[("swapBehavior", Any)];
const CRASH_LOOP_BACK_OFF: &[(&str, Shape)] = &[("maxContainerRestartPeriod", Any)];
const USER_NAMESPACES: &[(&str, Shape)] = &[("idsPerPod", Any)];
const SHUTDOWN_BY_PRIORITY: &[(&str, Shape)] = &[("priority", Any), ("shutdownGracePeriodSeconds", Any)];
const MEMORY_RESERVATION: &[(&str, Shape)] = &[("numaNode", Any), ("limits", Any)];
const TAINT: &[(&str, Shape)] = &[("key", Any), ("value", Any), ("effect", Any), ("timeAdded", Any)];

/// Every top-level field of the v1beta1 KubeletConfiguration (Kubernetes
/// 1.35), plus `podSandboxImage`, which some distributions add and imaged
/// reads.
pub(super) const KUBELET_CONFIGURATION: &[(&str, Shape)] = &[
    ("apiVersion", Any),
    ("kind", Any),
    ("enableServer", Any),
    ("staticPodPath", Any),
    ("podLogsDir", Any),
    ("syncFrequency", Any),
    ("fileCheckFrequency", Any),
    ("httpCheckFrequency", Any),
    ("staticPodURL", Any),
    ("staticPodURLHeader", Any),
    ("address", Any),
    ("port", Any),
    ("readOnlyPort", Any),
    ("tlsCertFile", Any),
    ("tlsPrivateKeyFile", Any),
    ("tlsCipherSuites", Any),
    ("tlsCurvePreferences", Any),
    ("tlsMinVersion", Any),
    ("rotateCertificates", Any),
    ("serverTLSBootstrap", Any),
    ("authentication", Struct(AUTHENTICATION)),
    ("authorization", Struct(AUTHORIZATION)),
    ("registryPullQPS", Any),
    ("registryBurst", Any),
    ("imagePullCredentialsVerificationPolicy", Any),
    ("preloadedImagesVerificationAllowlist", Any),
    ("eventRecordQPS", Any),
    ("eventBurst", Any),
    ("enableDebuggingHandlers", Any),
    ("enableContentionProfiling", Any),
    ("healthzPort", Any),
    ("healthzBindAddress", Any),
    ("oomScoreAdj", Any),
    ("clusterDomain", Any),
    ("clusterDNS", Any),
    ("streamingConnectionIdleTimeout", Any),
    ("nodeStatusUpdateFrequency", Any),
    ("nodeStatusReportFrequency", Any),
    ("nodeLeaseDurationSeconds", Any),
    ("imageMinimumGCAge", Any),
    ("imageMaximumGCAge", Any),
    ("imageGCHighThresholdPercent", Any),
    ("imageGCLowThresholdPercent", Any),
    ("volumeStatsAggPeriod", Any),
    ("kubeletCgroups", Any),
    ("systemCgroups", Any),
    ("cgroupRoot", Any),
    ("cgroupsPerQOS", Any),
    ("cgroupDriver", Any),
    ("cpuManagerPolicy", Any),
    ("singleProcessOOMKill", Any),
    ("cpuManagerPolicyOptions", Any),
    ("cpuManagerReconcilePeriod", Any),
    ("draManagerReconcilePeriod", Any),
    ("memoryManagerPolicy", Any),
    ("topologyManagerPolicy", Any),
    ("topologyManagerScope", Any),
    ("topologyManagerPolicyOptions", Any),
    ("qosReserved", Any),
    ("runtimeRequestTimeout", Any),
    ("hairpinMode", Any),
    ("maxPods", Any),
    ("podCIDR", Any),
    ("podPidsLimit", Any),
    ("resolvConf", Any),
    ("runOnce", Any),
    ("cpuCFSQuota", Any),
    ("cpuCFSQuotaPeriod", Any),
    ("nodeStatusMaxImages", Any),
    ("maxOpenFiles", Any),
    ("contentType", Any),
    ("kubeAPIQPS", Any),
    ("kubeAPIBurst", Any),
    ("serializeImagePulls", Any),
    ("maxParallelImagePulls", Any),
    ("evictionHard", Any),
    ("evictionSoft", Any),
    ("evictionSoftGracePeriod", Any),
    ("evictionPressureTransitionPeriod", Any),
    ("evictionMaxPodGracePeriod", Any),
    ("evictionMinimumReclaim", Any),
    ("mergeDefaultEvictionSettings", Any),
    ("podsPerCore", Any),
    ("enableControllerAttachDetach", Any),
    ("protectKernelDefaults", Any),
    ("makeIPTablesUtilChains", Any),
    ("iptablesMasqueradeBit", Any),
    ("iptablesDropBit", Any),
    ("featureGates", Any),
    ("failSwapOn", Any),
    ("memorySwap", Struct(MEMORY_SWAP)),
    ("containerLogMaxSize", Any),
    ("containerLogMaxFiles", Any),
    ("containerLogMaxWorkers", Any),
    ("containerLogMonitorInterval", Any),
    ("configMapAndSecretChangeDetectionStrategy", Any),
    ("systemReserved", Any),
    ("kubeReserved", Any),
    ("reservedSystemCPUs", Any),
    ("showHiddenMetricsForVersion", Any),
    ("systemReservedCgroup", Any),
    ("kubeReservedCgroup", Any),
    ("enforceNodeAllocatable", Any),
    ("allowedUnsafeSysctls", Any),
    ("volumePluginDir", Any),
    ("providerID", Any),
    ("kernelMemcgNotification", Any),
    ("logging", Any),
    ("enableSystemLogHandler", Any),
    ("enableSystemLogQuery", Any),
    ("shutdownGracePeriod", Any),
    ("shutdownGracePeriodCriticalPods", Any),
    ("shutdownGracePeriodByPodPriority", List(SHUTDOWN_BY_PRIORITY)),
    ("crashLoopBackOff", Struct(CRASH_LOOP_BACK_OFF)),
    ("reservedMemory", List(MEMORY_RESERVATION)),
    ("enableProfilingHandler", Any),
    ("enableDebugFlagsHandler", Any),
    ("seccompDefault", Any),
    ("memoryThrottlingFactor", Any),
    ("memoryReservationPolicy", Any),
    ("registerWithTaints", List(TAINT)),
    ("registerNode", Any),
    ("tracing", Any),
    ("localStorageCapacityIsolation", Any),
    ("containerRuntimeEndpoint", Any),
    ("imageServiceEndpoint", Any),
    ("failCgroupV1", Any),
    ("userNamespaces", Struct(USER_NAMESPACES)),
    // Not a v1beta1 field: read by imaged (gc.sandbox_image) where a
    // distribution adds it.
    ("podSandboxImage", Any),
];

/// The most unknown fields reported, as sigs.k8s.io/json keeps.
const MAX_REPORTED: usize = 100;

/// The paths of the fields of `doc` (a KubeletConfiguration) that are not in
/// the schema, in document order, as the kubelet's strict decoding names
/// them.
pub(super) fn unknown_fields(doc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(doc, KUBELET_CONFIGURATION, "", &mut out);
    out.truncate(MAX_REPORTED);
    out
}

fn walk(v: &Value, fields: &[(&str, Shape)], path: &str, out: &mut Vec<String>) {
    let Value::Mapping(map) = v else { return };
    for (key, value) in map {
        // A key that is not a string is not a field name the kubelet could
        // know either; name it as YAML wrote it.
        let name = match key {
            Value::String(s) => s.clone(),
            other => serde_yaml_ng::to_string(other).map_or_else(|_| String::new(), |s| s.trim_end().to_string()),
        };
        let child = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        match fields.iter().find(|(f, _)| *f == name) {
            None => {
                if !out.contains(&child) {
                    out.push(child);
                }
            }
            Some((_, Shape::Any)) => {}
            Some((_, Shape::Struct(inner))) => walk(value, inner, &child, out),
            Some((_, Shape::List(inner))) => {
                if let Value::Sequence(items) = value {
                    for (i, item) in items.iter().enumerate() {
                        walk(item, inner, &format!("{child}[{i}]"), out);
                    }
                }
            }
        }
    }
}
