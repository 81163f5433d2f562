//! `imaged run` as a child process with its API socket in a temp dir, and
//! `imagectl` runs against it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running daemon; killed on drop if still running.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
    pub stderr: PathBuf,
}

impl Daemon {
    /// Starts `imaged run` with `args` (before `run`: `--set k=v`, …) and
    /// waits (bounded) for the socket to answer.
    pub fn start(args: &[&str]) -> Daemon {
        Self::spawn(env!("CARGO_BIN_EXE_imaged").as_ref(), args, None)
    }

    /// [`Daemon::start`] with `RLIMIT_NOFILE` set to `limit` (soft and
    /// hard), as a unit's `LimitNOFILE=` would.
    pub fn start_with_open_file_limit(args: &[&str], limit: u64) -> Daemon {
        Self::spawn_limited(env!("CARGO_BIN_EXE_imaged").as_ref(), args, None, Some(limit))
    }

    /// [`Daemon::start`] of another `imaged` binary (a bench comparing builds).
    pub fn start_binary(bin: &std::ffi::OsStr, args: &[&str]) -> Daemon {
        Self::spawn(bin, args, None)
    }

    /// Starts `imaged run` as systemd starts a socket-activated service:
    /// `listener` passed as fd 3, named `imaged-cri` (`LISTEN_FDS`,
    /// `LISTEN_PID`, `LISTEN_FDNAMES`).
    pub fn start_activated(args: &[&str], listener: &std::os::unix::net::UnixListener) -> Daemon {
        Self::spawn(env!("CARGO_BIN_EXE_imaged").as_ref(), args, Some(listener))
    }

    fn spawn(bin: &std::ffi::OsStr, args: &[&str], passed: Option<&std::os::unix::net::UnixListener>) -> Daemon {
        Self::spawn_limited(bin, args, passed, None)
    }

    fn spawn_limited(
        bin: &std::ffi::OsStr,
        args: &[&str],
        passed: Option<&std::os::unix::net::UnixListener>,
        open_files: Option<u64>,
    ) -> Daemon {
        use nix::fcntl::{FcntlArg, FdFlag, fcntl};
        use std::os::fd::AsRawFd;
        // Short path: unix socket paths are limited to ~100 bytes.
        let dir = tempfile::Builder::new().prefix("imd").tempdir_in("/tmp").expect("tempdir");
        let socket = dir.path().join("api.sock");
        let stderr = dir.path().join("imaged.log");
        let log = std::fs::File::create(&stderr).expect("log file");
        let mut command = match passed {
            None => Command::new(bin),
            Some(listener) => {
                // The child inherits the socket (close-on-exec cleared until
                // it is spawned), which bash moves to fd 3 (dash takes one-digit fds only) before it
                // becomes imaged, keeping its pid for LISTEN_PID.
                fcntl(listener, FcntlArg::F_SETFD(FdFlag::empty())).expect("clear close-on-exec");
                let fd = listener.as_raw_fd();
                let to_fd3 = if fd == 3 { String::new() } else { format!("exec 3<&{fd} {fd}<&- && ") };
                let script = format!("{to_fd3}LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=imaged-cri exec \"$0\" \"$@\"");
                let mut c = Command::new("bash");
                c.arg("-c").arg(script).arg(bin);
                c
            }
        };
        if let Some(limit) = open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe, and the closure
            // touches nothing else of the parent between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, limit, limit)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = command
            .env_remove("RUST_LOG")
            .arg("--set")
            .arg(format!("daemon.socket={}", socket.display()))
            .arg("--set")
            .arg(format!("runtime.embedded_socket={}", dir.path().join("cri.sock").display()))
            // Parallel daemons: a state directory each (the default one is
            // shared by every imaged of the machine; a test's `--set` wins).
            .arg("--set")
            .arg(format!("state.dir={}", dir.path().join("state").display()))
            // Parallel daemons: an ephemeral port each (read back from the log).
            .arg("--set")
            .arg("daemon.metrics_address=127.0.0.1:0")
            .args(args)
            .arg("run")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn imaged run");
        if let Some(listener) = passed {
            fcntl(listener, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).expect("restore close-on-exec");
        }
        let mut d = Daemon { child, socket, dir, stderr };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("imaged exited early with {status}: {}", self.log());
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("imaged did not serve {} within 30s: {}", self.socket.display(), self.log());
    }

    /// Waits (bounded by `within`) until the log contains `text`; panics
    /// naming `what` and showing the log otherwise.
    pub fn wait_for_log(&self, text: &str, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while !self.log().contains(text) {
            assert!(Instant::now() < deadline, "{what}: {}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `text` appears `times` times in the log.
    pub fn wait_for_log_count(&self, text: &str, times: usize, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while self.log().matches(text).count() < times {
            assert!(Instant::now() < deadline, "{what}: {}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The address `/metrics`, `/healthz` and `/readyz` are served on.
    pub fn http_addr(&self) -> String {
        let log = self.log();
        let line = log.lines().find(|l| l.contains("serving /metrics")).expect("the HTTP address is logged");
        let at = line.find("addr=").expect("addr field") + "addr=".len();
        line[at..].split_whitespace().next().expect("address").to_string()
    }

    /// Runs `imagectl --socket … args`.
    pub fn imagectl(&self, args: &[&str]) -> Output {
        imagectl(&self.socket, args)
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("kill");
    }

    /// Whether the daemon is still running.
    #[allow(dead_code)] // not every test binary that shares this module asks
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (bounded) for the daemon to exit; returns its exit code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        self.wait_status(within).code()
    }

    /// Waits (bounded) for the daemon to exit; returns how it ended.
    pub fn wait_status(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("imaged did not exit within {within:?}: {}", self.log());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `imagectl --socket SOCKET args`.
pub fn imagectl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_imagectl"))
        .env_remove("RUST_LOG")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run imagectl")
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
