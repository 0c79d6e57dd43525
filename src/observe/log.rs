//! Log lines through `tracing`: text or one JSON object per line. A line
//! written while a traced call is being decided carries the call's
//! `trace_id` (a field of the `rls` span `service` opens for it).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::settings::LogFormat;

/// The subscriber `serve` installs, writing to `writer`; tests pass their
/// own writer. `filter` is validated by settings already; a bad one here
/// logs everything at `info`.
pub fn logger<W>(
    format: LogFormat,
    filter: &str,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    match format {
        LogFormat::Text => Box::new(
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(ansi)
                .with_writer(writer)
                .finish(),
        ),
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt()
                .json()
                .with_env_filter(filter)
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(writer)
                .finish(),
        ),
    }
}

/// An error and its causes joined by `: `, each said once: a layer whose
/// text its cause repeats (a connector's `tcp connect error` wraps one
/// that says the same) or that only repeats its wrapper is left out.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        match parts.last_mut() {
            Some(last) if last.contains(&text) => {}
            Some(last) if text.starts_with(last.as_str()) => *last = text,
            _ => parts.push(text),
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod chain_tests {
    use super::error_chain;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn each_cause_once() {
        let refused = E(
            "connecting to 127.0.0.1:1",
            Some(Box::new(E(
                "tcp connect error",
                Some(Box::new(E(
                    "tcp connect error",
                    Some(Box::new(E("Connection refused (os error 111)", None))),
                ))),
            ))),
        );
        assert_eq!(
            error_chain(&refused),
            "connecting to 127.0.0.1:1: tcp connect error: Connection refused (os error 111)"
        );
        let prefixed = E(
            "binding",
            Some(Box::new(E(
                "in use",
                Some(Box::new(E("in use: port 1", None))),
            ))),
        );
        assert_eq!(error_chain(&prefixed), "binding: in use: port 1");
    }
}
