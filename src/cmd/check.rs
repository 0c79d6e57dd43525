//! `tollgate check`: a small RLS client for debugging a running service
//! (tollgate or any other Envoy rate-limit service).

use std::fmt::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_response::{Code, rate_limit};
use tollgate::proto::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};
use tollgate::tls;

/// Where to send requests and what to ask: shared by `check` and `bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// Address of the service, host:port.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// The rate-limit domain.
    #[arg(long)]
    pub domain: String,
    /// Descriptor entries `k=v[,k2=v2...]`; repeat for several descriptors.
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Connect over TLS (also implied by an https:// address or any --tls-* flag).
    #[arg(long)]
    pub tls: bool,
    /// PEM CA certificates to trust [default: the system's roots].
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate chain, for servers that require one (mTLS).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name to verify the server's certificate against [default: the address's host].
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

impl Target {
    /// Every `--descriptor`, parsed.
    pub fn parsed_descriptors(&self) -> Result<Vec<Vec<(String, String)>>, String> {
        self.descriptors
            .iter()
            .map(|d| parse_descriptor(d).map_err(|e| format!("--descriptor {e}")))
            .collect()
    }

    /// The client TLS settings the flags ask for, files read and checked;
    /// `None` for plaintext.
    pub fn client_tls(&self) -> anyhow::Result<Option<ClientTls>> {
        let wanted = self.tls
            || self.addr.starts_with("https://")
            || self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_server_name.is_some();
        if !wanted {
            return Ok(None);
        }
        if self.addr.starts_with("http://") {
            bail!(
                "--addr {} is plaintext (http://) but TLS was asked for",
                self.addr
            );
        }
        let mut config = ClientTlsConfig::new();
        match &self.tls_ca {
            Some(file) => {
                let pem = std::fs::read(file)
                    .with_context(|| format!("--tls-ca {}: cannot be read", file.display()))?;
                tls::parse_certs(&pem).map_err(|e| anyhow!("--tls-ca {}: {e}", file.display()))?;
                config = config.ca_certificate(Certificate::from_pem(pem));
            }
            None => config = config.with_native_roots(),
        }
        if let (Some(cert_file), Some(key_file)) = (&self.tls_cert, &self.tls_key) {
            let cert = std::fs::read(cert_file)
                .with_context(|| format!("--tls-cert {}: cannot be read", cert_file.display()))?;
            tls::parse_certs(&cert)
                .map_err(|e| anyhow!("--tls-cert {}: {e}", cert_file.display()))?;
            let key = std::fs::read(key_file)
                .with_context(|| format!("--tls-key {}: cannot be read", key_file.display()))?;
            tls::parse_key(&key).map_err(|e| anyhow!("--tls-key {}: {e}", key_file.display()))?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.tls_server_name {
            config = config.domain_name(name.clone());
        }
        Ok(Some(ClientTls {
            config,
            client_cert: self.tls_cert.clone(),
        }))
    }
}

/// A client's TLS settings. Its `Debug` leaves out the configuration, which
/// holds the private key.
#[derive(Clone)]
pub struct ClientTls {
    pub config: ClientTlsConfig,
    client_cert: Option<PathBuf>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_cert", &self.client_cert)
            .finish_non_exhaustive()
    }
}

/// An endpoint for `addr` (`host:port` or a URI), over TLS when `tls` is set.
pub fn endpoint(
    addr: &str,
    timeout: Duration,
    tls: Option<&ClientTls>,
) -> anyhow::Result<Endpoint> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else if tls.is_some() {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .with_context(|| format!("--addr {addr} is not a valid address"))?
        .connect_timeout(timeout)
        .tcp_nodelay(true);
    match tls {
        Some(tls) => endpoint
            .tls_config(tls.config.clone())
            .with_context(|| format!("TLS settings for --addr {addr}")),
        None => Ok(endpoint),
    }
}

/// Parses `k=v[,k2=v2...]` into descriptor entries. The first `=` of each
/// pair splits key from value, so values may contain `=`.
pub fn parse_descriptor(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not key=value"))?;
            if k.is_empty() {
                return Err(format!("{pair:?} has an empty key"));
            }
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Builds a request from parsed descriptors.
pub fn request(domain: &str, descriptors: &[Vec<(String, String)>], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone().into_bytes(),
                        value: value.clone().into_bytes(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// A response, and whether the server said it has no rules for the domain
/// (tollgate's `tollgate-domain: unknown` response metadata; other
/// services never say so).
#[derive(Debug)]
pub struct Answer {
    pub response: RateLimitResponse,
    pub unknown_domain: bool,
}

/// Sends one request to `addr` (`host:port`, `http://` or `https://`).
pub async fn call(
    addr: &str,
    tls: Option<&ClientTls>,
    req: RateLimitRequest,
    timeout: Duration,
) -> anyhow::Result<Answer> {
    let channel = endpoint(addr, timeout, tls)?
        .timeout(timeout)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let mut client = RateLimitServiceClient::new(channel);
    let resp = client
        .should_rate_limit(req)
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
    let unknown_domain = resp
        .metadata()
        .get(tollgate::service::DOMAIN_HEADER)
        .is_some_and(|v| v == "unknown");
    Ok(Answer {
        response: resp.into_inner(),
        unknown_domain,
    })
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// Human-readable rendering of a response, one line per descriptor.
pub fn render(req: &RateLimitRequest, resp: &RateLimitResponse) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "overall: {}", code_name(resp.overall_code));
    for (i, s) in resp.statuses.iter().enumerate() {
        let entries = req
            .descriptors
            .get(i)
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| {
                        format!(
                            "{}={}",
                            String::from_utf8_lossy(&e.key),
                            String::from_utf8_lossy(&e.value)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let _ = write!(out, "descriptor {i} [{entries}]: {}", code_name(s.code));
        match &s.current_limit {
            Some(l) => {
                let unit = rate_limit::Unit::try_from(l.unit)
                    .map(|u| u.as_str_name().to_ascii_lowercase())
                    .unwrap_or_else(|_| l.unit.to_string());
                let _ = write!(out, " limit={}/{unit}", l.requests_per_unit);
                if !l.name.is_empty() {
                    let _ = write!(out, " name={}", l.name);
                }
                let _ = write!(out, " remaining={}", s.limit_remaining);
            }
            None if s.limit_remaining == u32::MAX => {
                let _ = write!(out, " unlimited");
            }
            None => {
                let _ = write!(out, " no limit");
            }
        }
        if let Some(d) = &s.duration_until_reset {
            let secs = d.seconds as f64 + f64::from(d.nanos) / 1e9;
            let _ = write!(out, " reset={secs:.3}s");
        } else if let Some(l) = &s.current_limit
            && s.code == Code::OverLimit as i32
        {
            // Refused with no time to wait for: tollgate's answer to a
            // cost no call can ever pass (README, "Answers").
            let cost = req.hits_addend.max(1);
            if cost > l.requests_per_unit {
                let _ = write!(
                    out,
                    " can never pass: cost {cost} > limit {}",
                    l.requests_per_unit
                );
            } else {
                let _ = write!(
                    out,
                    " no reset: cost {cost} can never pass (above a token bucket's burst), or the store failed and the policy denied"
                );
            }
        }
        out.push('\n');
    }
    for h in &resp.response_headers_to_add {
        let _ = writeln!(out, "header {}: {}", h.key, h.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_parse() {
        assert_eq!(
            parse_descriptor("a=1,b=x=y").unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "x=y".into())]
        );
        assert_eq!(
            parse_descriptor("k=").unwrap(),
            vec![("k".into(), "".into())]
        );
        assert!(parse_descriptor("novalue").is_err());
        assert!(parse_descriptor("=v").is_err());
    }
}
