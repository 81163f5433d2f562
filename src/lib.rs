//! imaged: a node image manager. It pulls images through a container
//! runtime's CRI ImageService and frees disk by removing unused images, with
//! the kubelet's semantics, as a set of actix actors.
//!
//! # Layout
//!
//! The modules flow one way, from configuration through the wiring to the
//! actors and the pure logic under them; `tests/layering.rs` holds the
//! layers (lowest first: `domain`/`clock`; `cri`, `events`, `gc`,
//! `kubelet_config`; `fault`, `metrics`, `store`; `credentials`,
//! `pull_records`, `embedded`; `actors`; `ensure`; `config`; the wiring
//! `connect`, `node`; the front ends) and fails on an upward
//! reference or a circle.
//!
//! - [`credentials`]: pull secrets, node docker config files, exec
//!   credential-provider plugins, and the kubelet's keyring matching rules.
//! - [`domain`]: pure types (images, specs, credentials, containers); no actix, no tonic.
//! - [`cri`]: everything that speaks CRI: generated types, conversions, the
//!   typed [`cri::CriClient`] and [`cri::CriError`].
//! - [`fault`]: message-level fault plans for CRI calls.
//! - [`actors`]: the actors; [`actors::cri_gateway`] is the only one that
//!   calls CRI. Their contracts are in `actors.md`.
//! - [`ensure`]: the kubelet's `EnsureImageExists` flow over the actors
//!   ([`ensure::ImageManager`]).
//! - [`events`]: the kubelet's image events (`Pulling`, `Pulled`, …) and
//!   their delivery ([`events::EventSink`]), shared by the ensure flow and GC.
//! - [`embedded`]: the embedded CRI runtime (in memory, served on a unix
//!   socket) used by default, by the README and by tests.
//! - [`gc`]: image garbage collection logic (records, detection, the plan);
//!   the GC actors are started, with every other actor, in `node`'s wiring.
//! - [`pull_records`]: KEP-2535 pull intents and pulled records, the
//!   verification policy and the must-pull decision (verified access to
//!   cached private images).
//! - [`store`]: the embedded database (redb) holding all of imaged's durable
//!   state (GC image records, pull intents and pulled records).
//! - [`api`]: the daemon's gRPC API (`proto/imaged/v1`): service, socket, client.
//! - [`daemon`]: `imaged run`: a [`node::Node`] behind the API, with signals.
//! - [`node`]: the library entry point ([`node::Node`]): every actor from one
//!   config, spawned in one place (`node/wiring.rs`, which reads like the
//!   architecture).
//! - [`cri_front`]: imaged in the kubelet's path: the CRI ImageService served
//!   in front of the runtime (protocol side in [`cri::server`]).
//! - [`connect`]: resolves the configured endpoint (starting the embedded
//!   runtime when asked) and connects the gateway.
//! - [`metrics`]: the Prometheus metrics handle every actor updates;
//!   [`http`]: `/metrics`, `/healthz` and `/readyz` on loopback.
//! - [`config`], [`telemetry`], [`error`]: configuration, logging, exit codes;
//!   [`kubelet_config`]: the image fields of a KubeletConfiguration file.
//! - [`sim`]: the whole-node simulator (`imaged simulate`): the real actors,
//!   runtime and store on paused time under a seeded workload, faults and
//!   crashes, with invariants checked after every step.
//! - [`demo`]: the README's main job (`imaged demo`: a node workload replayed on
//!   the embedded runtime, live, with a summary); [`cli`]: flags shared by the binaries.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod actors;
pub mod api;
pub mod blocking;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connect;
pub mod credentials;
pub mod cri;
pub mod cri_front;
pub mod daemon;
pub mod demo;
pub mod domain;
pub mod embedded;
pub mod ensure;
pub mod error;
pub mod events;
pub mod fault;
pub mod files;
pub mod gc;
pub mod http;
pub mod kubelet_config;
pub mod metrics;
pub mod node;
pub mod pull_records;
mod settle;
pub mod sim;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
