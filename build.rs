//! Compiles `proto/` with a vendored `protoc`, so a fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY-free: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let protos = ["proto/runtime/v1/api.proto", "proto/imaged/v1/imaged.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Small message buffers: every call in flight holds two (src/cri/transport.rs).
        .codec_path("crate::cri::transport::ProstCodec")
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
