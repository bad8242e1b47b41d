//! `spool-api` and `spool-worker` as real child processes, for tests that kill, stop and
//! restart them. Output goes to a log file per process, which tests can read (and which is
//! printed when `TEST_LOG=1`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

/// Environment variables from pairs, as [`Process::spawn`] takes them.
pub fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// What launched servers share: a database, a Redis and a key prefix in it.
pub struct Backing<'a> {
    /// `DATABASE_URL`.
    pub database_url: &'a str,
    /// `REDIS_URL`.
    pub redis_url: &'a str,
    /// `SPOOL_REDIS_PREFIX`.
    pub redis_prefix: &'a str,
}

impl Backing<'_> {
    fn vars(&self, own: &[(&str, &str)], settings: &[(&str, &str)]) -> HashMap<String, String> {
        let mut vars = vars(&[
            ("DATABASE_URL", self.database_url),
            ("REDIS_URL", self.redis_url),
            ("SPOOL_REDIS_PREFIX", self.redis_prefix),
        ]);
        vars.extend(self::vars(own));
        vars.extend(self::vars(settings));
        vars
    }

    /// Starts `spool-api serve` (test JWT secret, no embedded workers) with `settings` on top and
    /// waits until it answers `/healthz`; returns it and its base URL.
    ///
    /// It listens on port 0 and the address is read back from its log: a port picked here and
    /// bound there could be taken in between by one of the many client sockets of tests or
    /// benchmarks running alongside.
    pub async fn start_api(
        &self,
        settings: &[(&str, &str)],
        timeout: Duration,
    ) -> anyhow::Result<(Process, String)> {
        let own = [
            ("SPOOL_API_ADDR", "127.0.0.1:0"),
            ("SPOOL_JWT_SECRET", crate::JWT_SECRET),
        ];
        wait_for_postgres_room(self.database_url, timeout).await;
        let api = Process::spawn("spool-api", &["serve"], &self.vars(&own, settings))?;
        let every = Duration::from_millis(5);
        let addr = crate::try_poll_until("spool-api to listen", timeout, every, || async {
            api.logged("spool-api listening", "addr")
        })
        .await?;
        let base = format!("http://{addr}");
        let http = reqwest::Client::new();
        crate::try_poll_until("spool-api to answer /healthz", timeout, every, || async {
            let response = http.get(format!("{base}/healthz")).send().await.ok()?;
            response.status().is_success().then_some(())
        })
        .await?;
        Ok((api, base))
    }

    /// Starts `spool-worker run` with `settings` on top and waits until it has started
    /// claiming. Its metrics port is left to its default, as an operator would: several
    /// workers on one host must start with the same configuration.
    pub async fn start_worker(
        &self,
        settings: &[(&str, &str)],
        timeout: Duration,
    ) -> anyhow::Result<Process> {
        wait_for_postgres_room(self.database_url, timeout).await;
        let worker = self.spawn_worker(settings)?;
        let every = Duration::from_millis(5);
        crate::try_poll_until("the worker to start", timeout, every, || async {
            worker.output().contains("worker started").then_some(())
        })
        .await?;
        Ok(worker)
    }
}

/// Connections a started process may open (a pool of `SPOOL_DB_MAX_CONNECTIONS`, the
/// worker's lease pool, the API's listeners) with some to spare.
const ROOM_PER_PROCESS: i64 = 30;

/// Waits, up to `timeout`, until Postgres has room for one more process's connections.
///
/// Tests run in parallel against one Postgres (100 connections on a fresh machine), each with
/// its API and workers: without this, two tests that each start several processes can together
/// pass `max_connections`, and a process then fails to start with "too many clients", a failure
/// of the test bench and not of Spool. Past the timeout it goes on (the process may then fail,
/// and says why).
pub async fn wait_for_postgres_room(database_url: &str, timeout: Duration) {
    let free = async || -> Option<i64> {
        use sqlx::Connection as _;
        let Ok(mut conn) = sqlx::PgConnection::connect(database_url).await else {
            return Some(0);
        };
        let free = sqlx::query_scalar(
            "SELECT current_setting('max_connections')::bigint
                    - current_setting('superuser_reserved_connections')::bigint
                    - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
        )
        .fetch_one(&mut conn)
        .await
        .ok();
        let _ = conn.close().await;
        free
    };
    let every = Duration::from_millis(100);
    let _ = crate::try_poll_until(
        "room in Postgres for a process",
        timeout,
        every,
        async || {
            // A failed query says nothing: go on rather than wait for nothing.
            free()
                .await
                .is_none_or(|n| n >= ROOM_PER_PROCESS)
                .then_some(())
        },
    )
    .await;
}

impl Backing<'_> {
    /// Spawns `spool-worker run` with `settings` on top, without waiting for it.
    pub fn spawn_worker(&self, settings: &[(&str, &str)]) -> anyhow::Result<Process> {
        // The API's secret, as an operator gives every process: the identity key that
        // workers sign with is derived from it.
        let own = [("SPOOL_JWT_SECRET", crate::JWT_SECRET)];
        Process::spawn("spool-worker", &["run"], &self.vars(&own, settings))
    }
}

/// A running Spool process.
pub struct Process {
    child: Child,
    /// Its pid.
    pub pid: u32,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

/// The directory that holds the workspace's binaries (next to the test executable's `deps/`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The path of a workspace binary; panics with a hint if it has not been built.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace` so the binaries are built",
        path.display()
    );
    path
}

impl Process {
    /// Starts `binary args...` with `env` on top of a clean Spool environment.
    pub fn spawn(name: &str, args: &[&str], env: &HashMap<String, String>) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!(
            "{name}-{}.log",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        ));
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(binary(name));
        command
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env(
                "RUST_LOG",
                std::env::var("SPOOL_TEST_CHILD_LOG").unwrap_or("info".into()),
            )
            .env("SPOOL_LOG_FORMAT", "json")
            .envs(env)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("spawning {name}"))?;
        let pid = child.id().context("child has no pid")?;
        Ok(Self { child, pid, log })
    }

    /// Sends a signal by name (`KILL`, `TERM`, `STOP`, `CONT`).
    pub fn signal(&self, signal: &str) {
        assert!(self.send(signal), "kill -{signal} {} failed", self.pid);
    }

    /// `kill -<signal>` to its pid; whether `kill` succeeded (its complaints not shown).
    fn send(&self, signal: &str) -> bool {
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `kill -9` and reap.
    pub async fn kill9(&mut self) {
        self.signal("KILL");
        let _ = self.child.wait().await;
    }

    /// SIGKILLs it unless it has exited already, and reaps it, polling for at most `within`
    /// (synchronous, so a `Drop` can call it). Unlike [`Process::signal`], a process that is
    /// already gone is no failure.
    pub fn kill_and_reap(&mut self, within: Duration) {
        let _ = self.child.start_kill();
        let deadline = std::time::Instant::now() + within;
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the process to exit; returns its exit code.
    pub async fn wait(&mut self, timeout: Duration) -> Option<i32> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => None,
        }
    }

    /// The value of `field` in the first JSON log line whose message is `message`, if logged.
    pub fn logged(&self, message: &str, field: &str) -> Option<String> {
        self.output().lines().find_map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).ok()?;
            if entry["message"] != message {
                return None;
            }
            entry[field].as_str().map(str::to_owned)
        })
    }

    /// Everything it has logged so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A stopped process cannot die of SIGKILL until it is continued on some kernels' views
        // of ptrace; SIGCONT first is harmless, to our child. Only while it is not reaped: the
        // pid of a reaped child (after `kill9`, `wait` or `kill_and_reap`) may be another
        // process's by now, a stopped worker of another test perhaps. (An unreaped child that
        // has exited keeps its pid as a zombie until it is reaped, so the check cannot race.)
        if matches!(self.child.try_wait(), Ok(None)) {
            self.send("CONT");
            let _ = self.child.start_kill();
        }
        if std::env::var("TEST_LOG").is_ok_and(|v| v == "1") {
            eprintln!("---- {} ----\n{}", self.log.display(), self.output());
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// How many TCP connections process `pid` has open to port `port` (read from `/proc`).
pub fn connections_to_port(pid: u32, port: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|t| t.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let port_hex = format!(":{port:04X}");
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // cols[2] is the remote address, cols[3] the state (01 = established), cols[9] the inode.
            if cols.len() > 9
                && cols[2].ends_with(&port_hex)
                && cols[3] == "01"
                && inodes.contains(cols[9])
            {
                count += 1;
            }
        }
    }
    count
}
