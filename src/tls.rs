//! TLS on the gRPC listener: PEM files into a rustls `ServerConfig`, a
//! stream of finished TLS connections for tonic, and a watcher that swaps in
//! new certificates when the files change. The client side (`check`,
//! `bench`) reads its files through the same PEM helpers.
//!
//! Handshakes run in their own tasks, bounded in time, so a client that
//! connects and says nothing never holds up the accept loop. A reload changes
//! the configuration of new connections only; open ones keep theirs.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// TLS on the gRPC listener, as the settings give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by one of these.
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are checked for changes; `None` = never.
    pub reload: Option<Duration>,
}

/// How long a client has to finish its handshake after connecting.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once; connections beyond are closed at once
/// rather than left to pile up (each one holds a socket and a task).
const MAX_PENDING_HANDSHAKES: usize = 4096;

/// A TLS file that cannot be used: which setting (or flag) named it, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}={} is not valid: {reason}", file.display())]
pub struct TlsError {
    /// `grpc_tls.cert_file`, `--tls-ca`...
    pub setting: &'static str,
    pub file: PathBuf,
    pub reason: String,
}

fn read(setting: &'static str, file: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(file).map_err(|e| TlsError {
        setting,
        file: file.to_path_buf(),
        reason: format!("cannot be read: {e}"),
    })
}

/// Every certificate of a PEM file, in order; at least one.
pub fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM file: {e}"))?;
    if certs.is_empty() {
        return Err("no CERTIFICATE block in the file".into());
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1). The error
/// never quotes the file's content.
pub fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        tokio_rustls::rustls::pki_types::pem::Error::NoItemsFound => {
            "no PRIVATE KEY block in the file".to_string()
        }
        _ => "not a PEM private key".to_string(),
    })
}

/// Reads and parses a certificate file for `setting`.
pub fn load_certs(
    setting: &'static str,
    file: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(&read(setting, file)?).map_err(|reason| TlsError {
        setting,
        file: file.to_path_buf(),
        reason,
    })
}

/// Reads and parses a private key file for `setting`.
pub fn load_key(setting: &'static str, file: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    parse_key(&read(setting, file)?).map_err(|reason| TlsError {
        setting,
        file: file.to_path_buf(),
        reason,
    })
}

/// The content of the files, read once, so that what is checked for changes
/// is exactly what gets loaded.
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

// The key's bytes are a secret: never printed.
impl fmt::Debug for Files {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Files").finish_non_exhaustive()
    }
}

impl Files {
    fn read(tls: &GrpcTls) -> Result<Files, TlsError> {
        Ok(Files {
            cert: read("grpc_tls.cert_file", &tls.cert_file)?,
            key: read("grpc_tls.key_file", &tls.key_file)?,
            client_ca: match &tls.client_ca_file {
                Some(f) => Some(read("grpc_tls.client_ca_file", f)?),
                None => None,
            },
        })
    }

    /// A digest of all the files, to notice a change without keeping the
    /// key's bytes around.
    fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()] {
            match part {
                Some(bytes) => {
                    h.update((bytes.len() as u64).to_le_bytes());
                    h.update(bytes);
                }
                None => h.update(u64::MAX.to_le_bytes()),
            }
        }
        h.finalize().into()
    }

    fn server_config(&self, tls: &GrpcTls) -> Result<Arc<ServerConfig>, TlsError> {
        let err = |setting, file: &Path, reason: String| TlsError {
            setting,
            file: file.to_path_buf(),
            reason,
        };
        let certs =
            parse_certs(&self.cert).map_err(|r| err("grpc_tls.cert_file", &tls.cert_file, r))?;
        let key = parse_key(&self.key).map_err(|r| err("grpc_tls.key_file", &tls.key_file, r))?;
        let provider = Arc::new(ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| err("grpc_tls.cert_file", &tls.cert_file, e.to_string()))?;
        let builder = match (&tls.client_ca_file, &self.client_ca) {
            (Some(file), Some(pem)) => {
                let verifier = client_verifier(pem, provider)
                    .map_err(|r| err("grpc_tls.client_ca_file", file, r))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            // rustls checks that the key belongs to the first certificate.
            err(
                "grpc_tls.key_file",
                &tls.key_file,
                format!("does not go with grpc_tls.cert_file: {e}"),
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

fn client_verifier(
    pem: &[u8],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn tokio_rustls::rustls::server::danger::ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(pem)? {
        roots
            .add(cert)
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| e.to_string())
}

/// Loads the files into a server configuration (ALPN `h2`; client
/// certificates required and verified when `client_ca_file` is set).
pub fn server_config(tls: &GrpcTls) -> Result<Arc<ServerConfig>, TlsError> {
    Files::read(tls)?.server_config(tls)
}

/// Finished TLS connections from `listener`, with the configuration that
/// `config` holds when each connection arrives. The accept loop ends when the
/// stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: watch::Receiver<Arc<ServerConfig>>,
    handshake_timeout: Duration,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
        loop {
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => break,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: pause rather than spin.
                        tracing::warn!(error = %e, "gRPC accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = pending.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "too many TLS handshakes in progress; connection closed");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tokio_rustls::TlsAcceptor::from(config.borrow().clone());
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Loads `tls`, starts its reload watcher (until `stop`) and returns the
/// listener's stream of TLS connections: what the server runs on.
pub fn listen(
    listener: TcpListener,
    tls: &GrpcTls,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Stream<Item = Result<TlsStream<TcpStream>, io::Error>> + Send + 'static, TlsError>
{
    let files = Files::read(tls)?;
    let config = files.server_config(tls)?;
    let (tx, rx) = watch::channel(config);
    if let Some(every) = tls.reload {
        tokio::spawn(watch_files(tls.clone(), files.digest(), every, tx, stop));
    }
    Ok(incoming(listener, rx, HANDSHAKE_TIMEOUT))
}

/// Every `every`, reads the files; when their content changed and loads, new
/// connections get it. A change that does not load is warned about once and
/// the last good configuration stays.
async fn watch_files(
    tls: GrpcTls,
    mut seen: [u8; 32],
    every: Duration,
    tx: watch::Sender<Arc<ServerConfig>>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    // The last read error, so that a file that stays unreadable (gone, or
    // mid-replacement) is warned about once, not every interval.
    let mut unreadable: Option<String> = None;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(every) => {}
        }
        let files = match Files::read(&tls) {
            Ok(f) => f,
            Err(e) => {
                let e = e.to_string();
                if unreadable.as_ref() != Some(&e) {
                    tracing::warn!("TLS files not reloaded, the last good ones stay: {e}");
                    unreadable = Some(e);
                }
                continue;
            }
        };
        unreadable = None;
        let digest = files.digest();
        if digest == seen {
            continue;
        }
        seen = digest;
        match files.server_config(&tls) {
            Ok(config) => {
                tx.send_replace(config);
                tracing::info!(
                    cert_file = %tls.cert_file.display(),
                    "TLS files reloaded; new connections use them"
                );
            }
            Err(e) => tracing::warn!("TLS files not reloaded, the last good ones stay: {e}"),
        }
    }
}
