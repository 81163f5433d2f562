//! Helpers shared by the integration tests that need real infrastructure.
#![allow(dead_code)]

pub mod api;
pub mod containerd_env;
pub mod daemon;
pub mod fixture;
pub mod front;
pub mod oci;
