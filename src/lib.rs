//! imaged: a node image manager. It pulls images through a container
//! runtime's CRI ImageService and frees disk by removing unused images, with
//! the kubelet's semantics, as a set of actix actors.
//!
//! # Layout
//!
//! - [`domain`]: pure types (images, specs, credentials, containers); no actix, no tonic.
//! - [`cri`]: everything that speaks CRI: generated types, conversions, the
//!   typed [`cri::CriClient`] and [`cri::CriError`].
//! - [`fault`]: message-level fault plans for CRI calls.
//! - [`actors`]: the actors; [`actors::cri_gateway`] is the only one that
//!   calls CRI. Their contracts are in `actors.md`.
//! - [`embedded`]: the embedded CRI runtime (in memory, served on a unix
//!   socket) used by default, by the README and by tests.
//! - [`config`], [`telemetry`]: configuration and logging.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod actors;
pub mod config;
pub mod cri;
pub mod domain;
pub mod embedded;
pub mod fault;
pub mod telemetry;
