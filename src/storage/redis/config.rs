use super::*;

/// How to reach Redis. Its `Debug` output hides the password (the field
/// and the URL's).
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://`, `rediss://` (TLS), `redis-cluster://h:p?node=h2:p2`,
    /// `redis-sentinel://h:p?sentinelServiceName=name&node=...`, as fred
    /// parses them.
    pub url: String,
    /// Overrides the URL's user name.
    pub username: Option<String>,
    /// Overrides the URL's password.
    pub password: Option<String>,
    /// PEM bundle of trusted CAs (default: the system's). Giving any TLS file
    /// turns TLS on.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS (with `tls_key_file`).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// Connections (each auto-pipelines, so a few are plenty).
    pub pool_size: usize,
    /// Script calls to one server sent as one batch at most (1: each
    /// alone). Batches form only while earlier ones are in flight.
    pub batch_max: usize,
    /// Batches in flight per server at most (a call sent alone counts).
    pub batch_lanes: usize,
    /// Bound on opening one connection (TCP, TLS, AUTH, cluster discovery).
    pub connect_timeout: Duration,
    /// Bound on one call, end to end. Keep it well under Envoy's timeout
    /// (20 ms by default) so Envoy gets a real answer or error.
    pub command_timeout: Duration,
    /// Key prefix; see [`keys`].
    pub key_prefix: String,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("pool_size", &self.pool_size)
            .field("batch_max", &self.batch_max)
            .field("batch_lanes", &self.batch_lanes)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            username: None,
            password: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            pool_size: 4,
            batch_max: 64,
            batch_lanes: 1,
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_millis(500),
            key_prefix: keys::DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl RedisConfig {
    /// Checks the URL and TLS files without connecting: settings call this
    /// before anything is bound. The message never contains a password.
    pub fn validate(&self) -> Result<(), String> {
        self.to_fred().map(|_| ()).map_err(|e| match e {
            StoreError::Protocol(m) => m,
            other => other.to_string(),
        })
    }

    /// fred's configuration, and the deployment kind for logs.
    pub(super) fn to_fred(&self) -> Result<(Config, &'static str), StoreError> {
        let mut fred_config = Config::from_url(&self.url)
            .map_err(|e| invalid(format!("redis url {:?}: {e}", redact(&self.url))))?;
        if self.username.is_some() {
            fred_config.username = self.username.clone();
        }
        if self.password.is_some() {
            fred_config.password = self.password.clone();
        }
        // Keep retrying the first connection too, instead of failing.
        fred_config.fail_fast = false;
        let wants_tls = fred_config.tls.is_some()
            || self.tls_ca_file.is_some()
            || self.tls_cert_file.is_some()
            || self.tls_key_file.is_some();
        if wants_tls {
            fred_config.tls = Some(tls_config(self)?);
        }
        let kind = match fred_config.server {
            ServerConfig::Clustered { .. } => "redis-cluster",
            ServerConfig::Sentinel { .. } => "redis-sentinel",
            _ => "redis",
        };
        Ok((fred_config, kind))
    }
}

/// The URL without its password, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

pub(super) fn tls_config(config: &RedisConfig) -> Result<TlsConfig, StoreError> {
    use fred::rustls::pki_types::pem::PemObject;
    use fred::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use fred::rustls::{ClientConfig, RootCertStore, crypto::ring};

    let file_error = |path: &PathBuf, e: &dyn std::fmt::Display| {
        invalid(format!("reading {}: {e}", path.display()))
    };
    let mut roots = RootCertStore::empty();
    match &config.tls_ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| file_error(path, &e))?;
            for cert in certs {
                let cert = cert.map_err(|e| file_error(path, &e))?;
                roots.add(cert).map_err(|e| file_error(path, &e))?;
            }
        }
        None => {
            // Unreadable system certificates are skipped, as fred does not.
            for cert in fred::rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("tls: {e}")))?
        .with_root_certificates(roots);
    let client = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert_path), Some(key_path)) => {
            let chain = CertificateDer::pem_file_iter(cert_path)
                .map_err(|e| file_error(cert_path, &e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| file_error(cert_path, &e))?;
            let key =
                PrivateKeyDer::from_pem_file(key_path).map_err(|e| file_error(key_path, &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(format!("tls client certificate: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(invalid(
                "tls_cert_file and tls_key_file must be given together".into(),
            ));
        }
    };
    Ok(client.into())
}
