//! Our `proto/runtime/v1/api.proto` against the upstream CRI v1 field list
//! (`../shared/reference/cri-v1-fields.json`): every message we declare has
//! exactly upstream's fields (name, number, type), every enum upstream's
//! values, every RPC upstream's request and response types. This is what
//! "wire-compatible" means.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::PathBuf;

type Fields = BTreeMap<String, (u64, String)>;

#[derive(Default, Debug)]
struct Proto {
    package: String,
    messages: BTreeMap<String, Fields>,
    enums: BTreeMap<String, BTreeMap<String, i64>>,
    rpcs: BTreeMap<(String, String), (String, String)>,
}

/// A small parser for the proto3 subset we write: one declaration per line.
fn parse(text: &str) -> Proto {
    let mut p = Proto::default();
    // Stack of open blocks: ("message"|"enum"|"service", name).
    let mut stack: Vec<(String, String)> = Vec::new();
    for raw in text.lines() {
        let line = raw.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("package ") {
            p.package = rest.trim_end_matches(';').to_string();
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.ends_with('{') && matches!(words[0], "message" | "enum" | "service") {
            let name = match stack.last() {
                Some((k, parent)) if k == "message" => format!("{parent}.{}", words[1]),
                _ => words[1].to_string(),
            };
            match words[0] {
                "message" => {
                    p.messages.entry(name.clone()).or_default();
                }
                "enum" => {
                    p.enums.entry(name.clone()).or_default();
                }
                _ => {}
            }
            stack.push((words[0].to_string(), name));
            continue;
        }
        if line == "}" {
            stack.pop();
            continue;
        }
        let Some((kind, name)) = stack.last().cloned() else { continue };
        match kind.as_str() {
            "service" if words[0] == "rpc" => {
                // rpc Name(Req) returns (Resp) {}
                let compact: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
                let rpc = compact[4..].split('(').next().unwrap_or("").to_string();
                let req = compact.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap_or("").to_string();
                let resp = compact.split('(').nth(2).and_then(|s| s.split(')').next()).unwrap_or("").to_string();
                p.rpcs.insert((name, rpc), (req, resp));
            }
            "enum" => {
                let (k, v) = line.trim_end_matches(';').split_once('=').expect("enum value");
                p.enums.get_mut(&name).unwrap().insert(k.trim().to_string(), v.trim().parse().expect("enum number"));
            }
            "message" => {
                let (decl, num) = line.trim_end_matches(';').rsplit_once('=').expect("field");
                let decl = decl.trim();
                let (ty, field) = decl.rsplit_once(' ').expect("type and name");
                let ty: String = ty.split_whitespace().collect::<Vec<_>>().join(" ").replace(", ", ",");
                p.messages
                    .get_mut(&name)
                    .unwrap()
                    .insert(field.to_string(), (num.trim().parse().expect("field number"), ty));
            }
            _ => {}
        }
    }
    p
}

fn reference() -> Option<serde_json::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/cri-v1-fields.json");
    match std::fs::read_to_string(&path) {
        Ok(s) => Some(serde_json::from_str(&s).expect("reference JSON parses")),
        Err(e) => {
            // CI always has shared/ beside the clone; only a bare checkout lacks it.
            assert!(std::env::var("CI").is_err(), "CI must have {}: {e}", path.display());
            eprintln!("skipping: {} not found ({e})", path.display());
            None
        }
    }
}

fn ours() -> Proto {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/proto/runtime/v1/api.proto"))
        .expect("read proto");
    parse(&text)
}

#[test]
fn our_cri_subset_is_wire_compatible_with_upstream() {
    let Some(upstream) = reference() else { return };
    let p = ours();
    assert_eq!(p.package, "runtime.v1");
    assert!(p.messages.len() >= 50, "parsed {} messages", p.messages.len());

    for (msg, fields) in &p.messages {
        let up = upstream["messages"].get(msg).unwrap_or_else(|| panic!("message {msg} is not upstream"));
        let up: Fields = up
            .as_object()
            .expect("fields object")
            .iter()
            .map(|(k, v)| {
                (k.clone(), (v[0].as_u64().expect("number"), v[1].as_str().expect("type").replace(", ", ",")))
            })
            .collect();
        // Nested enum types are written unqualified inside their message.
        let ours: Fields = fields.clone();
        assert_eq!(&ours, &up, "fields of {msg} differ from upstream");
    }
    for (name, values) in &p.enums {
        let up = upstream["enums"].get(name).unwrap_or_else(|| panic!("enum {name} is not upstream"));
        let up: BTreeMap<String, i64> =
            up.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_i64().unwrap())).collect();
        assert_eq!(values, &up, "values of enum {name} differ");
    }
    for ((svc, rpc), (req, resp)) in &p.rpcs {
        let up = &upstream["services"][svc][rpc];
        assert_eq!(up[0].as_str(), Some(req.as_str()), "{svc}/{rpc} request");
        assert_eq!(up[1].as_str(), Some(resp.as_str()), "{svc}/{rpc} response");
    }
}

#[test]
fn the_subset_declares_what_imaged_calls_and_what_its_messages_reference() {
    let p = ours();
    for (svc, rpc) in [
        ("ImageService", "ListImages"),
        ("ImageService", "ImageStatus"),
        ("ImageService", "PullImage"),
        ("ImageService", "RemoveImage"),
        ("ImageService", "ImageFsInfo"),
        ("RuntimeService", "Version"),
        ("RuntimeService", "ListContainers"),
        ("RuntimeService", "ListPodSandbox"),
        ("RuntimeService", "ContainerStatus"),
    ] {
        assert!(p.rpcs.contains_key(&(svc.to_string(), rpc.to_string())), "{svc}/{rpc} missing");
    }
    // Every field type is a scalar, a declared message or a declared enum.
    let scalars = ["string", "bool", "bytes", "int32", "int64", "uint32", "uint64", "double", "float"];
    for (msg, fields) in &p.messages {
        for (field, (_, ty)) in fields {
            let base = ty.trim_start_matches("repeated ");
            let base = base.strip_prefix("map<string,").map_or(base, |s| s.trim_end_matches('>'));
            let nested = format!("{msg}.{base}");
            assert!(
                scalars.contains(&base)
                    || p.messages.contains_key(base)
                    || p.enums.contains_key(base)
                    || p.enums.contains_key(&nested),
                "{msg}.{field} has undeclared type {ty}"
            );
        }
    }
    // The newer fields the issue names are there.
    assert!(p.messages["ImageSpec"].contains_key("user_specified_image"));
    assert!(p.messages["ImageSpec"].contains_key("runtime_handler"));
    assert!(p.messages["ImageSpec"].contains_key("image_ref"));
    assert!(p.messages["Image"].contains_key("pinned"));
    assert!(p.messages["Image"].contains_key("spec"));
    assert!(p.messages["ImageFsInfoResponse"].contains_key("container_filesystems"));
}
