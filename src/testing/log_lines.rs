//! Log lines captured from a tracing subscriber, for tests that look at
//! what was logged (and what never may be: a secret).

use std::sync::{Arc, Mutex};

/// A `MakeWriter` appending every line to one shared buffer: give a clone
/// to `tracing_subscriber::fmt().with_writer(..)`, read it with
/// [`LogLines::text`].
#[derive(Clone, Debug, Default)]
pub struct LogLines(Arc<Mutex<Vec<u8>>>);

impl LogLines {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)).into_owned()
    }
}

impl std::io::Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogLines {
    type Writer = LogLines;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
