//! Private Redis and Postgres servers for tests that stop and restart them: never the shared
//! ones on 6379 and 5432, which every other test uses.
//!
//! Ports come from below the kernel's ephemeral range (32768 and up), so no client socket of a
//! test running alongside can take one between the check that it is free and the server
//! binding it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

/// A port below the ephemeral range that nothing listens on now, spread by process id so
/// concurrent test processes rarely try the same one, and never handed out twice by one
/// process: a test that restarts a server on its port leaves it free meanwhile, and another
/// test of the process must not take it (a Redis outage test once lost its port that way).
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let start = 20_000 + u16::try_from(std::process::id() % 5_000).unwrap_or(0);
    loop {
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if offset >= 2_000 {
            return 0;
        }
        let port = start + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A Redis server of its own (nothing kept on disk), which a test may kill and restart on the
/// same port.
pub struct OwnRedis {
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts `redis-server` on `port` (use [`free_port`]).
    pub fn start(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        Self {
            port,
            child: Some(child),
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Waits until it answers `PING`.
    pub async fn ready(&self, timeout: Duration) {
        let url = self.url();
        crate::poll_until("the private Redis to answer", timeout, || async {
            let client = redis::Client::open(url.as_str()).ok()?;
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .ok()
        })
        .await;
    }

    /// Kills it (SIGKILL; with nothing on disk, everything it held is lost).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        *self = Self::start(self.port);
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of its own on loopback: three masters, each with one replica (six
/// `redis-server`s, nothing kept on disk, a one-second node timeout), which a test may take a
/// master of down so that its replica takes over.
pub struct OwnRedisCluster {
    /// The nodes' ports on 127.0.0.1, masters first (as `redis-cli --cluster create` pairs
    /// them: the replica of the master at `i` is one of the last three).
    pub ports: Vec<u16>,
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

impl OwnRedisCluster {
    /// Starts six nodes on free ports, joins them as three masters with a replica each, and
    /// waits until every node says `cluster_state:ok` and every master has its replica.
    pub async fn start(timeout: Duration) -> anyhow::Result<Self> {
        let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
        anyhow::ensure!(!ports.contains(&0), "no free port for the cluster");
        let dir =
            std::env::temp_dir().join(format!("spool-cluster-{}-{}", std::process::id(), ports[0]));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut children = Vec::new();
        for port in &ports {
            let conf = dir.join(format!("nodes-{port}.conf"));
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .arg("--cluster-config-file")
                .arg(&conf)
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .spawn()
                .context("redis-server")?;
            children.push(Some(child));
        }
        let cluster = Self {
            ports,
            children,
            dir,
        };
        for port in &cluster.ports {
            let port = *port;
            crate::poll_until("a cluster node to answer", timeout, || async move {
                cluster_cli(port, &["ping"]).filter(|out| out.contains("PONG"))
            })
            .await;
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("redis-cli --cluster create")?;
        anyhow::ensure!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let ports = cluster.ports.clone();
        crate::poll_until(
            "the cluster to be ok with a replica per master",
            timeout,
            || {
                let ports = ports.clone();
                async move {
                    let ok = ports.iter().all(|port| {
                        cluster_cli(*port, &["cluster", "info"])
                            .is_some_and(|info| info.contains("cluster_state:ok"))
                    });
                    let replicated = ports[..3].iter().all(|port| {
                        cluster_cli(*port, &["info", "replication"])
                            .is_some_and(|info| info.contains("connected_slaves:1"))
                    });
                    (ok && replicated).then_some(())
                }
            },
        )
        .await;
        Ok(cluster)
    }

    /// The `REDIS_URL` that names it (the nodes, comma-separated).
    pub fn url(&self) -> String {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills the first master (SIGKILL: what it had not yet sent its replica is lost) and waits
    /// until its replica has taken over and the surviving nodes say `cluster_state:ok`;
    /// returns how long that took.
    pub async fn fail_over(&mut self, timeout: Duration) -> Duration {
        if let Some(mut child) = self.children[0].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let started = std::time::Instant::now();
        let killed = format!("127.0.0.1:{}@", self.ports[0]);
        let survivors: Vec<u16> = self.ports[1..].to_vec();
        crate::poll_until("a replica to take over the killed master", timeout, || {
            let (survivors, killed) = (survivors.clone(), killed.clone());
            // redis-cli blocks: off the runtime, so the load and the followers go on meanwhile.
            let check = move || {
                // `cluster nodes`: `<id> <ip:port@bus> <flags> ...`; the killed node's flags
                // gain `fail` (not just `fail?`) once the majority agrees it is down.
                let nodes = cluster_cli(survivors[0], &["cluster", "nodes"])?;
                let flags = |line: &str| line.split(' ').nth(2).unwrap_or("").to_owned();
                let failed = nodes.lines().any(|line| {
                    line.contains(&killed) && flags(line).split(',').any(|flag| flag == "fail")
                });
                let masters = nodes
                    .lines()
                    .filter(|line| !line.contains(&killed))
                    .filter(|line| flags(line).split(',').any(|flag| flag == "master"))
                    .count();
                let ok = survivors.iter().all(|port| {
                    cluster_cli(*port, &["cluster", "info"])
                        .is_some_and(|info| info.contains("cluster_state:ok"))
                });
                (failed && ok && masters == 3).then_some(())
            };
            async move { tokio::task::spawn_blocking(check).await.ok().flatten() }
        })
        .await;
        started.elapsed()
    }
}

/// `redis-cli -p port args...`'s output, if it ran.
fn cluster_cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

impl Drop for OwnRedisCluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgreSQL cluster of its own in a temporary directory (`initdb`, trust authentication,
/// superuser `root`), which a test may crash (`pg_ctl stop -m immediate`) and start again.
/// As root, the server runs as the `postgres` user (Postgres refuses to run as root).
pub struct OwnPostgres {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

impl OwnPostgres {
    /// Creates and starts a cluster on `port` (use [`free_port`]).
    pub fn start(port: u16) -> anyhow::Result<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .context("PostgreSQL binaries in /usr/lib/postgresql")?
            .flatten()
            .map(|entry| entry.path().join("bin"))
            .find(|bin| bin.join("initdb").exists())
            .context("no initdb under /usr/lib/postgresql")?;
        let dir = std::env::temp_dir().join(format!("spool-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        let cluster = Self {
            port,
            dir,
            bin,
            as_postgres,
        };
        if as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&cluster.dir)
                .status()?;
            anyhow::ensure!(status.success(), "chown of the cluster directory failed");
        }
        let data = cluster.dir.join("data");
        cluster.run(
            "initdb",
            &[
                "-D",
                &data.to_string_lossy(),
                "--auth=trust",
                "-U",
                "root",
                "--no-sync",
            ],
        )?;
        cluster.start_server()?;
        Ok(cluster)
    }

    /// The URL of database `name` on it (the API creates a missing database at start).
    pub fn url(&self, name: &str) -> String {
        format!("postgres://root@127.0.0.1:{}/{name}", self.port)
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start_server(&self) -> anyhow::Result<()> {
        let data = self.dir.join("data");
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200",
            self.port,
            self.dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                &data.to_string_lossy(),
                "-o",
                &options,
                "-l",
                &self.dir.join("log").to_string_lossy(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// Stops it as a crash would (`-m immediate`: no shutdown checkpoint; committed work is
    /// recovered from the WAL at the next start).
    pub fn crash(&self) -> anyhow::Result<()> {
        let data = self.dir.join("data");
        self.run(
            "pg_ctl",
            &[
                "-D",
                &data.to_string_lossy(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        )
    }

    fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        };
        let output = command
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {program}"))?;
        anyhow::ensure!(
            output.status.success(),
            "{program} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy on loopback that forwards to `target` and can cut every open connection at
/// once: a dropped network, as a client sees it.
pub struct CutProxy {
    /// Its address (`127.0.0.1:PORT`).
    pub addr: std::net::SocketAddr,
    cuts: tokio::sync::watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// Starts forwarding to `target` (`host:port`).
    pub async fn start(target: &str) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cuts, _) = tokio::sync::watch::channel(0);
        let target = target.to_owned();
        let sender = cuts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = sender.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Ok(Self { addr, cuts, accept })
    }

    /// Drops every connection open now (later ones go through).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
