//! StreamImages (KEP-5825): the gateway lists with the runtime's stream
//! while it is offered and falls back to ListImages on `Unimplemented`;
//! imaged's CRI front and its API serve the stream too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use imaged::actors::cri_gateway::ListImages;
use imaged::config::{Config, RuntimeEndpoint};
use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::{CriEndpoint, Rpc};
use imaged::embedded::RemoteImage;
use imaged::node::Node;
use support::fixture::runtime;

/// More images than one stream message holds (512).
const IMAGES: usize = 1_200;

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("registry.example.com/stream/app-{i:04}:v1")).collect()
}

fn ids(images: &[imaged::domain::Image]) -> Vec<String> {
    let mut v: Vec<String> = images.iter().map(|i| i.id.clone()).collect();
    v.sort();
    v
}

#[actix::test]
async fn the_gateway_streams_while_the_runtime_offers_it_and_falls_back_to_list_images() {
    let rt = runtime().await;
    for name in names(IMAGES) {
        rt.runtime.preload(RemoteImage::new(name, 10)).expect("preload");
    }
    let lists = || rt.runtime.stats().calls(Rpc::ListImages);
    // Streamed: one StreamImages call, every image, as ListImages would list them.
    let streamed = rt.gateway.send(ListImages::default()).await.unwrap().expect("listed");
    assert_eq!(streamed.len(), IMAGES);
    assert_eq!(rt.runtime.stream_images_calls(), 1);
    let filtered = rt
        .gateway
        .send(ListImages { filter: Some(imaged::domain::ImageSpec::new(names(1)[0].clone())) })
        .await
        .unwrap()
        .expect("filtered");
    assert_eq!(filtered.len(), 1, "the filter travels with the stream");

    // A runtime without it: Unimplemented once, then ListImages only.
    rt.runtime.set_stream_images(false);
    let before = lists();
    let (gateway, _) = imaged::actors::cri_gateway::CriGatewayActor::connect(
        &rt.runtime.endpoint(),
        &imaged::actors::cri_gateway::CriSettings::default(),
    )
    .await
    .expect("a second gateway");
    let listed = gateway.send(ListImages::default()).await.unwrap().expect("fell back");
    assert_eq!(ids(&listed), ids(&streamed), "the same images either way");
    assert_eq!(rt.runtime.stream_images_calls(), 3, "asked once more, refused");
    let again = gateway.send(ListImages::default()).await.unwrap().expect("listed");
    assert_eq!(again.len(), IMAGES);
    assert_eq!(rt.runtime.stream_images_calls(), 3, "not asked again soon after Unimplemented");
    assert_eq!(lists(), before + 2, "both listings by ListImages");
}

#[actix::test]
async fn the_cri_front_and_the_api_serve_stream_images_in_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::from_toml("").expect("config");
    cfg.endpoint = RuntimeEndpoint::Embedded { socket: Some(dir.path().join("runtime.sock")) };
    let node = Arc::new(Node::start(cfg).await.expect("node starts"));
    let embedded = node.runtime().embedded.as_ref().expect("embedded");
    for name in names(IMAGES) {
        embedded.preload(RemoteImage::new(name, 10)).expect("preload");
    }
    // The front, as the 1.36 kubelet with CRIListStreaming calls it.
    let path = dir.path().join("cri.sock");
    let _stop = support::front::serve_front(&node, &path).await;
    let mut client = ImageServiceClient::new(CriEndpoint::Unix(path).channel(Duration::from_secs(5)).expect("channel"));
    let mut stream = client.stream_images(pb::StreamImagesRequest { filter: None }).await.expect("served").into_inner();
    let mut batches = Vec::new();
    while let Some(batch) = stream.message().await.expect("a batch") {
        batches.push(batch.images.len());
    }
    assert_eq!(batches.iter().sum::<usize>(), IMAGES);
    assert!(batches.len() >= 3 && batches.iter().all(|n| *n <= 512), "{batches:?}");
    let listed = client.list_images(pb::ListImagesRequest { filter: None }).await.expect("list").into_inner();
    assert_eq!(listed.images.len(), IMAGES);
    let one = pb::StreamImagesRequest {
        filter: Some(pb::ImageFilter {
            image: Some(pb::ImageSpec { image: names(1)[0].clone(), ..Default::default() }),
        }),
    };
    let mut s = client.stream_images(one).await.expect("filtered").into_inner();
    assert_eq!(s.message().await.expect("batch").map(|b| b.images.len()), Some(1));

    // imaged's own API.
    let api = dir.path().join("api.sock");
    let _api = support::api::serve_api(&node, &api).await;
    let mut c = imaged::api::client(&api).expect("client");
    let mut s = c.stream_images(imaged::api::proto::ListImagesRequest {}).await.expect("api stream").into_inner();
    let (mut n, mut messages) = (0, 0);
    while let Some(batch) = s.message().await.expect("batch") {
        n += batch.images.len();
        messages += 1;
    }
    assert_eq!((n, messages), (IMAGES, IMAGES.div_ceil(imaged::api::IMAGE_BATCH)));

    // `imagectl images` reads the stream (one list answer has a size
    // limit) and prints every batch's images as one list.
    let o = tokio::task::spawn_blocking(move || support::daemon::imagectl(&api, &["-o", "json", "images"]))
        .await
        .expect("imagectl ran");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let printed = v["images"].as_array().map(Vec::len);
    assert_eq!(printed, Some(IMAGES), "every batch printed");
}
