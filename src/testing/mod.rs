//! Test support shipped with the library (feature `test-util`): a fake CRI
//! gateway actor for message-level tests of the actors that call CRI, with
//! paused time and no sockets; an ensure flow started with its actors
//! ([`start_manager`]).

mod events;
mod fake_cri;
mod log_lines;
mod manager;
#[cfg(test)]
pub(crate) mod props;
mod scrape;

pub use events::{EventLog, EventReasons, TakeEvents};
pub use fake_cri::{FailNext, FakeCri, FakeCriCalls, GetFakeCalls, SetFakeContainers, SetFakeFs, SetFakeImages};
pub use log_lines::LogLines;
pub use manager::{StartedManager, start_manager};
pub use scrape::{Sample, Scrape};
