//! The `xds.*` settings composed into [`XdsSettings`]: the server URL
//! with its scheme, its TLS files read, the node metadata and headers
//! checked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::values::{Values, bad};
use super::{SettingsError, Sources, XdsSettings, XdsTls};

/// The `xds.*` settings, each read and checked; `None` without
/// `xds.server_url`.
pub(super) fn xds_settings(v: &Values<'_>) -> Result<Option<XdsSettings>, SettingsError> {
    let src = v.src;
    // Every xds setting is read (and checked) whether or not it is used.
    let url = v.opt_text("xds.server_url")?;
    let ca = v.file("xds.tls_ca_file")?;
    let cert = v.file("xds.tls_cert_file")?;
    let key = v.file("xds.tls_key_file")?;
    let tls_wanted = v.bool("xds.tls")?;
    let server_name = v.opt_text("xds.tls_server_name")?;
    let node_id: String = v.get("xds.node_id")?;
    let node_cluster = v.opt_text("xds.node_cluster")?;
    let node_metadata_text = v.opt_text("xds.node_metadata")?;
    let headers_text = v.opt_text("xds.headers")?;
    let retry_initial = Duration::from_millis(v.get("xds.retry_initial_ms")?);
    let retry_max = Duration::from_millis(v.get("xds.retry_max_ms")?);
    let serve_without_config = v.bool("xds.serve_without_config")?;
    let Some(url) = url else {
        return Ok(None);
    };
    if cert.is_some() != key.is_some() {
        return Err(bad(
            src,
            "xds.tls_cert_file",
            &format!("{cert:?}"),
            "xds.tls_cert_file and xds.tls_key_file go together",
        ));
    }
    let url = xds_url(src, url, tls_wanted || ca.is_some() || cert.is_some())?;
    let tls = xds_tls(src, &url, ca, cert, key, server_name)?;
    let node_metadata = xds_node_metadata(src, node_metadata_text)?;
    let headers = match headers_text {
        None => Vec::new(),
        // The text may hold a token: errors do not repeat it.
        Some(text) => xds_headers(&text).map_err(|e| bad(src, "xds.headers", "(not shown)", e))?,
    };
    Ok(Some(XdsSettings {
        url,
        node_id,
        node_cluster,
        node_metadata,
        headers,
        tls,
        retry_initial,
        retry_max: retry_max.max(retry_initial),
        serve_without_config,
    }))
}

/// `xds.server_url` with a scheme (https:// when it has none and
/// `tls_wanted`, else http://); refused unless it names a host.
fn xds_url(src: &Sources, url: String, tls_wanted: bool) -> Result<String, SettingsError> {
    let https = url.starts_with("https://");
    let url = if url.contains("://") {
        url
    } else if https || tls_wanted {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    };
    if url
        .parse::<tonic::transport::Uri>()
        .map_or(true, |u| u.host().is_none())
        || !(url.starts_with("http://") || url.starts_with("https://"))
    {
        return Err(bad(
            src,
            "xds.server_url",
            &url,
            "expected host:port, http://host:port or https://host:port",
        ));
    }
    Ok(url)
}

/// The TLS of an https:// xDS `url`: the CA and client identity files
/// read; `None` for http://.
fn xds_tls(
    src: &Sources,
    url: &str,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    server_name: Option<String>,
) -> Result<Option<XdsTls>, SettingsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| bad(src, "xds.tls_ca_file", &p.display().to_string(), e))
    };
    let tls = if url.starts_with("https://") {
        Some(XdsTls {
            ca_pem: ca.as_deref().map(read).transpose()?,
            identity: match (cert, key) {
                (Some(c), Some(k)) => Some((read(&c)?, read(&k)?)),
                _ => None,
            },
            server_name,
        })
    } else {
        None
    };
    Ok(tls)
}

/// `xds.node_metadata`: a JSON object, if given.
fn xds_node_metadata(
    src: &Sources,
    node_metadata_text: Option<String>,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, SettingsError> {
    Ok(match node_metadata_text {
        None => None,
        Some(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(map)) => Some(map),
            _ => {
                return Err(bad(
                    src,
                    "xds.node_metadata",
                    &text,
                    "expected a JSON object",
                ));
            }
        },
    })
}

/// `xds.headers`: a JSON object of strings, each name a valid gRPC
/// metadata name and each value valid metadata text.
fn xds_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Err("expected a JSON object of strings".into());
    };
    let mut out = Vec::with_capacity(map.len());
    for (name, value) in map {
        let serde_json::Value::String(value) = value else {
            return Err(format!("the value of {name:?} must be a string"));
        };
        let name = name.to_ascii_lowercase();
        if name
            .parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>()
            .is_err()
            || name.ends_with("-bin")
        {
            return Err(format!("{name:?} is not a gRPC metadata name"));
        }
        if value
            .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
            .is_err()
        {
            return Err(format!("the value of {name:?} is not valid metadata text"));
        }
        out.push((name, value));
    }
    Ok(out)
}
