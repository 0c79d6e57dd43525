//! Real `redis-server` processes for tests: a standalone server, a 3+3
//! cluster, and a primary + replica behind one or more sentinels.
//!
//! Every process runs on a free loopback port, in its own temporary
//! directory, without persistence (`--save "" --appendonly no`), and is
//! killed when its owner is dropped, so a failing test still cleans up. The
//! functions block (they spawn processes and poll them); call them before the
//! code under test starts, or from a multi-threaded runtime.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

const INSTALL_HINT: &str = "install it with `apt-get install -y redis-server` \
     (it provides redis-server and redis-cli)";
/// Node timeout of test clusters: a killed primary is replaced in ~2-3 s.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1_000;
/// Service name the test sentinels monitor.
pub const SENTINEL_SERVICE: &str = "tollgate";

/// Panics with an installation hint unless redis-server and redis-cli are
/// on PATH.
pub fn require_redis() {
    for tool in ["redis-server", "redis-cli"] {
        let found = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
            .unwrap_or(false);
        assert!(found, "`{tool}` is not on PATH: {INSTALL_HINT}");
    }
}

/// Runs `redis-cli -p <port> <args>` and returns its trimmed standard output
/// (Redis error replies included: redis-cli prints them and succeeds).
/// Panics, naming the command and its stderr, when redis-cli itself fails
/// (no server on the port, for one): a test must not read that as a reply.
pub fn cli(port: u16, args: &[&str]) -> String {
    try_cli(port, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `calls=` of `INFO commandstats` for `command` (`evalsha`, `script|load`)
/// on the node at `port`; 0 only when the command was never called (Redis
/// then omits its line). Panics when the node does not answer.
pub fn command_calls(port: u16, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    let stats = cli(port, &["INFO", "commandstats"]);
    assert!(
        stats.contains("# Commandstats"),
        "INFO commandstats on {port} answered {stats:?}"
    );
    let Some(line) = stats.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        return 0;
    };
    line.split(',')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable {command} stats on {port}: {line:?}"))
}

/// [`cli`] for polling a node that may be down: the failure as `Err`.
pub fn try_cli(port: u16, args: &[&str]) -> Result<String, String> {
    cli_with(&[], port, args)
}

/// [`try_cli`] with options before the command (e.g. TLS files).
fn cli_with(options: &[String], port: u16, args: &[&str]) -> Result<String, String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(options)
        .args(args)
        .stdin(Stdio::null())
        .output();
    let command = format!("redis-cli -p {port} {}", args.join(" "));
    match output {
        Ok(out) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
        Ok(out) => Err(format!(
            "`{command}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )),
        Err(e) => Err(format!("cannot run `{command}`: {e} ({INSTALL_HINT})")),
    }
}

/// Polls `ready` every 50 ms until it holds; panics naming `what` after
/// `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(50));
    }
}

/// A loopback port that was free a moment ago, with `port + 10000` (a
/// cluster node's bus port) free as well.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port > u16::MAX - 10_000 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One redis-server process.
struct Node {
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// redis-cli options needed to talk to it (TLS).
    cli_options: Vec<String>,
    child: Option<Child>,
}

impl Node {
    /// Starts a node on a free port; `args(port)` gives the command line
    /// after the program name. Retries on another port when the chosen one
    /// was taken in the meantime.
    fn start(dir: &Path, args: impl Fn(u16) -> Vec<String>) -> Node {
        Node::start_with_cli(dir, args, Vec::new())
    }

    fn start_with_cli(
        dir: &Path,
        args: impl Fn(u16) -> Vec<String>,
        cli_options: Vec<String>,
    ) -> Node {
        require_redis();
        let mut last_log = String::new();
        for _ in 0..10 {
            let port = free_port();
            let mut node = Node {
                port,
                dir: dir.to_owned(),
                args: args(port),
                cli_options: cli_options.clone(),
                child: None,
            };
            match node.launch() {
                Ok(()) => return node,
                Err(log) => last_log = log,
            }
        }
        panic!("redis-server did not start after 10 attempts; last log:\n{last_log}");
    }

    /// Spawns the process on `self.port` and waits until it answers PING.
    fn launch(&mut self) -> Result<(), String> {
        let log = self.log_path();
        let mut child = Command::new("redis-server")
            .args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server: {e}; {INSTALL_HINT}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.try_cli(&["PING"]).is_ok_and(|r| r == "PONG") {
                self.child = Some(child);
                return Ok(());
            }
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fs::read_to_string(&log).unwrap_or_default());
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        cli_with(&self.cli_options, self.port, args)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("redis-{}.log", self.port))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Sends `signal` (`STOP`, `CONT`...) to the process.
    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("a running node");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {}", child.id());
    }

    /// Starts the process again on the same port, same arguments.
    fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.launch() {
                Ok(()) => return,
                // The port may linger or be taken briefly: try again.
                Err(log) if Instant::now() > deadline => {
                    panic!("redis-server did not restart on port {}:\n{log}", self.port)
                }
                Err(_) => sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The arguments every data node gets.
fn base_args(dir: &Path, port: u16) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
        "--logfile",
        &format!("redis-{port}.log"),
        "--daemonize",
        "no",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("tollgate-redis-")
        .tempdir()
        .expect("create a temporary directory")
}

/// Certificates for a TLS server, made with `openssl` for `127.0.0.1`.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate the server accepts (mutual TLS).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// A throwaway CA, a server certificate for IP 127.0.0.1 and a client
    /// certificate, in `dir`.
    pub fn generate(dir: &Path) -> TlsFiles {
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run openssl: {e}; install it with `apt-get install -y openssl`")
                });
            assert!(
                out.status.success(),
                "openssl {args:?} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &key[..],
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=tollgate test CA",
                ],
            ]
            .concat(),
        );
        for (name, extensions) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key_file, csr, cert, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            fs::write(dir.join(&ext), extensions).expect("write extensions");
            openssl(
                &[
                    &["req"][..],
                    &key[..],
                    &[
                        "-keyout",
                        &key_file,
                        "-out",
                        &csr,
                        "-subj",
                        &format!("/CN=tollgate test {name}"),
                    ],
                ]
                .concat(),
            );
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ]);
        }
        TlsFiles {
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }

    fn cli_options(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.display().to_string();
        vec![
            "--tls".into(),
            "--cacert".into(),
            path(&self.ca_cert),
            "--cert".into(),
            path(&self.client_cert),
            "--key".into(),
            path(&self.client_key),
        ]
    }
}

/// A standalone Redis server.
pub struct RedisServer {
    // Declared before `dir`: the process dies before its directory goes.
    node: Node,
    tls: Option<TlsFiles>,
    _dir: TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = temp_dir();
        let path = dir.path().to_owned();
        let node = Node::start(&path, |port| base_args(&path, port));
        RedisServer {
            node,
            tls: None,
            _dir: dir,
        }
    }

    /// A server that speaks only TLS and requires a client certificate.
    pub fn start_tls() -> RedisServer {
        let dir = temp_dir();
        let path = dir.path().to_owned();
        let tls = TlsFiles::generate(&path);
        let node = Node::start_with_cli(
            &path,
            |port| {
                let mut args = base_args(&path, port);
                // base_args puts the plain port first: replace it.
                args[1] = "0".into();
                let path = |p: &PathBuf| p.display().to_string();
                args.extend([
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cert-file".into(),
                    path(&tls.server_cert),
                    "--tls-key-file".into(),
                    path(&tls.server_key),
                    "--tls-ca-cert-file".into(),
                    path(&tls.ca_cert),
                    "--tls-auth-clients".into(),
                    "yes".into(),
                ]);
                args
            },
            tls.cli_options(),
        );
        RedisServer {
            node,
            tls: Some(tls),
            _dir: dir,
        }
    }

    /// The certificates, for a server from [`RedisServer::start_tls`].
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// `redis://`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.node.port)
    }

    /// Kills the server (SIGKILL): clients see their connections drop.
    pub fn stop(&mut self) {
        self.node.kill();
    }

    /// Starts the server again on the same port (with an empty dataset).
    pub fn restart(&mut self) {
        self.node.restart();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing
    /// answers. [`Self::resume`] lets it go on.
    pub fn pause(&self) {
        self.node.signal("STOP");
    }

    pub fn resume(&self) {
        self.node.signal("CONT");
    }

    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    pub fn cli(&self, args: &[&str]) -> String {
        self.node.cli(args)
    }
}

/// A Redis Cluster of 3 primaries, each with one replica.
pub struct RedisCluster {
    nodes: Vec<Node>,
    coverage: &'static str,
    _dir: TempDir,
}

/// A cluster node's command line.
fn cluster_args(dir: &Path, port: u16, coverage: &str) -> Vec<String> {
    let mut args = base_args(dir, port);
    args.extend(
        [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &format!("nodes-{port}.conf"),
            "--cluster-node-timeout",
            &CLUSTER_NODE_TIMEOUT_MS.to_string(),
            // Let a replica take over however stale it is.
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-require-full-coverage",
            coverage,
        ]
        .map(str::to_owned),
    );
    args
}

/// Runs `redis-cli --cluster ARGS` and insists it succeeds.
pub fn cluster_tool(args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .arg("--cluster")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}; {INSTALL_HINT}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "redis-cli --cluster {args:?} failed:\n{text}"
    );
    text
}

/// The shape of a [`RedisCluster`].
#[derive(Debug, Clone, Copy)]
pub struct ClusterOptions {
    /// Replicas per primary (there are always 3 primaries).
    pub replicas: usize,
    /// `cluster-require-full-coverage`: with `false`, the live primaries
    /// keep serving their slots while another primary's slots are down.
    pub require_full_coverage: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            replicas: 1,
            require_full_coverage: true,
        }
    }
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_with(ClusterOptions::default())
    }

    pub fn start_with(options: ClusterOptions) -> RedisCluster {
        let dir = temp_dir();
        let path = dir.path().to_owned();
        let coverage = if options.require_full_coverage {
            "yes"
        } else {
            "no"
        };
        let nodes: Vec<Node> = (0..3 * (1 + options.replicas))
            .map(|_| Node::start(&path, |port| cluster_args(&path, port, coverage)))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &options.replicas.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}; {INSTALL_HINT}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster {
            nodes,
            coverage,
            _dir: dir,
        };
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Starts one more node and adds it to the cluster as a primary with
    /// no slots (`redis-cli --cluster add-node`); returns its port.
    pub fn add_primary(&mut self) -> u16 {
        let path = self._dir.path().to_owned();
        let coverage = self.coverage;
        let node = Node::start(&path, |port| cluster_args(&path, port, coverage));
        let port = node.port;
        let seed = format!("127.0.0.1:{}", self.live_ports()[0]);
        self.nodes.push(node);
        cluster_tool(&["add-node", &format!("127.0.0.1:{port}"), &seed]);
        self.wait_healthy(Duration::from_secs(30));
        port
    }

    /// Forgets the node on `port` (removed with `del-node`, which shuts
    /// it down): health checks no longer wait for it.
    pub fn forget_node(&mut self, port: u16) {
        if let Some(i) = self.nodes.iter().position(|n| n.port == port) {
            let mut node = self.nodes.remove(i);
            node.kill();
        }
    }

    /// Each node's id and port, with its slot count for a primary and
    /// `None` for a replica, by a live node's `CLUSTER NODES`.
    pub fn node_ids(&self) -> Vec<(String, u16, Option<usize>)> {
        let port = self.live_ports()[0];
        cli(port, &["CLUSTER", "NODES"])
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f
                    .get(1)?
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let primary = f.get(2)?.split(',').any(|x| x == "master");
                let slots = f[8..]
                    .iter()
                    .filter(|r| !r.starts_with('['))
                    .map(|r| {
                        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
                        hi.parse::<usize>().unwrap() - lo.parse::<usize>().unwrap() + 1
                    })
                    .sum();
                Some((f[0].to_string(), port, primary.then_some(slots)))
            })
            .collect()
    }

    /// Ports of the nodes started (running or not).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| n.port)
            .collect()
    }

    /// `redis-cluster://` URL naming every node as a seed.
    pub fn url(&self) -> String {
        let ports = self.ports();
        let mut url = format!("redis-cluster://127.0.0.1:{}", ports[0]);
        for (i, port) in ports[1..].iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{port}"));
        }
        url
    }

    /// Waits until every running node reports `cluster_state:ok`, knows all
    /// nodes, and every replica is in sync with its primary.
    pub fn wait_healthy(&self, timeout: Duration) {
        let total = self.nodes.len();
        let live = self.live_ports();
        wait_until("a healthy cluster", timeout, || {
            live.iter().all(|&port| {
                let info = try_cli(port, &["CLUSTER", "INFO"]).unwrap_or_default();
                let replication = try_cli(port, &["INFO", "replication"]).unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{total}"))
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            })
        });
    }

    /// Waits until every running node reports `cluster_state:ok` (after a
    /// failover: the dead node stays known, as failed).
    pub fn wait_state_ok(&self, timeout: Duration) {
        let live = self.live_ports();
        wait_until("cluster_state:ok on every live node", timeout, || {
            live.iter().all(|&port| {
                try_cli(port, &["CLUSTER", "INFO"]).is_ok_and(|r| r.contains("cluster_state:ok"))
            })
        });
    }

    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }

    /// Runs a command on every running node; returns the replies by port.
    pub fn cli_all(&self, args: &[&str]) -> Vec<(u16, String)> {
        self.live_ports()
            .into_iter()
            .map(|port| (port, cli(port, args)))
            .collect()
    }

    /// Empties the script cache of every running node.
    pub fn script_flush_all(&self) {
        for (port, reply) in self.cli_all(&["SCRIPT", "FLUSH"]) {
            assert_eq!(reply, "OK", "SCRIPT FLUSH on {port}");
        }
    }

    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        let reply = cli(port, &["CLUSTER", "KEYSLOT", key]);
        reply
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT answered {reply:?}"))
    }

    /// Port of the primary serving `key`'s slot, by a running node's
    /// `CLUSTER NODES` (a primary flagged `fail` does not count).
    pub fn primary_for_key(&self, key: &str) -> Option<u16> {
        self.primary_for_slot(self.keyslot(key))
    }

    /// Port of the primary serving `slot`, as [`Self::primary_for_key`].
    pub fn primary_for_slot(&self, slot: u16) -> Option<u16> {
        let port = self.live_ports()[0];
        let nodes = cli(port, &["CLUSTER", "NODES"]);
        nodes.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let flags: Vec<&str> = fields[2].split(',').collect();
            if !flags.contains(&"master") || flags.contains(&"fail") {
                return None;
            }
            let owns = fields[8..].iter().any(|range| {
                if range.starts_with('[') {
                    return false;
                }
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                match (lo.parse::<u16>(), hi.parse::<u16>()) {
                    (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
                    _ => false,
                }
            });
            if !owns {
                return None;
            }
            // 127.0.0.1:7000@17000[,hostname]
            let address = fields[1].split('@').next()?;
            address.rsplit(':').next()?.parse().ok()
        })
    }

    /// Kills the node listening on `port` (SIGKILL).
    pub fn kill_node(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"));
        node.kill();
    }

    /// Freezes the node listening on `port` (SIGSTOP): its connections
    /// stay open and nothing answers, as with a hung host. [`Self::kill_node`]
    /// still works on it.
    pub fn pause_node(&mut self, port: u16) {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"));
        node.signal("STOP");
    }

    /// Starts the node on `port` again, same arguments: it rejoins the
    /// cluster with its slots (its `nodes.conf` is kept), but no data.
    pub fn restart_node(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"));
        node.restart();
    }

    /// Kills the primary that serves `key`; returns its port.
    pub fn kill_primary_for_key(&mut self, key: &str) -> u16 {
        let port = self
            .primary_for_key(key)
            .unwrap_or_else(|| panic!("no live primary serves {key:?}"));
        self.kill_node(port);
        port
    }
}

/// How [`RedisSentinel::start_with`] sets up its sentinels.
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    /// Sentinel processes; the quorum is a majority of them.
    pub sentinels: usize,
    /// `sentinel down-after-milliseconds`: how long the primary must be
    /// silent before a sentinel considers it down.
    pub down_after_ms: u64,
    /// `sentinel failover-timeout`.
    pub failover_timeout_ms: u64,
    /// `sentinel parallel-syncs`.
    pub parallel_syncs: u32,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            sentinels: 1,
            down_after_ms: 1_000,
            failover_timeout_ms: 3_000,
            parallel_syncs: 1,
        }
    }
}

/// One primary, one replica and one or more sentinels monitoring them as
/// [`SENTINEL_SERVICE`]. The sentinels may fail over:
/// [`RedisSentinel::primary_port`] is the primary started,
/// [`RedisSentinel::current_primary`] the one the sentinels name now.
pub struct RedisSentinel {
    // Declared first: the sentinels die before the nodes they watch.
    sentinels: Vec<Node>,
    replica: Node,
    primary: Node,
    _dir: TempDir,
}

impl RedisSentinel {
    /// One sentinel, [`SentinelOptions::default`].
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_with(SentinelOptions::default())
    }

    /// Starts the nodes and the sentinels, and waits until every sentinel
    /// knows the primary, the replica and the other sentinels, and the
    /// replica is in sync: from then on a failover can succeed.
    pub fn start_with(options: SentinelOptions) -> RedisSentinel {
        assert!(options.sentinels > 0, "at least one sentinel");
        let dir = temp_dir();
        let path = dir.path().to_owned();
        let primary = Node::start(&path, |port| base_args(&path, port));
        let primary_port = primary.port;
        let replica = Node::start(&path, |port| {
            let mut args = base_args(&path, port);
            args.extend(["--replicaof", "127.0.0.1", &primary_port.to_string()].map(str::to_owned));
            args
        });
        let quorum = options.sentinels / 2 + 1;
        let sentinels = (0..options.sentinels)
            .map(|_| {
                Node::start(&path, |port| {
                    // A sentinel rewrites its configuration file: one per
                    // attempt.
                    let conf = path.join(format!("sentinel-{port}.conf"));
                    let text = format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile redis-{port}.log\n\
                         sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {primary_port} {quorum}\n\
                         sentinel down-after-milliseconds {SENTINEL_SERVICE} {down_after}\n\
                         sentinel failover-timeout {SENTINEL_SERVICE} {failover_timeout}\n\
                         sentinel parallel-syncs {SENTINEL_SERVICE} {parallel_syncs}\n",
                        dir = path.display(),
                        down_after = options.down_after_ms,
                        failover_timeout = options.failover_timeout_ms,
                        parallel_syncs = options.parallel_syncs,
                    );
                    fs::write(&conf, text).expect("write sentinel.conf");
                    vec![conf.display().to_string(), "--sentinel".to_owned()]
                })
            })
            .collect();
        let setup = RedisSentinel {
            sentinels,
            replica,
            primary,
            _dir: dir,
        };
        let others = (options.sentinels - 1).to_string();
        let replica_port = setup.replica.port.to_string();
        for sentinel in setup.sentinel_ports() {
            wait_until(
                "the sentinel to know the primary",
                Duration::from_secs(20),
                || master_port_by_sentinel(sentinel) == Some(primary_port),
            );
            // Found through the primary's INFO: without it, a failover has
            // no candidate.
            wait_until(
                "the sentinel to know the replica",
                Duration::from_secs(20),
                || {
                    try_cli(sentinel, &["SENTINEL", "replicas", SENTINEL_SERVICE])
                        .is_ok_and(|r| r.lines().any(|l| l.trim() == replica_port))
                },
            );
            // Found through the primary's hello channel, every 2 s.
            wait_until(
                "the sentinel to know the other sentinels",
                Duration::from_secs(20),
                || {
                    sentinel_master_field(sentinel, "num-other-sentinels").as_deref()
                        == Some(others.as_str())
                },
            );
        }
        wait_until("the replica to sync", Duration::from_secs(20), || {
            try_cli(setup.replica.port, &["INFO", "replication"])
                .is_ok_and(|r| r.contains("master_link_status:up"))
        });
        setup
    }

    /// `redis-sentinel://` URL naming every sentinel and the service.
    pub fn url(&self) -> String {
        let ports = self.sentinel_ports();
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SENTINEL_SERVICE}",
            ports[0]
        );
        for port in &ports[1..] {
            url.push_str(&format!("&node=127.0.0.1:{port}"));
        }
        url
    }

    /// The primary started (before any failover).
    pub fn primary_port(&self) -> u16 {
        self.primary.port
    }

    /// The replica started (the primary after a failover).
    pub fn replica_port(&self) -> u16 {
        self.replica.port
    }

    /// The first sentinel.
    pub fn sentinel_port(&self) -> u16 {
        self.sentinels[0].port
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|n| n.port).collect()
    }

    /// The primary every sentinel names now, when they agree.
    pub fn current_primary(&self) -> Option<u16> {
        let mut named = self
            .sentinel_ports()
            .into_iter()
            .map(master_port_by_sentinel);
        let first = named.next()??;
        named.all(|p| p == Some(first)).then_some(first)
    }

    /// Kills (SIGKILL) the data node the sentinels name as primary; returns
    /// its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self
            .current_primary()
            .expect("the sentinels agree on a primary");
        let node = [&mut self.primary, &mut self.replica]
            .into_iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("the sentinels name {port}, not a node of this setup"));
        assert!(node.is_running(), "primary {port} is already dead");
        node.kill();
        port
    }

    /// Waits until every sentinel names a primary other than `old` and that
    /// node answers `role:master`; returns its port.
    pub fn wait_for_new_primary(&self, old: u16, timeout: Duration) -> u16 {
        let mut promoted = None;
        wait_until(
            &format!("the sentinels to replace primary {old}"),
            timeout,
            || {
                promoted = self.current_primary().filter(|&p| {
                    p != old
                        && try_cli(p, &["INFO", "replication"])
                            .is_ok_and(|r| r.contains("role:master"))
                });
                promoted.is_some()
            },
        );
        promoted.expect("checked by wait_until")
    }
}

/// The primary's port, by `SENTINEL get-master-addr-by-name` on `sentinel`.
pub fn master_port_by_sentinel(sentinel: u16) -> Option<u16> {
    // A sentinel not answering yet names nothing.
    let reply = try_cli(
        sentinel,
        &["SENTINEL", "get-master-addr-by-name", SENTINEL_SERVICE],
    )
    .ok()?;
    // Two lines: the host, then the port.
    let mut lines = reply.lines();
    let (_host, port) = (lines.next()?, lines.next()?);
    port.trim().parse().ok()
}

/// One field of `SENTINEL master <service>` (a flat name/value list).
fn sentinel_master_field(sentinel: u16, field: &str) -> Option<String> {
    let reply = try_cli(sentinel, &["SENTINEL", "master", SENTINEL_SERVICE]).ok()?;
    let mut lines = reply.lines().map(str::trim);
    while let Some(name) = lines.next() {
        let value = lines.next()?;
        if name == field {
            return Some(value.to_owned());
        }
    }
    None
}
