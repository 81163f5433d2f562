//! Generated CRI v1 types and stubs (`proto/runtime/v1/api.proto`). Nothing else.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("runtime.v1");

/// A `ContainerState` field by its name (`CONTAINER_RUNNING`), as proto3
/// JSON (and so `crictl ps -o json`) prints it; an unknown value as its number.
fn container_state_name<S: serde::Serializer>(state: &i32, s: S) -> Result<S::Ok, S::Error> {
    match ContainerState::try_from(*state) {
        Ok(known) => s.serialize_str(known.as_str_name()),
        Err(_) => s.serialize_i32(*state),
    }
}

/// containerd's content service, the one call imaged makes of it
/// (`proto/containerd/content/v1/content.proto`): the downloads in progress.
pub mod content {
    tonic::include_proto!("containerd.services.content.v1");
}
