//! The live progress display: on a terminal, a few lines redrawn in place;
//! otherwise (a pipe, a file, CI) a plain line every couple of seconds.

use std::io::Write;
use std::time::Duration;

use super::summary::{Tally, bytes, percent};

/// How often plain (non-terminal) output prints a line.
pub const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// Writes progress to `out`.
pub struct Display<W: Write> {
    out: W,
    terminal: bool,
    /// Lines drawn last time (to move back over them).
    drawn: usize,
    last_plain: Option<Duration>,
}

fn bar(done: u64, total: u64, width: usize) -> String {
    let filled = (done.min(total).saturating_mul(width as u64))
        .checked_div(total)
        .map_or(0, |f| usize::try_from(f).unwrap_or(width).min(width));
    format!("{}{}", "#".repeat(filled), "-".repeat(width - filled))
}

/// The redrawn lines for `t` at `elapsed` (each under 80 columns, so a
/// narrow terminal does not wrap them and break the redraw).
pub fn lines(t: &Tally, elapsed: Duration) -> Vec<String> {
    let never: usize = t.never_started.values().sum();
    vec![
        format!(
            "t={:>5.1}s  pods [{}] {}/{} started, {} failing, {} never",
            elapsed.as_secs_f64(),
            bar(t.pods_started as u64 + never as u64, t.pods_total as u64, 20),
            t.pods_started,
            t.pods_total,
            t.pods_failing,
            never
        ),
        format!(
            "pulls     {} running, {} queued, {} parked | {} CRI pulls for {} requests",
            t.running, t.queued, t.parked, t.cri_pulls, t.pull_requests
        ),
        format!(
            "sharing   {} joined a pull in flight | {} throttled | {} back-offs",
            t.joins,
            t.throttled_pulls,
            t.ensure_errors.get("ImagePullBackOff").copied().unwrap_or(0)
        ),
        format!(
            "disk      [{}] {:>3}% of {} | GC {} runs, {} freed",
            bar(t.disk_used, t.disk_capacity, 16),
            percent(t.disk_used, t.disk_capacity),
            bytes(t.disk_capacity),
            t.gc_runs + t.gc_runs_short,
            bytes(t.gc_bytes_freed)
        ),
    ]
}

/// The one-line form for plain output.
pub fn plain_line(t: &Tally, elapsed: Duration) -> String {
    let never: usize = t.never_started.values().sum();
    format!(
        "[{:>5.1}s] pods {}/{} started, {} failing, {} never | pulls {} running {} queued | {} CRI pulls for {} requests, \
         {} joined, {} throttled | back-offs {} | disk {}% | GC {} runs freed {}",
        elapsed.as_secs_f64(),
        t.pods_started,
        t.pods_total,
        t.pods_failing,
        never,
        t.running,
        t.queued,
        t.cri_pulls,
        t.pull_requests,
        t.joins,
        t.throttled_pulls,
        t.ensure_errors.get("ImagePullBackOff").copied().unwrap_or(0),
        percent(t.disk_used, t.disk_capacity),
        t.gc_runs + t.gc_runs_short,
        bytes(t.gc_bytes_freed)
    )
}

impl<W: Write> Display<W> {
    /// A display on `out`; `terminal` picks redrawing over plain lines.
    pub fn new(out: W, terminal: bool) -> Self {
        Self { out, terminal, drawn: 0, last_plain: None }
    }

    /// Shows the state at `elapsed`. Plain output prints only every [`PLAIN_EVERY`].
    pub fn update(&mut self, t: &Tally, elapsed: Duration) -> std::io::Result<()> {
        if self.terminal {
            let ls = lines(t, elapsed);
            if self.drawn > 0 {
                write!(self.out, "\x1b[{}A", self.drawn)?;
            }
            for l in &ls {
                writeln!(self.out, "\r\x1b[2K{l}")?;
            }
            self.drawn = ls.len();
        } else if self.last_plain.is_none_or(|at| elapsed >= at + PLAIN_EVERY) {
            writeln!(self.out, "{}", plain_line(t, elapsed))?;
            self.last_plain = Some(elapsed);
        }
        self.out.flush()
    }

    /// Final state: redraws once more (terminal) or prints the last line (plain).
    pub fn finish(&mut self, t: &Tally, elapsed: Duration) -> std::io::Result<()> {
        if self.terminal {
            self.update(t, elapsed)?;
        } else {
            writeln!(self.out, "{}", plain_line(t, elapsed))?;
        }
        writeln!(self.out)?;
        self.out.flush()
    }

    /// The writer (for the summary after the display).
    pub fn out(&mut self) -> &mut W {
        &mut self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally() -> Tally {
        Tally { pods_total: 10, pods_started: 5, disk_capacity: 100, disk_used: 50, ..Tally::default() }
    }

    #[test]
    fn plain_output_prints_a_line_every_two_seconds_and_never_redraws() {
        let mut d = Display::new(Vec::new(), false);
        for tenth in 0..=45 {
            d.update(&tally(), Duration::from_millis(tenth * 100)).expect("write");
        }
        let text = String::from_utf8(d.out().clone()).expect("utf8");
        assert_eq!(text.lines().count(), 3, "{text}"); // at 0, 2 and 4 s
        assert!(!text.contains('\x1b'));
        assert!(text.starts_with("[  0.0s] pods 5/10 started"), "{text}");
    }

    #[test]
    fn redrawn_lines_fit_in_80_columns_even_with_large_figures() {
        let mut t = tally();
        t.pods_total = 260;
        t.pods_started = 257;
        t.pods_failing = 3;
        (t.running, t.queued, t.parked, t.cri_pulls, t.pull_requests) = (4, 10, 10, 1234, 12345);
        (t.joins, t.throttled_pulls) = (11111, 999);
        t.ensure_errors.insert("ImagePullBackOff".into(), 9999);
        (t.disk_capacity, t.disk_used, t.gc_runs, t.gc_bytes_freed) =
            (12_000_000_000, 11_000_000_000, 999, 99_990_000_000);
        for l in lines(&t, Duration::from_secs(59)) {
            assert!(l.chars().count() < 80, "{} columns: {l}", l.chars().count());
        }
    }

    #[test]
    fn a_terminal_is_redrawn_in_place() {
        let mut d = Display::new(Vec::new(), true);
        d.update(&tally(), Duration::ZERO).expect("write");
        d.update(&tally(), Duration::from_millis(200)).expect("write");
        let text = String::from_utf8(d.out().clone()).expect("utf8");
        assert_eq!(text.matches("\x1b[4A").count(), 1, "moves up once, over the four lines");
        assert!(text.contains("[##########----------] 5/10 started"), "{text}");
        assert!(text.contains("[########--------]  50% of 100 B"), "{text}");
    }
}
