//! Third-party peers the tests run against as real processes, pinned in `tests/peers/`:
//! `@copilotkit/aimock` (`package.json` and its lock), a mock LLM upstream that speaks the
//! OpenAI and Anthropic APIs; and the official `openai` Python SDK (`requirements.txt`, every
//! package pinned), a client of Spool's OpenAI-compatible routes; and `jose`, the JWT library
//! of docs/security.md's tool-side example; and `zod`, the schema library of the Node SDK's
//! structured outputs; and `@modelcontextprotocol/server-everything`, the MCP reference test
//! server, in both its HTTP transports ([`McpEverything`]). They are installed (`npm ci`;
//! `pip install` into `tests/peers/.venv`) the first time a test needs them (this machine
//! reaches the registries), so `cargo test --workspace` alone runs them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

/// One install at a time within a test binary.
static INSTALL: Mutex<()> = Mutex::new(());

/// The directory of the pinned peers, installed.
fn installed() -> anyhow::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let wanted = [
        "@copilotkit/aimock",
        "@modelcontextprotocol/server-everything",
        "ai",
        "eventsource-parser",
        "jose",
        "openai",
        "playwright-core",
        "zod",
    ];
    if wanted.iter().any(|name| {
        !dir.join("node_modules")
            .join(name)
            .join("package.json")
            .exists()
    }) {
        let output = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .context("running npm (Node 20 and npm are needed for the peer tests)")?;
        anyhow::ensure!(
            output.status.success(),
            "npm ci in {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(dir)
}

/// `tests/peers/`, with its npm packages installed: run its Node scripts from there.
pub fn node_peers() -> anyhow::Result<PathBuf> {
    installed()
}

/// `clients/typescript/` (the `@spool/ai-sdk` package), with its pinned development packages
/// installed (`npm ci`, once per content of its `package-lock.json`) and its committed build
/// (`dist/`) checked against `tsc`'s output of `src/`: a change to the source without a rebuild
/// fails here. Its tests run from there.
pub fn typescript_client() -> anyhow::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript");
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lock = std::fs::read(dir.join("package-lock.json"))?;
    let stamp = dir.join("node_modules").join(format!(
        ".installed-{}",
        hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&lock)[..8])
    ));
    let npm = |args: &[&str]| -> anyhow::Result<()> {
        let output = std::process::Command::new("npm")
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .context("running npm (Node 20 and npm are needed for the client tests)")?;
        anyhow::ensure!(
            output.status.success(),
            "npm {} in {} failed: {}{}",
            args.join(" "),
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    if !stamp.exists() {
        npm(&["ci", "--no-audit", "--no-fund"])?;
        std::fs::write(&stamp, b"")?;
    }
    npm(&["run", "--silent", "check-dist"])?;
    Ok(dir)
}

/// `examples/nextjs/` (the Next.js example app), with its pinned packages installed (`npm ci`,
/// once per content of its `package-lock.json`; `@spool/ai-sdk` is a link to
/// `clients/typescript`, whose committed `dist/` it uses) and built now with `next build`
/// (Turbopack, about 30 s on two cores), so the test runs the current sources.
pub fn nextjs_example() -> anyhow::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/nextjs");
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lock = std::fs::read(dir.join("package-lock.json"))?;
    let stamp = dir.join("node_modules").join(format!(
        ".installed-{}",
        hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&lock)[..8])
    ));
    let run = |program: &str, args: &[&str]| -> anyhow::Result<()> {
        let output = std::process::Command::new(program)
            .args(args)
            .current_dir(&dir)
            .env("NEXT_TELEMETRY_DISABLED", "1")
            .stdin(Stdio::null())
            .output()
            .with_context(|| {
                format!("running {program} (Node 20.9 or later and npm are needed)")
            })?;
        anyhow::ensure!(
            output.status.success(),
            "{program} {} in {} failed: {}{}",
            args.join(" "),
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    if !stamp.exists() {
        run("npm", &["ci", "--no-audit", "--no-fund"])?;
        std::fs::write(&stamp, b"")?;
    }
    run("node", &["node_modules/next/dist/bin/next", "build"])?;
    Ok(dir)
}

/// The Python of `clients/python/.venv`, with the client's pinned test requirements installed
/// (once per content of `clients/python/requirements.txt`) and the client itself installed
/// from `clients/python` as a user would (`pip install ./clients/python`, not editable; again
/// on every call, so the tests run the current code).
pub fn python_client() -> anyhow::Result<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let python = python_venv(&root)?;
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let output = std::process::Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--no-deps",
            "--force-reinstall",
        ])
        .arg(&root)
        .stdin(Stdio::null())
        .output()
        .context("pip install ./clients/python")?;
    anyhow::ensure!(
        output.status.success(),
        "pip install ./clients/python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((root, python))
}

/// The Python of `tests/peers/.venv`, with `requirements.txt` installed (once per content of
/// the file: a changed pin reinstalls).
pub fn python() -> anyhow::Result<PathBuf> {
    python_in("peers")
}

/// The Python of `tests/{dir}/.venv`, with `tests/{dir}/requirements.txt` installed (once per
/// content of the file: a changed pin reinstalls).
pub fn python_in(dir: &str) -> anyhow::Result<PathBuf> {
    python_venv(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
}

/// The Python of `{dir}/.venv`, with `{dir}/requirements.txt` installed (once per content of the
/// file).
fn python_venv(dir: &Path) -> anyhow::Result<PathBuf> {
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let requirements = std::fs::read(dir.join("requirements.txt"))?;
    let venv = dir.join(".venv");
    let python = venv.join("bin/python");
    let stamp = venv.join(format!(
        "installed-{}",
        hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&requirements)[..8])
    ));
    if stamp.exists() {
        return Ok(python);
    }
    let run = |command: &mut std::process::Command, what: &str| -> anyhow::Result<()> {
        let output = command
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {what}"))?;
        anyhow::ensure!(
            output.status.success(),
            "{what} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    run(
        std::process::Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "python3 -m venv (Python 3.9 or later is needed for the SDK tests)",
    )?;
    run(
        std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(dir.join("requirements.txt")),
        &format!("pip install -r {}", dir.join("requirements.txt").display()),
    )?;
    std::fs::write(stamp, b"")?;
    Ok(python)
}

/// A running aimock (its `llmock` server) on loopback, answering from fixtures.
pub struct Aimock {
    /// The base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub base_url: String,
    _child: tokio::process::Child,
    fixtures: PathBuf,
}

impl Aimock {
    /// Starts aimock with `fixtures` (its fixture file format: `{"fixtures": [{match,
    /// response}]}`); answers once it accepts connections.
    pub async fn start(fixtures: &Value) -> anyhow::Result<Self> {
        let dir = installed()?;
        let file = std::env::temp_dir().join(format!("aimock-{}.json", uuid::Uuid::new_v4()));
        std::fs::write(&file, fixtures.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new("node")
            .arg(dir.join("node_modules/@copilotkit/aimock/dist/cli.js"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--fixtures")
            .arg(&file)
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting aimock")?;
        let address = format!("127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&address).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "aimock did not listen on {address} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self {
            base_url: format!("http://{address}/v1"),
            _child: child,
            fixtures: file,
        })
    }
}

impl Drop for Aimock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.fixtures);
    }
}

/// A running `@modelcontextprotocol/server-everything` (the MCP reference test server, with
/// tools such as `echo` and `get-sum`), killed when dropped.
pub struct McpEverything {
    /// The URL to configure: `http://127.0.0.1:PORT/mcp` (Streamable HTTP) or `.../sse` (the
    /// legacy HTTP+SSE transport).
    pub url: String,
    _child: tokio::process::Child,
}

impl McpEverything {
    /// Starts it with `transport` (`streamableHttp` or `sse`, its own command-line names) on
    /// a free port; answers once it accepts connections.
    pub async fn start(transport: &str) -> anyhow::Result<Self> {
        let dir = installed()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new("node")
            .arg(dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js"))
            .arg(transport)
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting server-everything")?;
        let address = format!("127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&address).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "server-everything did not listen on {address} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let path = if transport == "sse" { "sse" } else { "mcp" };
        Ok(Self {
            url: format!("http://{address}/{path}"),
            _child: child,
        })
    }
}
