//! The values a setting takes ([`Kind`]), one setting's declaration
//! ([`Setting`]), and the check every given value (and default) meets. The
//! settings themselves are declared in `table`.

/// The values a setting takes; a given value (or the default) that is not
/// one of them is refused as `name=value is not valid: reason`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// A socket address, `host:port`.
    Addr,
    /// A whole number of milliseconds.
    Millis,
    /// A whole number from `min` to `max`.
    Count { min: u64, max: u64 },
    /// A whole number of at least this.
    AtLeast(u64),
    /// `true` or `false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
    Bool,
    /// A number from `min` to `max`; `open_min` excludes `min` itself.
    Number { min: f64, max: f64, open_min: bool },
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Free text, checked where it is used (URLs, names, file paths).
    Text,
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// Its key in the settings file, `.` between levels: `redis.pool_size`.
    pub name: &'static str,
    /// `None`: unset unless given (the meaning says what that means).
    pub default: Option<&'static str>,
    pub kind: Kind,
    pub meaning: &'static str,
}

/// Whether `text` is a value of `kind`; the reason when it is not.
pub fn check(kind: Kind, text: &str) -> Result<(), String> {
    let t = text.trim();
    match kind {
        Kind::Addr => t
            .parse::<std::net::SocketAddr>()
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Kind::Millis => t.parse::<u64>().map(|_| ()).map_err(|e| e.to_string()),
        Kind::Count { min, max } => {
            let n = t.parse::<u64>().map_err(|e| e.to_string())?;
            if (min..=max).contains(&n) {
                Ok(())
            } else {
                Err(format!("must be between {min} and {max}"))
            }
        }
        Kind::AtLeast(min) => {
            let n = t.parse::<u64>().map_err(|e| e.to_string())?;
            if n >= min {
                Ok(())
            } else {
                Err(format!("must be at least {min}"))
            }
        }
        Kind::Bool => parse_bool(t).map(|_| ()),
        Kind::Number { min, max, open_min } => {
            let x = t.parse::<f64>().map_err(|e| e.to_string())?;
            let above_min = if open_min { x > min } else { x >= min };
            if above_min && x <= max {
                Ok(())
            } else if open_min {
                Err(format!("must be above {min} and at most {max}"))
            } else {
                Err(format!("must be between {min} and {max}"))
            }
        }
        Kind::Choice(words) => {
            if words.contains(&t) {
                return Ok(());
            }
            let (last, rest) = words.split_last().unwrap_or((&"", &[]));
            if rest.is_empty() {
                Err(format!("expected {last}"))
            } else {
                Err(format!("expected {} or {last}", rest.join(", ")))
            }
        }
        Kind::Text => Ok(()),
    }
}

/// The spellings of true and false a settings file or variable may use.
pub fn parse_bool(t: &str) -> Result<bool, String> {
    match t.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        other => Err(format!("expected true or false, found {other:?}")),
    }
}
