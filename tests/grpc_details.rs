//! The gRPC details third-party clients expect, checked through clients
//! other than tonic's: reflection in both versions listing every service
//! (health included) through grpcio with hand-encoded messages, gRPC on a
//! Unix socket, and the maximum connection age as an HTTP/2 GOAWAY read off
//! a raw socket.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::helm::{require_python_module, run_within};
use support::tollgate::Tollgate;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// Runs the raw grpcio client against `target`; its stdout.
async fn python(target: String, args: &[&str]) -> String {
    require_python_module("grpc", "grpcio");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python/raw_grpc.py");
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        run_within(
            Command::new("python3").arg(script).arg(target).args(args),
            Duration::from_secs(60),
        )
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_and_v1alpha_list_every_service_health_included() {
    let t = Tollgate::start(&[("d.yaml", RULES)], &[]).await;
    let out = python(t.grpc.to_string(), &["reflection"]).await;
    let services = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService,\
                    envoy.service.ratelimit.v3.RateLimitService,grpc.health.v1.Health,\
                    grpc.reflection.v1.ServerReflection,grpc.reflection.v1alpha.ServerReflection";
    assert_eq!(
        out,
        format!("v1 {services} health-file\nv1alpha {services} health-file\n")
    );
    t.stop().await;
}

/// With `grpc_uds`, the same services answer on the Unix socket (beside
/// the TCP listener), and a stale socket file from an earlier run is
/// replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_served_on_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("tollgate.sock");
    // A socket file left by a process that is gone.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let t = Tollgate::start(
        &[("d.yaml", RULES)],
        &[("grpc_uds", sock.to_str().unwrap())],
    )
    .await;
    let target = format!("unix:{}", sock.display());
    t.wait_serving(Duration::from_secs(10)).await;
    assert_eq!(python(target.clone(), &["health"]).await, "health 1\n");
    // One call on the socket, one on TCP: the same limiter (limit 1).
    assert_eq!(
        python(target.clone(), &["decide", "d", "k", "v"]).await,
        "overall 1\n"
    );
    assert_eq!(
        python(t.grpc.to_string(), &["decide", "d", "k", "v"]).await,
        "overall 2\n"
    );
    let out = python(target, &["reflection"]).await;
    assert!(
        out.starts_with(
            "v1 envoy.service.rate_limit_quota.v3.RateLimitQuotaService,\
             envoy.service.ratelimit.v3.RateLimitService,grpc.health.v1.Health"
        ),
        "{out}"
    );
    // A socket something still listens on is not taken over.
    let e = tollgate::server::bind_uds(&sock).unwrap_err();
    assert!(
        e.to_string().contains("another process is listening"),
        "{e}"
    );
    t.stop().await;
    // Not a socket: never removed, and the server does not start.
    let file = dir.path().join("plain");
    std::fs::write(&file, "keep me").unwrap();
    assert!(tollgate::server::bind_uds(&file).is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// `grpc_addr=off` with `grpc_uds` (the reference's `GRPC_UDS`): gRPC only
/// on the socket, through `server::serve` as `tollgate serve` runs it; and
/// `off` without a socket is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_only_on_the_unix_socket() {
    use tollgate::settings::{Settings, Sources};
    support::away_from_an_hour_boundary().await;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    std::fs::write(rules.join("d.yaml"), RULES).unwrap();
    let sock = dir.path().join("only.sock");
    let load = |pairs: &[(&str, String)]| {
        Settings::load(&Sources {
            overrides: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Sources::default()
        })
    };
    let e = load(&[("grpc_addr", "off".into())]).unwrap_err();
    assert!(e.to_string().contains("grpc_uds"), "{e}");
    let settings = load(&[
        ("grpc_addr", "off".into()),
        ("grpc_uds", sock.display().to_string()),
        ("http_addr", "127.0.0.1:0".into()),
        ("debug_addr", "off".into()),
        ("rules_dir", rules.display().to_string()),
        ("shutdown_drain_ms", "0".into()),
    ])
    .unwrap();
    assert_eq!(settings.grpc_addr, None);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        tollgate::server::serve(&settings, async {
            let _ = stopped.await;
        })
        .await
    });
    let target = format!("unix:{}", sock.display());
    for _ in 0..100 {
        if sock.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        python(target.clone(), &["decide", "d", "k", "v"]).await,
        "overall 1\n"
    );
    assert_eq!(
        python(target, &["decide", "d", "k", "v"]).await,
        "overall 2\n"
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Opens an HTTP/2 connection by hand and returns how long until the
/// server's GOAWAY (frame type 7), or `None` when none came within `wait`.
fn goaway_after(addr: std::net::SocketAddr, wait: Duration) -> Option<Duration> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    // The client preface, then an empty SETTINGS frame.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while started.elapsed() < wait {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => break,
        }
        // Walk the complete frames read so far.
        let mut i = 0;
        while buf.len() >= i + 9 {
            let len = (usize::from(buf[i]) << 16)
                | (usize::from(buf[i + 1]) << 8)
                | usize::from(buf[i + 2]);
            if buf[i + 3] == 7 {
                return Some(started.elapsed());
            }
            if buf.len() < i + 9 + len {
                break;
            }
            i += 9 + len;
        }
    }
    None
}

/// `grpc_max_connection_age_ms`: an idle connection is sent GOAWAY once
/// it is that old; without the setting, none comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_connections_are_sent_goaway() {
    let aged = Tollgate::start(
        &[("d.yaml", RULES)],
        &[
            ("grpc_max_connection_age_ms", "500"),
            ("grpc_max_connection_age_grace_ms", "500"),
        ],
    )
    .await;
    aged.wait_serving(Duration::from_secs(10)).await;
    let addr = aged.grpc;
    let took = tokio::task::spawn_blocking(move || goaway_after(addr, Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("a GOAWAY");
    assert!(took >= Duration::from_millis(400), "{took:?}");
    aged.stop().await;

    let plain = Tollgate::start(&[("d.yaml", RULES)], &[]).await;
    plain.wait_serving(Duration::from_secs(10)).await;
    let addr = plain.grpc;
    let none = tokio::task::spawn_blocking(move || goaway_after(addr, Duration::from_millis(1500)))
        .await
        .unwrap();
    assert_eq!(none, None);
    plain.stop().await;
}

/// Connections opened together are sent GOAWAY spread over ±10% of
/// `grpc_max_connection_age_ms`, as gRPC's own servers do, not at one
/// moment: ten connections opened at once with an age of 2 s each get
/// theirs between 1.8 s and 2.2 s after they opened (with slack for a busy
/// machine above, none below), and not all within 40 ms of each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_ages_are_jittered_within_a_tenth() {
    let t = Tollgate::start(
        &[("d.yaml", RULES)],
        &[
            ("grpc_max_connection_age_ms", "2000"),
            ("grpc_max_connection_age_grace_ms", "2000"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(10)).await;
    let addr = t.grpc;
    let opened: Vec<_> = (0..10)
        .map(|_| tokio::task::spawn_blocking(move || goaway_after(addr, Duration::from_secs(5))))
        .collect();
    let mut ages = Vec::new();
    for one in opened {
        ages.push(one.await.unwrap().expect("a GOAWAY"));
    }
    ages.sort();
    for age in &ages {
        assert!(
            (Duration::from_millis(1_800)..=Duration::from_millis(2_700)).contains(age),
            "{ages:?}"
        );
    }
    let spread = ages[ages.len() - 1] - ages[0];
    assert!(spread >= Duration::from_millis(40), "{ages:?}");
    eprintln!("GOAWAY after {ages:?}");
    t.stop().await;
}
