//! The process's log subscriber, and changing its level live (reload).

use anyhow::Result;

use crate::config::values::{LogFormat, log_filter};

/// Installs the tracing subscriber on standard error. Level: `--log-level` (or
/// WEFT_LOG_LEVEL), else RUST_LOG, else the config file's, else `info`; format:
/// `--log-format` (or WEFT_LOG_FORMAT), else the config file's, else text.
pub(crate) fn init(
    level: Option<String>,
    format: Option<&str>,
    file_level: Option<&str>,
    file_format: Option<&str>,
) -> Result<()> {
    let env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let level = level.or(env).or_else(|| file_level.map(str::to_owned));
    let filter = log_filter(level.as_deref().unwrap_or("info"))?;
    let format: LogFormat = format.or(file_format).unwrap_or("text").parse()?;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let b = fmt.with_ansi(ansi).with_filter_reloading();
            let h = b.reload_handle();
            let _ = LOG_RELOAD.set(Box::new(move |f| h.reload(f).map_err(|e| e.to_string())));
            b.init();
        }
        LogFormat::Json => {
            let b = fmt.json().with_current_span(false).with_span_list(false).with_filter_reloading();
            let h = b.reload_handle();
            let _ = LOG_RELOAD.set(Box::new(move |f| h.reload(f).map_err(|e| e.to_string())));
            b.init();
        }
    }
    Ok(())
}

/// Replaces the log filter of the installed subscriber.
type Reloader = Box<dyn Fn(tracing_subscriber::EnvFilter) -> Result<(), String> + Send + Sync>;
static LOG_RELOAD: std::sync::OnceLock<Reloader> = std::sync::OnceLock::new();

/// Sets the log level of the running process (a live reload).
pub fn set_log_level(spec: &str) -> Result<(), String> {
    let filter = log_filter(spec).map_err(|e| e.to_string())?;
    match LOG_RELOAD.get() {
        Some(reload) => reload(filter),
        None => Err("no log subscriber installed".into()),
    }
}
