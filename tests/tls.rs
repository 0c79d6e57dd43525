//! TLS and mutual TLS on the gRPC listener, certificate reload, and the
//! client flags of `check` and `bench`, over real loopback connections with
//! certificates made for each test.

mod support;

use support::free_port;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use support::tollgate::{Tollgate, descriptor};
use tokio::io::AsyncReadExt;
use tollgate::settings::{Settings, Sources};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const RULES: &str = "
domain: tls
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 1000
";

/// A certificate authority made for one test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A certificate and its key, PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap().pem();
        Leaf {
            cert,
            key: key.serialize_pem(),
        }
    }

    fn server(&self) -> Leaf {
        self.leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn client(&self) -> Leaf {
        self.leaf(&["client.test"], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn trust(&self) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.pem))
    }
}

/// Writes `text` to `path` in one step (a rename), as a deployment tool
/// replacing a file would.
fn put(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The server's files in a temporary directory.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(server: &Leaf) -> Files {
        let files = Files {
            dir: tempfile::tempdir().unwrap(),
        };
        files.set(server);
        files
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn set(&self, server: &Leaf) {
        put(&self.path("server.pem"), &server.cert);
        put(&self.path("server.key"), &server.key);
    }
    fn cert(&self) -> String {
        self.path("server.pem").display().to_string()
    }
    fn key(&self) -> String {
        self.path("server.key").display().to_string()
    }
    /// Writes `pem` as `name` and returns its path.
    fn write(&self, name: &str, pem: &str) -> String {
        put(&self.path(name), pem);
        self.path(name).display().to_string()
    }
}

fn req() -> RateLimitRequest {
    RateLimitRequest {
        domain: "tls".into(),
        descriptors: vec![descriptor(&[("k", "v")])],
        hits_addend: 1,
    }
}

/// One call on a new connection; the error as text when the connection or
/// the call fails (with TLS 1.3 a refused client certificate shows only at
/// the first call).
async fn try_ask(tg: &Tollgate, tls: ClientTlsConfig) -> Result<RateLimitResponse, String> {
    let mut client = tg.client_tls(tls).await.map_err(|e| format!("{e:?}"))?;
    ask_on(&mut client).await
}

async fn ask_on(client: &mut RateLimitServiceClient<Channel>) -> Result<RateLimitResponse, String> {
    client
        .should_rate_limit(req())
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{s:?}"))
}

fn assert_answered(r: Result<RateLimitResponse, String>, what: &str) {
    let resp = r.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(resp.overall_code, Code::Ok as i32, "{what}: {resp:?}");
    let limit = resp.statuses[0].current_limit.as_ref();
    assert_eq!(limit.map(|l| l.requests_per_unit), Some(1000), "{what}");
}

/// Polls `f` until it succeeds or `within` passes.
async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// tollgate's log lines in this test binary, to see what the reload watcher did.
fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    static INIT: Once = Once::new();
    let logs = LOGS.get_or_init(Default::default).clone();
    INIT.call_once(|| {
        struct W(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for W {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = LOGS.get().unwrap().clone();
        tracing_subscriber::fmt()
            .with_env_filter("tollgate=info")
            .with_ansi(false)
            .with_writer(move || W(sink.clone()))
            .init();
    });
    logs
}

/// Log lines containing every one of `parts`.
fn log_lines(parts: &[&str]) -> usize {
    let logs = logs();
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

#[tokio::test]
async fn tls_answers_clients_trusting_its_ca_only() {
    let ca = Ca::new("ca one");
    let files = Files::new(&ca.server());
    let tg = Tollgate::start(
        &[("tls.yaml", RULES)],
        &[
            ("grpc_tls.cert_file", &files.cert()),
            ("grpc_tls.key_file", &files.key()),
        ],
    )
    .await;
    assert_answered(try_ask(&tg, ca.trust()).await, "client trusting the CA");
    // The name in the certificate is checked too: localhost is in it.
    assert_answered(
        try_ask(&tg, ca.trust().domain_name("localhost")).await,
        "client verifying the name localhost",
    );
    let err = try_ask(&tg, ca.trust().domain_name("elsewhere.test"))
        .await
        .expect_err("a name not in the certificate is refused");
    assert!(err.contains("NotValidForName"), "{err}");

    let plain = async {
        let mut c = RateLimitServiceClient::connect(format!("http://{}", tg.grpc))
            .await
            .map_err(|e| format!("{e:?}"))?;
        ask_on(&mut c).await
    };
    let plain = tokio::time::timeout(Duration::from_secs(10), plain)
        .await
        .expect("a plaintext client gives up in time");
    assert!(plain.is_err(), "a plaintext client was answered: {plain:?}");

    let other = Ca::new("ca other");
    let err = try_ask(&tg, other.trust())
        .await
        .expect_err("a client trusting another CA must not connect");
    assert!(err.contains("UnknownIssuer"), "{err}");
    tg.stop().await;
}

#[tokio::test]
async fn mtls_answers_only_clients_with_a_certificate_from_the_client_ca() {
    let ca = Ca::new("server ca");
    let client_ca = Ca::new("client ca");
    let rogue_ca = Ca::new("rogue ca");
    let files = Files::new(&ca.server());
    let client_ca_file = files.write("clients.pem", &client_ca.pem);
    let tg = Tollgate::start(
        &[("tls.yaml", RULES)],
        &[
            ("grpc_tls.cert_file", &files.cert()),
            ("grpc_tls.key_file", &files.key()),
            ("grpc_tls.client_ca_file", &client_ca_file),
        ],
    )
    .await;
    let with = |leaf: &Leaf| {
        ca.trust()
            .identity(Identity::from_pem(&leaf.cert, &leaf.key))
    };

    let err = try_ask(&tg, ca.trust())
        .await
        .expect_err("a client without a certificate is refused");
    assert!(err.contains("alert: CertificateRequired"), "{err}");
    let err = try_ask(&tg, with(&rogue_ca.client()))
        .await
        .expect_err("a certificate from another CA is refused");
    assert!(err.contains("alert: UnknownCA"), "{err}");
    // A certificate of the right CA made for a server does not pass for a
    // client's: its extended key usage says so.
    let err = try_ask(
        &tg,
        with(&client_ca.leaf(&["client.test"], ExtendedKeyUsagePurpose::ServerAuth)),
    )
    .await
    .expect_err("a server certificate is refused as a client's");
    assert!(err.contains("alert: UnsupportedCertificate"), "{err}");
    assert_answered(try_ask(&tg, with(&client_ca.client())).await, "mTLS client");
    tg.stop().await;
}

#[tokio::test]
async fn reload_swaps_certificates_and_keeps_the_last_good_ones() {
    let first = Ca::new("first");
    let second = Ca::new("second");
    let third = Ca::new("third");
    let files = Files::new(&first.server());
    logs();
    let tg = Tollgate::start(
        &[("tls.yaml", RULES)],
        &[
            ("grpc_tls.cert_file", &files.cert()),
            ("grpc_tls.key_file", &files.key()),
            ("grpc_tls.reload_ms", "100"),
        ],
    )
    .await;
    let mut open = tg.client_tls(first.trust()).await.unwrap();
    assert_answered(ask_on(&mut open).await, "before the reload");

    files.set(&second.server());
    eventually(
        Duration::from_secs(20),
        "the second CA's certificate",
        || async { try_ask(&tg, second.trust()).await.is_ok() },
    )
    .await;
    assert_eq!(
        log_lines(&["TLS files reloaded", &files.cert()]),
        1,
        "one reload logged"
    );
    // New connections get the new certificate; the open one keeps its own.
    assert!(try_ask(&tg, first.trust()).await.is_err());
    assert_answered(ask_on(&mut open).await, "the connection opened before");

    // A key that does not load: warned about once, the last good files stay.
    put(&files.path("server.key"), "not a key\n");
    let bad = [
        "TLS files not reloaded",
        &files.key(),
        "no PRIVATE KEY block",
    ];
    eventually(
        Duration::from_secs(20),
        "the bad key warned about",
        || async { log_lines(&bad) > 0 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(log_lines(&bad), 1, "one warning per change");
    assert_answered(
        try_ask(&tg, second.trust()).await,
        "the last good certificate, after a bad key",
    );

    // A key that is gone: the same, once.
    std::fs::remove_file(files.path("server.key")).unwrap();
    let gone = ["TLS files not reloaded", &files.key(), "cannot be read"];
    eventually(
        Duration::from_secs(20),
        "the missing key warned about",
        || async { log_lines(&gone) > 0 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(log_lines(&gone), 1, "one warning while it stays missing");
    assert_answered(
        try_ask(&tg, second.trust()).await,
        "the last good certificate, without a key file",
    );

    // The watcher goes on: good files after bad ones are taken.
    files.set(&third.server());
    eventually(
        Duration::from_secs(20),
        "the third CA's certificate",
        || async { try_ask(&tg, third.trust()).await.is_ok() },
    )
    .await;
    assert!(try_ask(&tg, second.trust()).await.is_err());
    tg.stop().await;
}

#[tokio::test]
async fn silent_clients_do_not_block_others() {
    let ca = Ca::new("ca");
    let files = Files::new(&ca.server());
    let tg = Tollgate::start(
        &[("tls.yaml", RULES)],
        &[
            ("grpc_tls.cert_file", &files.cert()),
            ("grpc_tls.key_file", &files.key()),
        ],
    )
    .await;
    // Connected, never a ClientHello.
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(tokio::net::TcpStream::connect(tg.grpc).await.unwrap());
    }
    // Bounded well below the handshake timeout: an accept loop that waited
    // on the silent ones would answer only after them.
    let within = tollgate::tls::HANDSHAKE_TIMEOUT / 2;
    let answer = tokio::time::timeout(within, try_ask(&tg, ca.trust()))
        .await
        .unwrap_or_else(|_| panic!("not answered within {within:?} beside silent clients"));
    assert_answered(answer, "beside silent clients");
    drop(silent);
    tg.stop().await;
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    use futures_util::StreamExt;
    let ca = Ca::new("ca");
    let files = Files::new(&ca.server());
    let tls = tollgate::settings::GrpcTls {
        cert_file: files.cert().into(),
        key_file: files.key().into(),
        client_ca_file: None,
        reload: None,
    };
    let config = tollgate::tls::server_config(&tls).unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = Box::pin(tollgate::tls::incoming(
        listener,
        rx,
        Duration::from_millis(300),
    ));
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
        .await
        .expect("the server closes a silent connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without a word");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    // Nothing came out of the stream for it.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), incoming.next())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn bench_speaks_tls() {
    let ca = Ca::new("ca");
    let client_ca = Ca::new("client ca");
    let files = Files::new(&ca.server());
    let client_ca_file = files.write("clients.pem", &client_ca.pem);
    let client = client_ca.client();
    let tg = Tollgate::start(
        &[("tls.yaml", RULES)],
        &[
            ("grpc_tls.cert_file", &files.cert()),
            ("grpc_tls.key_file", &files.key()),
            ("grpc_tls.client_ca_file", &client_ca_file),
        ],
    )
    .await;
    let ca_file = files.write("ca.pem", &ca.pem);
    let cert_file = files.write("client.pem", &client.cert);
    let key_file = files.write("client.key", &client.key);
    let addr = tg.grpc.to_string();
    // `tollgate bench` as a process: its exit code, its JSON report (stdout)
    // and its error (stderr).
    let bench = async |extra: &[&str]| {
        let child = tokio::process::Command::new(tollgate_bin())
            .args([
                "bench",
                "--addr",
                &addr,
                "--domain",
                "tls",
                "--descriptor",
                "k=b",
                "--requests",
                "50",
                "--warmup",
                "0",
                "--connections",
                "2",
                "--json",
            ])
            .args(extra)
            .env_clear()
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("the bench ends")
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let report = serde_json::from_str::<serde_json::Value>(&stdout).ok();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), report, stderr)
    };
    let count = |report: &serde_json::Value, field: &str| {
        report[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} in {report}"))
    };
    let (code, report, stderr) = bench(&[
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &cert_file,
        "--tls-key",
        &key_file,
    ])
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let report = report.expect("a JSON report");
    assert_eq!(count(&report, "ok"), 50, "{report}");
    // Nothing names the key (the configuration's `Debug` is tested in the
    // binary's `bench` module).
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");

    // Without a client certificate every call fails.
    let (code, report, stderr) = bench(&["--tls-ca", &ca_file]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let report = report.expect("a JSON report");
    assert_eq!(count(&report, "ok"), 0, "{report}");
    assert!(count(&report, "errors") > 0, "{report}");

    // Bad files are named by their flag, and the bench does not start.
    let (code, report, stderr) = bench(&["--tls-ca", &key_file]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(report.is_none(), "{report:?}");
    assert!(
        stderr.starts_with(&format!(
            "tollgate bench: --tls-ca {key_file}: no CERTIFICATE"
        )),
        "{stderr}"
    );
    let (code, report, stderr) = bench(&[
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &cert_file,
        "--tls-key",
        &cert_file,
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(report.is_none(), "{report:?}");
    assert!(
        stderr.starts_with(&format!(
            "tollgate bench: --tls-key {cert_file}: no PRIVATE KEY"
        )),
        "{stderr}"
    );
    tg.stop().await;
}

#[test]
fn bad_tls_files_are_settings_errors_naming_the_setting() {
    let ca = Ca::new("ca");
    let files = Files::new(&ca.server());
    let other = ca.server();
    let garbage = files.write("garbage.pem", "hello\n");
    let wrong_key = files.write("wrong.key", &other.key);
    let load = |pairs: &[(&str, &str)]| {
        Settings::load(&Sources {
            env: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Sources::default()
        })
    };
    let cert = files.cert();
    let key = files.key();
    let s = load(&[
        ("TOLLGATE_GRPC_TLS__CERT_FILE", &cert),
        ("TOLLGATE_GRPC_TLS__KEY_FILE", &key),
    ])
    .unwrap();
    // Settings print file names, never a key.
    let debug = format!("{s:?}");
    assert!(
        debug.contains("server.key") && !debug.contains("PRIVATE"),
        "{debug}"
    );

    let cases = [
        (
            [
                ("TOLLGATE_GRPC_TLS__CERT_FILE", garbage.as_str()),
                ("TOLLGATE_GRPC_TLS__KEY_FILE", key.as_str()),
            ],
            format!("grpc_tls.cert_file={garbage} is not valid: no CERTIFICATE block"),
            "TOLLGATE_GRPC_TLS__CERT_FILE",
        ),
        (
            [
                ("TOLLGATE_GRPC_TLS__CERT_FILE", cert.as_str()),
                ("TOLLGATE_GRPC_TLS__KEY_FILE", garbage.as_str()),
            ],
            format!("grpc_tls.key_file={garbage} is not valid: no PRIVATE KEY block"),
            "TOLLGATE_GRPC_TLS__KEY_FILE",
        ),
        (
            [
                ("TOLLGATE_GRPC_TLS__CERT_FILE", cert.as_str()),
                ("TOLLGATE_GRPC_TLS__KEY_FILE", wrong_key.as_str()),
            ],
            format!("grpc_tls.key_file={wrong_key} is not valid: does not go with"),
            "TOLLGATE_GRPC_TLS__KEY_FILE",
        ),
    ];
    for (env, want, var) in cases {
        let err = load(&env).unwrap_err().to_string();
        assert!(err.starts_with(&want), "want {want}, got {err}");
        assert!(err.ends_with(&format!("(set by {var})")), "{err}");
        assert!(!err.contains("BEGIN"), "file content leaked: {err}");
    }
    let err = load(&[
        ("TOLLGATE_GRPC_TLS__CERT_FILE", &cert),
        ("TOLLGATE_GRPC_TLS__KEY_FILE", &key),
        ("TOLLGATE_GRPC_TLS__CLIENT_CA_FILE", &garbage),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(&format!(
            "grpc_tls.client_ca_file={garbage} is not valid: no CERTIFICATE block"
        )),
        "{err}"
    );
}

fn tollgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

#[test]
fn serve_binary_over_mtls_and_check_with_client_flags() {
    let ca = Ca::new("ca");
    let client_ca = Ca::new("client ca");
    let files = Files::new(&ca.server());
    let ca_file = files.write("ca.pem", &ca.pem);
    let client_ca_file = files.write("clients.pem", &client_ca.pem);
    let client = client_ca.client();
    let cert_file = files.write("client.pem", &client.cert);
    let key_file = files.write("client.key", &client.key);
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("tls.yaml"), RULES).unwrap();
    let grpc = free_port();
    let child = Command::new(tollgate_bin())
        .args(["serve", "--rules", &rules.path().display().to_string()])
        .env("TOLLGATE_GRPC_ADDR", format!("127.0.0.1:{grpc}"))
        .env("TOLLGATE_HTTP_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("TOLLGATE_GRPC_TLS__CERT_FILE", files.cert())
        .env("TOLLGATE_GRPC_TLS__KEY_FILE", files.key())
        .env("TOLLGATE_GRPC_TLS__CLIENT_CA_FILE", &client_ca_file)
        .env("TOLLGATE_SHUTDOWN_DRAIN_MS", "0")
        // Tests run side by side: no fixed debug port.
        .env("TOLLGATE_DEBUG_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut guard = Kill(child);
    let addr = format!("127.0.0.1:{grpc}");
    let check = |extra: &[&str]| {
        Command::new(tollgate_bin())
            .args([
                "check",
                "--addr",
                &addr,
                "--domain",
                "tls",
                "--descriptor",
                "k=cli",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let mtls = [
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &cert_file,
        "--tls-key",
        &key_file,
    ];
    let mut out = None;
    for _ in 0..200 {
        let o = check(&mtls);
        if o.status.success() {
            out = Some(o);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = out.expect("tollgate serve answered check over mTLS");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("overall: OK"), "{text}");
    assert!(text.contains("limit=1000/minute"), "{text}");

    // An https:// address and --tls-server-name say the same.
    let https = format!("https://{addr}");
    let o = Command::new(tollgate_bin())
        .args([
            "check",
            "--addr",
            &https,
            "--domain",
            "tls",
            "--descriptor",
            "k=cli",
        ])
        .args(mtls)
        .args(["--tls-server-name", "localhost"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Without a client certificate, or in plaintext: refused.
    let o = check(&["--tls-ca", &ca_file]);
    assert!(!o.status.success());
    let o = check(&[]);
    assert!(!o.status.success());
    // A bad file is named by its flag, before any connection.
    let o = check(&["--tls-ca", &key_file]);
    assert_eq!(o.status.code(), Some(64));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("--tls-ca {key_file}: no CERTIFICATE")),
        "{err}"
    );
    assert!(!err.contains("PRIVATE KEY-----"), "{err}");

    let child = &mut guard.0;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "tollgate did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn serve_binary_refuses_a_bad_certificate_with_exit_64() {
    let ca = Ca::new("ca");
    let files = Files::new(&ca.server());
    let garbage = files.write("garbage.pem", "-----BEGIN CERTIFICATE-----\nnot base64!\n");
    let out = Command::new(tollgate_bin())
        .arg("serve")
        .env("TOLLGATE_GRPC_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("TOLLGATE_HTTP_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("TOLLGATE_GRPC_TLS__CERT_FILE", &garbage)
        .env("TOLLGATE_GRPC_TLS__KEY_FILE", files.key())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "grpc_tls.cert_file={garbage} is not valid: not a PEM file"
        )),
        "{err}"
    );
    assert!(
        err.contains("(set by TOLLGATE_GRPC_TLS__CERT_FILE)"),
        "{err}"
    );
}
