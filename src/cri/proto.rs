//! Generated CRI v1 types and stubs (`proto/runtime/v1/api.proto`). Nothing else.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("runtime.v1");
