//! Compiles `proto/` with a vendored `protoc`, so a fresh machine needs no system protoc.

/// The CRI messages `imagectl cri` prints (and those they contain).
const CRI_PRINTED: [&str; 13] = [
    "VersionResponse",
    "ListImagesResponse",
    "Image",
    "ImageSpec",
    "Int64Value",
    "ImageStatusResponse",
    "ImageFsInfoResponse",
    "FilesystemUsage",
    "FilesystemIdentifier",
    "UInt64Value",
    "ListContainersResponse",
    "Container",
    "ContainerMetadata",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY-free: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let protos =
        ["proto/runtime/v1/api.proto", "proto/imaged/v1/imaged.proto", "proto/containerd/content/v1/content.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut build = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Small message buffers: every call in flight holds two (src/cri/transport.rs).
        .codec_path("crate::cri::transport::ProstCodec");
    // `imagectl -o json|yaml` prints the API's answers as they are: serde
    // on the generated types, field names as in the .proto (oneof variants
    // too; imagectl flattens a oneof into its message, as proto3 JSON does).
    build = build
        .type_attribute(".imaged.v1", "#[derive(serde::Serialize)]")
        .type_attribute(".imaged.v1", "#[serde(rename_all = \"snake_case\")]")
        // Superseded by `settings` in printed output.
        .field_attribute(".imaged.v1.StatusResponse.config", "#[serde(skip)]");
    for skip in [".imaged.v1.EnsureImageRequest.pull_secrets", ".imaged.v1.PrefetchImageRequest.pull_secrets"] {
        build = build.field_attribute(skip, "#[serde(skip)]");
    }
    // `imagectl cri -o json|yaml` prints what crictl does: the CRI answers
    // with proto3 JSON's lowerCamelCase names.
    for t in CRI_PRINTED {
        build = build
            .type_attribute(format!(".runtime.v1.{t}"), "#[derive(serde::Serialize)]")
            .type_attribute(format!(".runtime.v1.{t}"), "#[serde(rename_all = \"camelCase\")]");
    }
    build = build.field_attribute(".runtime.v1.Container.state", "#[serde(serialize_with = \"container_state_name\")]");
    build.compile_protos(&protos, &["proto"])?;
    Ok(())
}
