use super::*;

#[test]
fn debug_hides_passwords() {
    let config = RedisConfig {
        url: "redis://user:hunter2@host:6379".into(),
        password: Some("sw0rdfish".into()),
        ..RedisConfig::default()
    };
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("sw0rdfish"),
        "{shown}"
    );
    assert!(shown.contains("redis://***@host:6379"), "{shown}");
}

#[test]
fn redact_hides_password() {
    assert_eq!(
        redact("redis://user:secret@host:6379/0"),
        "redis://***@host:6379/0"
    );
    assert_eq!(redact("redis://host:6379"), "redis://host:6379");
}

#[tokio::test]
async fn connect_succeeds_while_redis_is_down() {
    // Port 1 on loopback: nothing listens there.
    for url in [
        "redis://127.0.0.1:1",
        "rediss://127.0.0.1:1",
        "redis-cluster://127.0.0.1:1",
    ] {
        let store = RedisStore::connect(RedisConfig {
            url: url.into(),
            ..RedisConfig::default()
        })
        .await
        .unwrap();
        assert!(!store.is_ready(), "{url}");
        let entries = vec![("k".to_owned(), "v".to_owned())];
        let started = std::time::Instant::now();
        let result = store
            .hit(Hit {
                domain: "d",
                entries: &entries,
                algorithm: Algorithm::FixedWindow,
                limit: 1,
                window: crate::limit::Unit::Second.into(),
                hits: 1,
                negative: false,
                usage_reports: false,
                buckets: 2,
                burst: 0,
                shard: crate::storage::Shard::NONE,
                receipt: false,
                also: &[],
                lease: false,
                ahead: crate::storage::Ahead::NONE,
            })
            .await;
        assert!(result.is_err(), "{url}");
        assert!(started.elapsed() < Duration::from_millis(100), "{url}");
    }
}

#[tokio::test]
async fn bad_settings_fail() {
    let bad_url = RedisStore::connect(RedisConfig {
        url: "not a url".into(),
        ..RedisConfig::default()
    })
    .await;
    assert!(bad_url.is_err());
    let half_tls = RedisStore::connect(RedisConfig {
        tls_cert_file: Some("/nonexistent.pem".into()),
        ..RedisConfig::default()
    })
    .await;
    assert!(half_tls.is_err());
}

#[tokio::test]
async fn kind_follows_the_url() {
    for (url, kind) in [
        ("redis://127.0.0.1:1", "redis"),
        ("redis-cluster://127.0.0.1:1", "redis-cluster"),
        (
            "redis-sentinel://127.0.0.1:1?sentinelServiceName=m",
            "redis-sentinel",
        ),
    ] {
        let store = RedisStore::connect(RedisConfig {
            url: url.into(),
            ..RedisConfig::default()
        })
        .await
        .unwrap();
        assert_eq!(store.kind(), kind);
    }
}

#[test]
fn an_error_is_transient_unless_retrying_cannot_help() {
    use fred::error::{Error, ErrorKind};
    let timeout = Duration::from_millis(200);
    let kind = |kind, details: &str| store_error(Error::new(kind, details.to_owned()), timeout);
    // What the client says when it had no connection to write to (the
    // server stopped a moment before): the breaker must count it.
    assert!(matches!(
        kind(ErrorKind::Unknown, "Failed to route command."),
        StoreError::Unavailable(_)
    ));
    assert!(matches!(
        kind(ErrorKind::Routing, "Failed to route command."),
        StoreError::Unavailable(_)
    ));
    assert!(matches!(
        kind(
            ErrorKind::Unknown,
            "LOADING Redis is loading the dataset in memory"
        ),
        StoreError::Unavailable(_)
    ));
    assert!(matches!(
        kind(ErrorKind::Timeout, "timed out"),
        StoreError::Timeout(200)
    ));
    // A script's own error, or a key of the wrong type: not retried.
    assert!(matches!(
        kind(
            ErrorKind::Unknown,
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        ),
        StoreError::Protocol(_)
    ));
    assert!(!kind(ErrorKind::Unknown, "ERR user_script:1: bad").is_transient());
}
