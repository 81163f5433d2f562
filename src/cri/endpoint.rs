//! CRI endpoints (`unix:///run/containerd/containerd.sock`, `tcp://127.0.0.1:1234`)
//! and the lazily connecting channel to them.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// Where a CRI runtime listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriEndpoint {
    /// A unix socket (`unix:///path`; a bare absolute path is taken as one).
    Unix(PathBuf),
    /// A TCP address (`tcp://host:port`).
    Tcp(String),
}

/// An endpoint string that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CRI endpoint {endpoint:?}: {reason}")]
pub struct InvalidEndpoint {
    /// The rejected text.
    pub endpoint: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

impl FromStr for CriEndpoint {
    type Err = InvalidEndpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| InvalidEndpoint { endpoint: s.to_string(), reason };
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(bad("a unix endpoint needs an absolute path (unix:///path)"));
            }
            return Ok(CriEndpoint::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp://") {
            let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("a tcp endpoint needs host:port"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("a tcp endpoint needs host:port with a port from 0 to 65535"));
            }
            return Ok(CriEndpoint::Tcp(addr.to_string()));
        }
        if s.starts_with('/') {
            return Ok(CriEndpoint::Unix(PathBuf::from(s)));
        }
        Err(bad("use unix:///path/to/socket or tcp://host:port"))
    }
}

impl fmt::Display for CriEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CriEndpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            CriEndpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

impl CriEndpoint {
    /// A channel that connects on first use and reconnects by itself after
    /// the runtime goes away and comes back (no caller restart needed). Its
    /// receive window is [`super::transport::CONNECTION_WINDOW`].
    pub fn channel(&self, connect_timeout: Duration) -> Result<Channel, InvalidEndpoint> {
        let invalid = |reason| InvalidEndpoint { endpoint: self.to_string(), reason };
        match self {
            CriEndpoint::Unix(path) => {
                let path = path.clone();
                // The URI is required by tonic but unused: the connector dials the socket.
                let ep = Endpoint::from_static("http://cri.sock")
                    .connect_timeout(connect_timeout)
                    .initial_connection_window_size(super::transport::CONNECTION_WINDOW)
                    .http2_keep_alive_interval(Duration::from_secs(30))
                    .keep_alive_while_idle(false);
                Ok(ep.connect_with_connector_lazy(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
                })))
            }
            CriEndpoint::Tcp(addr) => {
                let ep = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|_| invalid("not a valid host:port"))?
                    .connect_timeout(connect_timeout)
                    .initial_connection_window_size(super::transport::CONNECTION_WINDOW)
                    .http2_keep_alive_interval(Duration::from_secs(30));
                Ok(ep.connect_lazy())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_or_say_why_not() {
        assert_eq!("unix:///run/c.sock".parse(), Ok(CriEndpoint::Unix("/run/c.sock".into())));
        assert_eq!("/run/c.sock".parse(), Ok(CriEndpoint::Unix("/run/c.sock".into())));
        assert_eq!("tcp://127.0.0.1:5000".parse(), Ok(CriEndpoint::Tcp("127.0.0.1:5000".into())));
        for bad in ["unix://relative.sock", "tcp://nohost", "tcp://h:99999", "http://x", "", "npipe:////./pipe/x"] {
            let err = bad.parse::<CriEndpoint>().expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert_eq!(CriEndpoint::Unix("/a".into()).to_string(), "unix:///a");
    }
}
