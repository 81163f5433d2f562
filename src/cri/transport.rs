//! The HTTP/2 settings of every gRPC connection imaged serves (the
//! embedded runtime, the API socket, the CRI front) or opens (the CRI
//! client), chosen so that no burst of calls can make h2 close a
//! connection, and the client's bound on calls in flight.
//!
//! # Why
//!
//! h2 (0.4.16 and later) closes a connection with `GOAWAY
//! ENHANCE_YOUR_CALM` ("too_many_data_frames"; tonic reports it as
//! `ResourceExhausted: h2 protocol error`, then every other call on the
//! connection fails `Unavailable: connection reset` or `Canceled`) when the
//! small DATA frames it holds unread pass a budget: each frame under 256
//! bytes costs 256 minus its length until the task that owns its stream
//! reads it, and the budget is half the connection's receive window (at
//! least 25,600 bytes; hyper's server window is 1 MiB, so 512 KiB). A unary
//! gRPC call is one small DATA frame each way. A server on one thread (the
//! embedded runtime; the daemon, whose actix system is one thread) reads a
//! burst of requests before any task serving them runs: a burst of about
//! 2,500 presence checks on one connection (absent images: 5-byte answers
//! cost the client as much) closed the runtime's connection, and every
//! call on it failed — pods got `ImageInspectError` from a healthy runtime.
//! It is not the reset-flood protection (`max_pending_accept_reset_streams`,
//! `max_local_error_reset_streams`): tests/burst.rs sees
//! `too_many_data_frames` in h2's log before the fix.
//!
//! # What bounds it
//!
//! What a side holds unread is at most one small frame per open stream.
//! - Servers advertise at most [`MAX_STREAMS_PER_CONNECTION`] streams per
//!   connection (`SETTINGS_MAX_CONCURRENT_STREAMS`; a client's further
//!   calls wait in the client, in order, with no error: tonic, grpc-go and
//!   the kubelet do so) and a receive window, [`CONNECTION_WINDOW`], whose
//!   budget covers twice that many small frames.
//! - The CRI client keeps at most [`CLIENT_READS_IN_FLIGHT`] calls and
//!   [`CLIENT_PULLS_IN_FLIGHT`] `PullImage` calls in flight per channel
//!   (a runtime need not advertise a limit: containerd does not), with the
//!   same window; a call past them waits for a slot in arrival order, the
//!   wait counting against its deadline. Pulls and other calls have their
//!   own slots, so presence checks never wait behind pulls.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::{CriError, CriErrorKind, Rpc};

/// Most streams (calls in flight) a peer may open on one connection to a
/// server imaged runs.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 4096;

/// The connection-level receive window of every connection imaged serves
/// or opens: 4 MiB, so h2's small-frame budget (half of it) is twice 256
/// bytes times [`MAX_STREAMS_PER_CONNECTION`]. A window is an allowance,
/// not an allocation: memory is used only by data received and not yet read.
pub const CONNECTION_WINDOW: u32 = 4 << 20;

/// Most CRI calls other than `PullImage` in flight on one CRI client
/// (channel); more wait for a slot.
pub const CLIENT_READS_IN_FLIGHT: usize = 2048;

/// Most `PullImage` calls in flight on one CRI client (channel); more wait
/// for a slot.
pub const CLIENT_PULLS_IN_FLIGHT: usize = 2048;

/// h2's small-DATA-frame budget for a receive window of `window` bytes
/// (h2 0.4.20, `DataFrameBudget::Auto`), and what one small frame costs at
/// most.
const fn small_frame_budget(window: u32) -> usize {
    let half = window as usize / 2;
    if half > 25_600 { half } else { 25_600 }
}
const SMALL_FRAME_COST: usize = 256;

// Twice what the streams of a connection can hold unread, both ways.
const _: () = assert!(
    small_frame_budget(CONNECTION_WINDOW) >= 2 * SMALL_FRAME_COST * MAX_STREAMS_PER_CONNECTION as usize
        && CLIENT_READS_IN_FLIGHT + CLIENT_PULLS_IN_FLIGHT <= MAX_STREAMS_PER_CONNECTION as usize
);

/// Initial size of the buffer a call encodes or decodes a message in
/// (bytes; tonic's default is 8 KiB). Every call in flight holds one each
/// way, and a burst holds thousands: imaged's messages are mostly under
/// this, and a larger one grows its buffer as it needs.
pub const MESSAGE_BUFFER: usize = 512;

/// tonic's buffer settings with [`MESSAGE_BUFFER`] (and tonic's default
/// 32 KiB at which an encoder yields a chunk).
pub fn message_buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(MESSAGE_BUFFER, 32 * 1024)
}

/// The prost codec of every generated client and server (build.rs names
/// it), with [`message_buffers`].
#[derive(Debug, Clone)]
pub struct ProstCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for ProstCodec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for ProstCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(message_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(message_buffers())
    }
}

/// A tonic server builder with these settings; add the services to it.
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .initial_connection_window_size(CONNECTION_WINDOW)
}

/// The client side's bound on calls in flight on one channel.
#[derive(Debug)]
pub(super) struct CallSlots {
    reads: Semaphore,
    pulls: Semaphore,
}

impl Default for CallSlots {
    fn default() -> Self {
        Self { reads: Semaphore::new(CLIENT_READS_IN_FLIGHT), pulls: Semaphore::new(CLIENT_PULLS_IN_FLIGHT) }
    }
}

impl CallSlots {
    /// A slot for one `rpc` call, waited for (in arrival order) within
    /// `deadline`; the slot and what is left of the deadline. Held until
    /// the call's answer is read whole.
    pub(super) async fn take(
        &self,
        rpc: Rpc,
        deadline: Option<Duration>,
    ) -> Result<(SemaphorePermit<'_>, Option<Duration>), CriError> {
        let slots = if rpc == Rpc::PullImage { &self.pulls } else { &self.reads };
        if let Ok(slot) = slots.try_acquire() {
            return Ok((slot, deadline));
        }
        let started = Instant::now();
        let slot = match deadline {
            Some(d) => tokio::time::timeout(d, slots.acquire()).await.map_err(|_| CriError::deadline_exceeded())?,
            None => slots.acquire().await,
        };
        // The semaphores are never closed.
        let slot = slot.map_err(|e| CriError::new(CriErrorKind::Other, format!("CRI call slots: {e}")))?;
        Ok((slot, deadline.map(|d| d.saturating_sub(started.elapsed()))))
    }

    /// Calls in flight now: (other calls, pulls).
    #[cfg(test)]
    fn in_flight(&self) -> (usize, usize) {
        (
            CLIENT_READS_IN_FLIGHT - self.reads.available_permits(),
            CLIENT_PULLS_IN_FLIGHT - self.pulls.available_permits(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_covers_what_the_streams_can_hold_unread() {
        // hyper's server window (1 MiB) gives 512 KiB: about 2,000 calls.
        assert_eq!(small_frame_budget(1 << 20), 512 * 1024);
        assert_eq!(small_frame_budget(0), 25_600, "h2's floor");
        assert!(small_frame_budget(CONNECTION_WINDOW) / SMALL_FRAME_COST >= 2 * MAX_STREAMS_PER_CONNECTION as usize);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_slots_waits_in_order_within_its_deadline() {
        let slots = CallSlots::default();
        let mut held = Vec::new();
        for _ in 0..CLIENT_READS_IN_FLIGHT {
            held.push(slots.take(Rpc::ImageStatus, None).await.expect("slot").0);
        }
        assert_eq!(slots.in_flight(), (CLIENT_READS_IN_FLIGHT, 0));
        // Pulls have their own slots: a pull does not wait behind reads.
        let (pull, left) = slots.take(Rpc::PullImage, Some(Duration::from_secs(5))).await.expect("pull slot");
        assert_eq!(left, Some(Duration::from_secs(5)), "no wait, the whole deadline");
        drop(pull);
        // A read past the bound waits, and its wait counts against its deadline.
        let e = slots.take(Rpc::ListImages, Some(Duration::from_millis(100))).await.expect_err("no slot in time");
        assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);
        let waiting = slots.take(Rpc::ImageStatus, Some(Duration::from_secs(2)));
        tokio::pin!(waiting);
        assert!(futures_util::poll!(&mut waiting).is_pending());
        tokio::time::advance(Duration::from_millis(500)).await;
        held.pop();
        let (_slot, left) = waiting.await.expect("the freed slot");
        assert_eq!(left, Some(Duration::from_millis(1500)), "what is left of the deadline");
    }
}
