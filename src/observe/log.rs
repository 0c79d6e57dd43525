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
