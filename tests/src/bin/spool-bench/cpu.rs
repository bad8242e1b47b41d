//! A first-order profile of every scenario: CPU seconds each process group spent while it
//! ran (from `/proc/<pid>/stat`), so a figure comes with where its time went (our API, our
//! workers, Postgres, Redis, or the load generator itself). Processes that exit between the two
//! snapshots are not counted (a pgbench run's backends, for instance).

use std::collections::HashMap;

use serde::Serialize;

/// Clock ticks per second of `/proc/<pid>/stat` times (`CLK_TCK`, 100 on Linux).
const TICKS: f64 = 100.0;

/// The process groups a scenario is split into.
#[derive(Clone, Debug, Default)]
pub(crate) struct Groups {
    pub(crate) api: Vec<u32>,
    pub(crate) workers: Vec<u32>,
}

/// CPU ticks per pid, with each pid's group.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    ticks: HashMap<u32, (String, u64)>,
}

/// CPU seconds per group between two snapshots.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Split {
    pub(crate) seconds: Vec<(String, f64)>,
}

fn stat(pid: u32) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_owned();
    let fields: Vec<&str> = text[close + 2..].split(' ').collect();
    // After the comm: state is field 3, utime 14, stime 15 (1-based over the whole line).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

impl Snapshot {
    /// Reads every process's CPU time now.
    pub(crate) fn take(groups: &Groups) -> Self {
        let me = std::process::id();
        let mut ticks = HashMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Self { ticks };
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Some((comm, t)) = stat(pid) else { continue };
            let group = if groups.api.contains(&pid) {
                "spool-api"
            } else if groups.workers.contains(&pid) {
                "spool-worker"
            } else if pid == me {
                "load generator"
            } else if comm == "postgres" {
                "postgres"
            } else if comm.starts_with("redis-server") {
                "redis"
            } else if comm == "pgbench" || comm.starts_with("redis-benchmar") {
                "baseline client"
            } else {
                continue;
            };
            ticks.insert(pid, (group.to_owned(), t));
        }
        Self { ticks }
    }

    /// CPU seconds per group since `before`, largest first.
    pub(crate) fn since(&self, before: &Self) -> Split {
        let mut by_group: HashMap<String, u64> = HashMap::new();
        for (pid, (group, t)) in &self.ticks {
            let start = before.ticks.get(pid).map_or(0, |(_, t)| *t);
            *by_group.entry(group.clone()).or_default() += t.saturating_sub(start);
        }
        let mut seconds: Vec<(String, f64)> = by_group
            .into_iter()
            .map(|(g, t)| (g, t as f64 / TICKS))
            .filter(|(_, s)| *s > 0.0)
            .collect();
        seconds.sort_by(|a, b| b.1.total_cmp(&a.1));
        Split { seconds }
    }
}

impl Split {
    /// `api 1.20 s, postgres 0.80 s, ...`, with per-operation milliseconds when `ops` > 0.
    pub(crate) fn describe(&self, ops: u64) -> String {
        self.seconds
            .iter()
            .map(|(group, s)| {
                if ops > 0 {
                    format!("{group} {s:.2} s ({:.3} ms/op)", s * 1000.0 / ops as f64)
                } else {
                    format!("{group} {s:.2} s")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Resident memory of `pid` in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `perf record` of some processes while a round runs (`--perf DIR`), reported as the hottest
/// symbols per process: where the CPU time of the CPU split above went.
pub(crate) struct Perf {
    child: tokio::process::Child,
    data: std::path::PathBuf,
    report: std::path::PathBuf,
}

impl Perf {
    /// Starts sampling `pids` into `dir/<name>.data`, if `dir` is set.
    pub(crate) fn start(dir: Option<&std::path::Path>, name: &str, pids: &[u32]) -> Option<Self> {
        let dir = dir?;
        std::fs::create_dir_all(dir).ok()?;
        let data = dir.join(format!("{name}.data"));
        let pids = pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let child = tokio::process::Command::new("perf")
            .args(["record", "-q", "-F", "999", "-p", &pids, "-o"])
            .arg(&data)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // A scenario that fails before `finish` must not leave perf running.
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        Some(Self {
            child,
            data,
            report: dir.join(format!("{name}.txt")),
        })
    }

    /// Stops sampling and writes the report next to the data.
    pub(crate) async fn finish(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status()
                .await;
        }
        let _ = self.child.wait().await;
        let mut text = String::new();
        for (sort, lines) in [("comm,dso", 15), ("comm,dso,symbol", 50)] {
            let Ok(out) = tokio::process::Command::new("perf")
                .args(["report", "--stdio", "--no-children", "--sort", sort, "-i"])
                .arg(&self.data)
                .output()
                .await
            else {
                return;
            };
            text.push_str(&format!("## by {sort}\n"));
            for line in String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .take(lines)
            {
                text.push_str(&line.split_whitespace().collect::<Vec<_>>().join(" "));
                text.push('\n');
            }
        }
        let _ = std::fs::write(&self.report, text);
    }
}

/// The pids of every process whose command name starts with `comm`.
pub(crate) fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|(c, _)| c.starts_with(comm)))
        .collect()
}

/// CPU seconds the whole machine has been busy (every process, the kernel included), from
/// `/proc/stat`: compares Spool with a baseline whose server processes exit before they can
/// be read one by one.
pub(crate) fn machine_busy_secs() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    // user nice system idle iowait irq softirq steal ...
    let ticks: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    busy as f64 / TICKS
}
