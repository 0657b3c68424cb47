//! What the benchmark binaries share: the configuration, process and server
//! statistics, and the JSON lines they print.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::time::Duration;

use leasehold_testkit::RedisServer;

pub(crate) mod counting;

/// Quick mode: a tiny configuration that only shows the bench runs. On when
/// `LEASEHOLD_BENCH_QUICK=1`, and whenever the binary is run by `cargo test`
/// rather than `cargo bench` (which passes `--bench`), so that the test
/// suite checks every bench without a release build.
pub(crate) fn quick() -> bool {
    match std::env::var("LEASEHOLD_BENCH_QUICK") {
        Ok(v) => v != "0",
        Err(_) => !std::env::args().any(|a| a == "--bench"),
    }
}

/// An environment variable parsed as a number, or `default`.
pub(crate) fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// One JSON object, written by hand to keep the benches free of serializers.
#[derive(Default)]
pub(crate) struct Json(String);

impl Json {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn sep(&mut self) {
        self.0.push(if self.0.is_empty() { '{' } else { ',' });
    }

    pub(crate) fn str(mut self, name: &str, value: &str) -> Self {
        self.sep();
        let escaped: String = value
            .chars()
            .flat_map(|c| match c {
                '"' => vec!['\\', '"'],
                '\\' => vec!['\\', '\\'],
                c if c.is_control() => vec![' '],
                c => vec![c],
            })
            .collect();
        let _ = write!(self.0, "\"{name}\":\"{escaped}\"");
        self
    }

    pub(crate) fn num(mut self, name: &str, value: f64) -> Self {
        self.sep();
        if value.is_finite() {
            // Three significant decimals are plenty for a benchmark.
            let _ = write!(self.0, "\"{name}\":{}", (value * 1000.0).round() / 1000.0);
        } else {
            let _ = write!(self.0, "\"{name}\":null");
        }
        self
    }

    pub(crate) fn int(mut self, name: &str, value: u64) -> Self {
        self.sep();
        let _ = write!(self.0, "\"{name}\":{value}");
        self
    }

    pub(crate) fn opt(self, name: &str, value: Option<f64>) -> Self {
        self.num(name, value.unwrap_or(f64::NAN))
    }

    pub(crate) fn line(mut self) -> String {
        if self.0.is_empty() {
            self.0.push('{');
        }
        self.0.push('}');
        self.0
    }
}

/// The `p`-th percentile (0..=100) of sorted samples, in microseconds.
pub(crate) fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// The median of some numbers.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        f64::midpoint(values[mid - 1], values[mid])
    }
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the file: 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // Linux reports them in USER_HZ, 100 on every architecture it runs on.
    Some((utime + stime) / 100.0)
}

/// A field of /proc/self/status, in bytes (`VmRSS`, `VmHWM`).
pub(crate) fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resets the process's peak RSS (VmHWM) to its current RSS.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The CPUs this process may run on, as Linux lists them (`0`, `0-1`).
pub(crate) fn cpus_allowed() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Cpus_allowed_list"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default()
}

/// The server's CPU seconds (user + system of the main process), from `INFO cpu`.
pub(crate) fn server_cpu_seconds(server: &RedisServer) -> Option<f64> {
    server_cpu_split(server).map(|(user, sys)| user + sys)
}

/// The server's user and system CPU seconds (main process), from `INFO cpu`:
/// the user time is what an instruction count of the server measures, the
/// system time its socket reads and writes.
pub(crate) fn server_cpu_split(server: &RedisServer) -> Option<(f64, f64)> {
    let info = server.cli(&["INFO", "cpu"]).ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((field("used_cpu_user")?, field("used_cpu_sys")?))
}

/// The server's version, from `INFO server`.
pub(crate) fn server_version(server: &RedisServer) -> String {
    server
        .cli(&["INFO", "server"])
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("redis_version:")
                    .map(|v| v.trim().to_owned())
            })
        })
        .unwrap_or_default()
}

/// Runs this binary again for each scenario, one process each, so that CPU
/// and peak memory are measured per scenario; the child prints its JSON line.
pub(crate) fn run_children(scenarios: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    for scenario in scenarios {
        let status = std::process::Command::new(&exe)
            .args(std::env::args().skip(1))
            .env("LEASEHOLD_BENCH_SCENARIO", scenario)
            .env("LEASEHOLD_BENCH_QUICK", if quick() { "1" } else { "0" })
            .status()?;
        if !status.success() {
            return Err(format!("scenario {scenario} failed: {status}").into());
        }
    }
    Ok(())
}

/// The scenario this process runs, when it is a child of [`run_children`].
pub(crate) fn child_scenario() -> Option<String> {
    std::env::var("LEASEHOLD_BENCH_SCENARIO").ok()
}
