//! The daemon's API fed requests that are valid protobuf but hostile: huge
//! repeated fields, huge strings, deep documents, thousands of secrets, odd
//! UTF-8. Each gets a clean answer or a clean gRPC error naming the limit
//! or the field, and the daemon keeps serving.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use imaged::api::proto;
use support::daemon::Daemon;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn ensure_req(uid: &str, image: &str) -> proto::EnsureImageRequest {
    proto::EnsureImageRequest {
        pod: Some(proto::Pod { uid: uid.into(), namespace: "ns".into(), name: uid.into(), ..Default::default() }),
        image: image.into(),
        pull_policy: "IfNotPresent".into(),
        ..Default::default()
    }
}

fn annotations(n: usize, key_len: usize) -> HashMap<String, String> {
    (0..n).map(|i| (format!("{i:0key_len$}"), "v".repeat(8))).collect()
}

type Client = imaged::api::proto::imaged_client::ImagedClient<tonic::transport::Channel>;

/// An ensure that must succeed: the daemon still serves.
async fn still_serves(c: &mut Client, uid: &str) {
    let r = c.ensure_image(ensure_req(uid, "busybox:1.36")).await.expect("rpc").into_inner();
    assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "{r:?}");
}

async fn refused(c: &mut Client, req: proto::EnsureImageRequest) -> tonic::Status {
    let started = Instant::now();
    let e = c.ensure_image(req).await.expect_err("refused");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    e
}

#[test]
fn hostile_requests_get_clean_answers_and_the_daemon_keeps_serving() {
    let d = Daemon::start(&[]);
    rt().block_on(async {
        let mut c = imaged::api::client(&d.socket).expect("client");
        still_serves(&mut c, "p0").await;

        // 100,000 annotations over the request limit (4 MiB): refused before decoding.
        let mut req = ensure_req("p1", "busybox:1.36");
        req.pod.as_mut().unwrap().annotations = annotations(100_000, 40);
        let e = refused(&mut c, req).await;
        assert!(matches!(e.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted), "{e:?}");
        assert!(e.message().contains("limit"), "names the limit: {}", e.message());
        still_serves(&mut c, "p1").await;

        // 100,000 short annotations fit: an answer, in bounded time.
        let mut req = ensure_req("p2", "busybox:1.36");
        req.pod.as_mut().unwrap().annotations = annotations(100_000, 5);
        let started = Instant::now();
        let r = c.ensure_image(req).await.expect("rpc").into_inner();
        assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());

        // A 3 MiB image name: under the request limit, over the field's.
        let e = refused(&mut c, ensure_req("p3", &"a".repeat(3 << 20))).await;
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "image: longer than 4096 bytes"));
        // And the same for a prefetch.
        let e = c
            .prefetch_image(proto::PrefetchImageRequest { image: "b".repeat(3 << 20), ..Default::default() })
            .await
            .expect_err("refused");
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "image: longer than 4096 bytes"));

        // 10,000 pull secrets, all valid (none for this registry): answered.
        let secrets: Vec<Vec<u8>> =
            (0..10_000).map(|i| format!(r#"{{"metadata":{{"name":"s{i}"}}}}"#).into_bytes()).collect();
        let mut req = ensure_req("p4", "busybox:1.36");
        req.pull_secrets = secrets.clone();
        let r = c.ensure_image(req).await.expect("rpc").into_inner();
        assert!(matches!(r.result, Some(proto::ensure_image_response::Result::Ok(_))), "{r:?}");
        // ... and the last one broken: named by its index.
        let mut req = ensure_req("p4", "busybox:1.36");
        req.pull_secrets = secrets;
        *req.pull_secrets.last_mut().unwrap() = b"{\"metadata\":{\"name\":7}}".to_vec();
        let e = refused(&mut c, req).await;
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .starts_with("pull_secrets[9999]: Secret manifest \"<unnamed>\": metadata.name: expected a string"),
            "{}",
            e.message()
        );

        // Deep and self-multiplying documents as secrets: parse errors, no stack overflow.
        let deep_json = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000)).into_bytes();
        let deep_yaml = format!("{}x", "- ".repeat(100_000)).into_bytes();
        // Nested flow mappings cost the YAML parser time quadratic in the
        // depth (50,000 levels, 250 KB, took 18 s in a debug build): they
        // are refused by a linear scan before parsing (64 levels at most).
        let deep_flow = format!("a: {}1{}", "{a: ".repeat(50_000), "}".repeat(50_000)).into_bytes();
        let mut laughs =
            String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for (prev, next) in
            ["a", "b", "c", "d", "e", "f", "g", "h"].iter().zip(["b", "c", "d", "e", "f", "g", "h", "i"])
        {
            let refs = vec![format!("*{prev}"); 9].join(",");
            laughs.push_str(&format!("{next}: &{next} [{refs}]\n"));
        }
        for (what, doc) in [
            ("deep JSON", deep_json),
            ("deep YAML", deep_yaml),
            ("deep flow YAML", deep_flow),
            ("billion laughs", laughs.into_bytes()),
        ] {
            let mut req = ensure_req("p5", "busybox:1.36");
            req.pull_secrets = vec![doc];
            let e = refused(&mut c, req).await;
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
            assert!(e.message().starts_with("pull_secrets[0]: Secret manifest"), "{what}: {}", e.message());
        }

        // Odd UTF-8 everywhere: right-to-left overrides, NULs, combining marks,
        // astral characters. The image does not parse: a failure result.
        let odd = "bu\u{202e}sy\u{0}box\u{301}\u{1f600}\u{feff}:\u{10ffff}";
        let mut req = ensure_req(odd, odd);
        req.container = odd.into();
        let pod = req.pod.as_mut().unwrap();
        pod.namespace = odd.into();
        pod.annotations = (0..1000).map(|i| (format!("{odd}{i}"), odd.repeat(3))).collect();
        pod.runtime_handler = odd.into();
        let r = c.ensure_image(req).await.expect("rpc").into_inner();
        let Some(proto::ensure_image_response::Result::Failure(f)) = r.result else { panic!("{r:?}") };
        assert_eq!(f.kind, "InvalidImageName", "{f:?}");

        still_serves(&mut c, "p6").await;
        c.get_status(proto::GetStatusRequest {}).await.expect("still serving");
    });
    assert!(!d.log().contains("panicked"), "{}", d.log());
}
