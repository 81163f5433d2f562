//! `imagectl` as kubectl and crictl users run it, through the real binaries
//! against `imaged run` on the embedded runtime: one flag grammar, each
//! error once on stderr with its exit code, JSON and YAML that parse into
//! the API's messages, crictl's names for `imagectl cri`, completions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};
use support::daemon::{Daemon, stderr, stdout};

/// `imagectl ARGS` with no daemon socket given (for `completion` and `cri`).
fn imagectl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_imagectl")).env_remove("RUST_LOG").args(args).output().expect("run imagectl")
}

/// Asserts `o` failed with `code` and said why in exactly one line on
/// stderr (`imagectl: error: …`, containing `want`), nothing on stdout.
fn fails_once(o: &Output, code: i32, want: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("imagectl: error: ") && err.contains(want), "{want:?} in {err}");
    assert!(o.stdout.is_empty(), "{}", stdout(o));
}

fn json_of(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn yaml_of(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_yaml_ng::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// The daemon's embedded runtime as a CRI endpoint (`imagectl cri`).
fn runtime_endpoint(d: &Daemon) -> String {
    format!("unix://{}", d.dir.path().join("cri.sock").display())
}

#[test]
fn pod_means_namespace_and_name_and_pod_uid_the_uid_in_every_command() {
    let d = Daemon::start(&[]);
    let o = d.imagectl(&["ensure", "busybox:1.36", "--pod", "web/front-1", "--pod-uid", "u1", "--priority", "-5"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = d.imagectl(&["ensure", "docker.io/library/missing:2", "--pod", "web/back-1", "--pod-uid", "u2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // events: by NAMESPACE/NAME, by UID, by image.
    let reasons = |args: &[&str]| -> Vec<(String, String)> {
        let mut all = vec!["-o", "json", "events"];
        all.extend_from_slice(args);
        let o = d.imagectl(&all);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("one JSON object per line"))
            .filter_map(|v| {
                let e = v.get("image_event")?;
                Some((
                    format!("{}/{}", e["namespace"].as_str()?, e["pod_name"].as_str()?),
                    e["reason"].as_str()?.into(),
                ))
            })
            .collect()
    };
    let front = reasons(&["--pod", "web/front-1"]);
    assert!(front.contains(&("web/front-1".into(), "Pulled".into())), "{front:?}");
    assert!(front.iter().all(|(pod, _)| pod == "web/front-1"), "{front:?}");
    assert_eq!(reasons(&["--pod-uid", "u1"]), front, "the same pod by its UID");
    let back = reasons(&["--image", "docker.io/library/missing:2"]);
    assert!(!back.is_empty() && back.iter().all(|(pod, _)| pod == "web/back-1"), "{back:?}");
    assert!(reasons(&["--pod", "web/nobody"]).is_empty());

    // A UID where NAMESPACE/NAME belongs: refused, naming the right flag.
    for args in [&["ensure", "busybox:1.36", "--pod", "u1"][..], &["events", "--pod", "u1"]] {
        let o = d.imagectl(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}");
        assert!(stderr(&o).contains("must be NAMESPACE/NAME (a pod UID goes in --pod-uid)"), "{}", stderr(&o));
    }
    // backoff clear: the UID is --pod-uid; the old `--pod UID` is refused
    // pointing to it, and clears nothing.
    let o = d.imagectl(&["backoff", "clear", "--pod", "u2"]);
    assert_eq!(o.status.code(), Some(64));
    assert!(stderr(&o).contains("a similar argument exists: '--pod-uid'"), "{}", stderr(&o));
    let listed = json_of(&d.imagectl(&["-o", "json", "backoff", "list"]));
    assert_eq!(listed["backoffs"][0]["pod_uid"], "u2", "{listed}");
    // Neither --pod-uid nor --image: a usage error that clears nothing
    // (an empty `--pod-uid "$UID"` is an error too), unless --all says so.
    for args in [&["backoff", "clear"][..], &["backoff", "clear", "--pod-uid", ""], &["events", "--pod-uid", ""]] {
        let o = d.imagectl(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
    }
    // With none, the error names every way to say what to clear.
    let o = d.imagectl(&["backoff", "clear"]);
    assert!(stderr(&o).contains("<--pod-uid <UID>|--image <IMAGE>|--all>"), "{}", stderr(&o));
    let o = d.imagectl(&["backoff", "clear", "--all", "--image", "x"]);
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    let listed = json_of(&d.imagectl(&["-o", "json", "backoff", "list"]));
    assert_eq!(listed["backoffs"][0]["pod_uid"], "u2", "{listed}");
    let o = d.imagectl(&["-o", "json", "backoff", "clear", "--pod-uid", "u2"]);
    assert_eq!(json_of(&o), json!({"cleared": 1}));
    assert_eq!(json_of(&d.imagectl(&["-o", "json", "backoff", "list"])), json!({"backoffs": []}));
    let o = d.imagectl(&["-o", "json", "backoff", "clear", "--all"]);
    assert_eq!(json_of(&o), json!({"cleared": 0}));
}

#[test]
fn each_error_is_printed_once_on_stderr_with_the_documented_exit_code() {
    let d = Daemon::start(&[]);
    // 69: no daemon on the socket.
    let nobody = d.dir.path().join("nobody.sock");
    fails_once(&support::daemon::imagectl(&nobody, &["status"]), 69, "GetStatus: ");
    // 64: a request the daemon rejects, naming the field.
    fails_once(&d.imagectl(&["ensure", "busybox", "--policy", "Sometimes"]), 64, "pull_policy: unknown pull policy");
    // 1: the runtime failed the request; its cause is in the one line, not
    // repeated on a "caused by" line.
    let endpoint = runtime_endpoint(&d);
    let o = imagectl(&["--runtime-endpoint", &endpoint, "cri", "pull", "docker.io/library/missing:9"]);
    fails_once(&o, 1, "PullImage docker.io/library/missing:9: ");
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    // 69: no runtime there, said at once: a command tries the runtime
    // once (waiting runtime.startup_timeout is the daemon's start-up).
    let gone = format!("unix://{}", d.dir.path().join("gone.sock").display());
    let started = std::time::Instant::now();
    let o = imagectl(&["--runtime-endpoint", &gone, "--set", "runtime.startup_timeout=1h", "cri", "images"]);
    fails_once(&o, 69, "gone.sock");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "not a wait: {:?}", started.elapsed());
    // 64: the default endpoint, `embedded`, is no runtime to talk to (one
    // would start empty in the command and end with it).
    let o = imagectl(&["--runtime-endpoint", "embedded", "cri", "pull", "busybox:1.36"]);
    fails_once(&o, 64, "runtime.endpoint is \"embedded\": `imagectl cri` would start an empty runtime of its own");
    assert!(stderr(&o).contains("--runtime-endpoint unix:///run/containerd/containerd.sock"), "{}", stderr(&o));
    // 64: bad usage, said once by the parser.
    let o = d.imagectl(&["ensure", "busybox", "--deadline", "soon"]);
    assert_eq!(o.status.code(), Some(64));
    assert_eq!(stderr(&o).matches("error:").count(), 1, "{}", stderr(&o));
    // A negative duration is a duration, said to be negative (not a flag).
    let o = d.imagectl(&["ensure", "busybox", "--deadline", "-5s"]);
    assert_eq!(o.status.code(), Some(64));
    assert!(
        stderr(&o).contains("must not be negative") && !stderr(&o).contains("unexpected argument"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_listener_that_never_speaks_is_no_daemon_after_the_connect_timeout_not_a_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("silent.sock");
    // Bound and listening: connections complete (the backlog) and nothing is said.
    let _silent = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let started = std::time::Instant::now();
    let o = support::daemon::imagectl(&socket, &["status"]);
    fails_once(&o, 69, "GetStatus: no answer within 5s: something accepted the connection but does not speak gRPC");
    assert!(stderr(&o).contains("silent.sock"), "{}", stderr(&o));
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "{:?}", started.elapsed());
}

#[test]
fn images_pinned_by_a_gc_rule_show_pinned_naming_the_rule_in_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("pins.toml");
    let gc = "[gc]\npinned_images = [\"docker.io/library/busybox:*\"]\nsandbox_image = \"nginx:1.27\"\n";
    std::fs::write(&config, gc).expect("write");
    let d = Daemon::start(&["--config", config.to_str().expect("utf-8")]);
    for image in ["busybox:1.36", "redis:7", "nginx:1.27"] {
        assert_eq!(d.imagectl(&["ensure", image]).status.code(), Some(0), "{image}");
    }
    let v = json_of(&d.imagectl(&["-o", "json", "images"]));
    let of = |tag: &str| {
        v["images"].as_array().and_then(|a| a.iter().find(|i| i["repo_tags"] == json!([tag])).cloned()).expect(tag)
    };
    let (busybox, redis) = (of("docker.io/library/busybox:1.36"), of("docker.io/library/redis:7"));
    assert_eq!(
        (&busybox["pinned"], &busybox["pinned_by_rule"]),
        (&json!(false), &json!("docker.io/library/busybox:*"))
    );
    assert_eq!((&redis["pinned"], &redis["pinned_by_rule"]), (&json!(false), &json!("")), "{v}");
    // The sandbox image, which GC always keeps, by its reference.
    assert_eq!(of("docker.io/library/nginx:1.27")["pinned_by_rule"], "docker.io/library/nginx:1.27", "{v}");
    // The table says PINNED true for the rule's image, false for the other.
    let table = stdout(&d.imagectl(&["images"]));
    let row = |tag: &str| table.lines().find(|l| l.ends_with(tag)).map(str::to_string).expect(tag);
    assert!(row("docker.io/library/busybox:1.36").contains(" true "), "{table}");
    assert!(row("docker.io/library/redis:7").contains(" false "), "{table}");
}

#[test]
fn a_declared_prefetch_image_is_pulled_at_start_without_a_pod_and_shown_pinned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("prefetch.toml");
    std::fs::write(&config, "[prefetch]\nimages = [\"nginx:1.27\"]\n").expect("write");
    let d = Daemon::start(&["--config", config.to_str().expect("utf-8")]);
    let nginx = || {
        let v = json_of(&d.imagectl(&["-o", "json", "images"]));
        v["images"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["repo_tags"] == json!(["docker.io/library/nginx:1.27"])).cloned())
    };
    let mut found = None;
    for _ in 0..100 {
        found = nginx();
        if found.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let found = found.expect("nginx:1.27 prefetched at start, no ensure asked for it");
    assert_eq!(found["pinned_by_rule"], "docker.io/library/nginx:1.27", "{found}");
    // The settings in force say so.
    let status = json_of(&d.imagectl(&["-o", "json", "status"]));
    assert_eq!(status["settings"]["gc"]["pinned_images"], json!(["docker.io/library/nginx:1.27"]), "{status}");
    // And what came of the declared image, with its image id.
    let declared = &status["prefetch"][0];
    assert_eq!(declared["image"], "docker.io/library/nginx:1.27", "{status}");
    assert_eq!(declared["state"], "present", "{status}");
    assert_eq!(declared["image_ref"], found["id"], "{status}");
    let table = stdout(&d.imagectl(&["status"]));
    assert!(table.contains("\nprefetch: 1 declared — 1 present\n"), "{table}");
}

#[test]
fn json_and_yaml_are_the_apis_messages_with_stable_field_names() {
    let d = Daemon::start(&[]);
    assert_eq!(d.imagectl(&["ensure", "busybox:1.36", "--pod-uid", "j1"]).status.code(), Some(0));

    // ensure: the answer's oneof, `ok` or `failure`.
    let v = json_of(&d.imagectl(&["-o", "json", "ensure", "busybox:1.36"]));
    assert!(v["ok"]["image_ref"].as_str().is_some_and(|r| r.starts_with("sha256:")), "{v}");
    let o = d.imagectl(&["-o", "yaml", "ensure", "docker.io/library/missing:3", "--pod-uid", "j2"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_yaml_ng::from_slice(&o.stdout).expect("yaml");
    assert_eq!(v["failure"]["kind"], "ErrImagePull", "{v}");
    assert!(v.get("ok").is_none(), "{v}");

    // images: the same document in both formats, numbers as numbers.
    let json_images = json_of(&d.imagectl(&["-o", "json", "images"]));
    assert_eq!(yaml_of(&d.imagectl(&["-o", "yaml", "images"])), json_images);
    let busybox = json_images["images"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["repo_tags"] == json!(["docker.io/library/busybox:1.36"])))
        .unwrap_or_else(|| panic!("{json_images}"));
    assert_eq!(busybox["size"], 4_261_574);
    assert_eq!(busybox["pinned"], false);

    // status: the settings in force as an object, typed; no string lines.
    let status = json_of(&d.imagectl(&["-o", "json", "status"]));
    let settings = &status["settings"];
    assert_eq!(settings["gc"]["image_gc_high_threshold_percent"], 85, "{status}");
    assert_eq!(settings["gc"]["image_minimum_gc_age"], "2m0s", "{status}");
    assert_eq!(settings["gc"]["pinned_images"], json!([]), "{status}");
    assert_eq!(settings["pull"]["serialize_image_pulls"], true, "{status}");
    assert_eq!(settings["pull"]["registry_pull_qps"], 5.0, "{status}");
    assert_eq!(settings["backoff"]["max"], "5m0s", "{status}");
    assert_eq!(settings["pull"]["stall_warning"], "1m0s", "{status}");
    assert!(status.get("config").is_none(), "{status}");
    assert_eq!(status["runtime_name"], "imaged-embedded");
    assert!(status["backoffs"].as_array().is_some_and(|b| b.len() == 1), "{status}");
    assert_eq!(yaml_of(&d.imagectl(&["-o", "yaml", "status"]))["settings"], *settings);

    // gc, pulls, prefetch.
    let gc = yaml_of(&d.imagectl(&["-o", "yaml", "gc", "--dry-run"]));
    assert_eq!((gc["mode"].as_str(), gc["dry_run"].as_bool()), (Some("threshold"), Some(true)), "{gc}");
    assert!(gc["entries"].as_array().is_some_and(|e| e.iter().any(|e| e["verdict"] == "keep")), "{gc}");
    let mut pulls = yaml_of(&d.imagectl(&["-o", "yaml", "pulls"]));
    let made = pulls.as_object_mut().and_then(|o| o.remove("time_ms"));
    assert!(made.and_then(|t| t.as_i64()).is_some_and(|t| t > 0), "when it was made");
    assert_eq!(pulls, json!({"pulls": [], "downloads": [], "downloads_unavailable": ""}));
    let v = json_of(&d.imagectl(&["-o", "json", "prefetch", "--wait", "busybox:1.36"]));
    assert_eq!(v["results"][0]["image"], "busybox:1.36", "{v}");
    assert_eq!(v["results"][0]["state"], "present", "{v}");

    // events: one JSON object per line; YAML documents separated by `---`.
    let o = d.imagectl(&["-o", "json", "events", "--pod-uid", "j1"]);
    let lines: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
    // The pod's image events, and its pulls' phases (an API ensure's pulls
    // carry the pod it names).
    let of_j1 = |e: &Value| e["image_event"]["pod_uid"] == "j1" || e["pull_phase"]["pod"]["uid"] == "j1";
    assert!(lines.iter().all(|e| e["time_ms"].is_i64() && of_j1(e)), "{lines:?}");
    assert!(lines.iter().any(|e| e["pull_phase"]["phase"] == "done"), "{lines:?}");
    let o = d.imagectl(&["-o", "yaml", "events", "--pod-uid", "j1"]);
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_slice(&o.stdout)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .collect();
    assert_eq!(docs, lines, "the same events in both formats");
}

#[test]
fn tables_have_aligned_columns_under_upper_case_headers() {
    let d = Daemon::start(&[]);
    assert_eq!(d.imagectl(&["ensure", "busybox:1.36"]).status.code(), Some(0));
    let out = stdout(&d.imagectl(&["images"]));
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|h| !h.is_empty()).collect();
    assert_eq!(header, ["IMAGE ID", "SIZE", "PINNED", "TAGS"], "{out}");
    // Each column starts where its header does (SIZE is right-aligned: ends there).
    let tags = lines[0].find("TAGS").unwrap();
    let size_end = lines[0].find("SIZE").unwrap() + "SIZE".len();
    for row in &lines[1..] {
        assert_eq!(&row[tags..], "docker.io/library/busybox:1.36", "{out}");
        assert_eq!(&row[size_end - 5..size_end], "4.3MB", "{out}");
        assert_eq!(row, &row.trim_end(), "no trailing blanks: {row:?}");
    }
}

#[test]
fn cri_speaks_crictls_names_and_removing_what_is_not_there_fails() {
    let d = Daemon::start(&[]);
    let endpoint = runtime_endpoint(&d);
    let cri = |args: &[&str]| {
        let mut all = vec!["--runtime-endpoint", endpoint.as_str()];
        all.extend_from_slice(args);
        imagectl(&all)
    };
    let o = cri(&["cri", "pull", "docker.io/library/redis:7"]);
    assert!(stdout(&o).starts_with("Image is up to date for sha256:"), "{}", stderr(&o));

    // images: crictl's columns; -q the full ids; JSON in crictl's names.
    let out = stdout(&cri(&["cri", "images"]));
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["IMAGE", "TAG", "IMAGE", "ID", "SIZE"], "{out}");
    assert!(rows.iter().any(|r| r[..2] == ["docker.io/library/redis", "7"]), "{out}");
    let ids = stdout(&cri(&["cri", "images", "-q"]));
    assert!(!ids.is_empty() && ids.lines().all(|l| l.starts_with("sha256:") && l.len() == 71), "{ids}");
    let v = json_of(&cri(&["cri", "-o", "json", "img"]));
    let redis =
        v["images"].as_array().and_then(|a| a.iter().find(|i| i["repoTags"] == json!(["docker.io/library/redis:7"])));
    assert!(redis.is_some_and(|r| r["repoDigests"][0].as_str().is_some_and(|d| d.contains("@sha256:"))), "{v}");

    // inspecti: present, or an error.
    let v = yaml_of(&cri(&["cri", "-o", "yaml", "inspecti", "redis:7"]));
    assert_eq!(v["image"]["repoTags"], json!(["docker.io/library/redis:7"]), "{v}");
    fails_once(&cri(&["cri", "inspecti", "docker.io/library/nope:1"]), 1, "no such image \"docker.io/library/nope:1\"");

    // rmi: "Deleted" only for what was there.
    let o = cri(&["cri", "rmi", "redis:7"]);
    assert_eq!(
        (o.status.code(), stdout(&o)),
        (Some(0), "Deleted: docker.io/library/redis:7\n".into()),
        "{}",
        stderr(&o)
    );
    fails_once(&cri(&["cri", "rmi", "redis:7"]), 1, "no such image \"redis:7\"");
    // Several: the present one removed, the absent one an error, exit 1.
    assert!(cri(&["cri", "pull", "redis:7"]).status.success());
    let o = cri(&["cri", "rmi", "docker.io/library/gone:1", "redis:7"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o), "Deleted: docker.io/library/redis:7\n");
    assert_eq!(
        stderr(&o).lines().collect::<Vec<_>>(),
        ["imagectl: error: no such image \"docker.io/library/gone:1\" present"]
    );
    assert_eq!(cri(&["cri", "rmi"]).status.code(), Some(64), "an image, --all or --prune is required");

    // version, imagefsinfo, ps as crictl's JSON.
    assert_eq!(json_of(&cri(&["cri", "-o", "json", "version"]))["runtimeName"], "imaged-embedded");
    assert!(cri(&["cri", "pull", "docker.io/library/redis:7"]).status.success(), "bytes to count");
    let v = json_of(&cri(&["cri", "-o", "json", "imagefsinfo"]));
    assert_eq!(v["imageFilesystems"][0]["fsId"]["mountpoint"], "/var/lib/imaged/embedded", "{v}");
    assert!(v["imageFilesystems"][0]["usedBytes"]["value"].is_u64(), "{v}");
    // The table sizes bytes as `images` does.
    let used = v["imageFilesystems"][0]["usedBytes"]["value"].as_u64().expect("bytes");
    let out = stdout(&cri(&["cri", "imagefsinfo"]));
    let row = out.lines().find(|l| l.starts_with("image ")).expect("the image filesystem's row");
    assert!(used > 1_000_000, "{v}");
    assert!(row.contains(&format!("{:.1}MB", used as f64 / 1e6)), "{used}: {out}");
    assert!(!row.contains(&used.to_string()), "{out}");
    assert_eq!(json_of(&cri(&["cri", "-o", "json", "ps", "-a"])), json!({"containers": []}));
    let out = stdout(&cri(&["cri", "ps"]));
    assert!(out.starts_with("CONTAINER   IMAGE   CREATED   STATE   NAME   ATTEMPT   POD ID"), "{out}");
    // The names crictl does not have are gone.
    assert_eq!(cri(&["cri", "fsinfo"]).status.code(), Some(64));
}

#[test]
fn completion_scripts_are_generated_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let bash = imagectl(&["completion", "bash"]);
    assert!(bash.status.success() && !bash.stdout.is_empty(), "{}", stderr(&bash));
    let script = dir.path().join("imagectl.bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(&script).output().expect("bash");
    assert!(check.status.success(), "bash -n: {}", stderr(&check));
    // Sourced, it completes subcommands and flags.
    let probe = format!(
        "source {}; complete -p imagectl; \
         COMP_WORDS=(imagectl cri ins); COMP_CWORD=2; _imagectl imagectl ins cri; echo \"cri: ${{COMPREPLY[*]}}\"; \
         COMP_WORDS=(imagectl backoff clear --p); COMP_CWORD=3; _imagectl imagectl --p clear; echo \"clear: ${{COMPREPLY[*]}}\"",
        script.display()
    );
    let o = Command::new("bash").arg("-c").arg(&probe).output().expect("bash");
    let out = stdout(&o);
    assert!(out.contains("-F _imagectl imagectl"), "{out}{}", stderr(&o));
    assert!(out.contains("cri: inspecti\n"), "{out}");
    assert!(out.contains("clear: --pod-uid\n"), "{out}");

    for (shell, start, check) in [("zsh", "#compdef imagectl", "zsh"), ("fish", "complete -c imagectl", "fish")] {
        let o = imagectl(&["completion", shell]);
        let text = stdout(&o);
        assert!(o.status.success() && text.contains(start), "{shell}: {text}");
        assert!(text.contains("inspecti") && text.contains("pod-uid"), "{shell}");
        // Loadable where the shell is installed.
        let file = dir.path().join(format!("imagectl.{shell}"));
        std::fs::write(&file, &o.stdout).unwrap();
        if let Ok(r) = Command::new(check).arg("-n").arg(&file).output() {
            assert!(r.status.success(), "{shell} -n: {}", stderr(&r));
        }
    }
    assert_eq!(imagectl(&["completion", "tcsh"]).status.code(), Some(64));
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_imagectl"))
        .args(["completion", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // As `| head -0`: the reader goes away before reading.
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
}

#[test]
fn a_runtime_gone_is_exit_1_and_a_stopping_daemon_ends_a_followed_stream_with_69() {
    // The runtime in a process of its own, so that it can go while imaged stays.
    let dir = tempfile::Builder::new().prefix("imr").tempdir_in("/tmp").expect("tempdir");
    let cri = dir.path().join("cri.sock");
    let mut runtime = Command::new(env!("CARGO_BIN_EXE_imaged"))
        .env_remove("RUST_LOG")
        .args(["embedded-runtime", "--socket", cri.to_str().expect("utf-8")])
        .stderr(Stdio::null())
        .spawn()
        .expect("start the runtime");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cri.exists() {
        assert!(std::time::Instant::now() < until, "the runtime's socket never came");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let endpoint = format!("unix://{}", cri.display());
    let d = Daemon::start(&["--runtime-endpoint", &endpoint]);
    let mut follow = Command::new(env!("CARGO_BIN_EXE_imagectl"))
        .env_remove("RUST_LOG")
        .arg("--socket")
        .arg(&d.socket)
        .args(["events", "-f"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("imagectl events -f");
    let _ = runtime.kill();
    let _ = runtime.wait();
    // imaged answered: the runtime is what is gone (1), not imaged (69).
    fails_once(&d.imagectl(&["images"]), 1, "StreamImages: imaged cannot reach the CRI runtime: ");
    assert_eq!(d.imagectl(&["status"]).status.code(), Some(0), "imaged itself answers");
    // A stop ends the followed stream with its reason: imaged is going (69).
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = follow.try_wait().expect("wait") {
            break s;
        }
        assert!(std::time::Instant::now() < until, "events -f still runs after imaged stopped");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut follow.stderr.take().expect("stderr"), &mut err).expect("read");
    assert_eq!(status.code(), Some(69), "{err}");
    assert!(err.starts_with("imagectl: error: WatchEvents: imaged is shutting down"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
