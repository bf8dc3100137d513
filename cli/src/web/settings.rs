//! `weft web`'s settings: its flags (and their environment variables) over the keys of
//! its configuration file (`--config`, e.g. `/etc/weft/web.toml` for the service), over
//! the defaults. The file's keys are the flags' names:
//!
//! ```toml
//! listen = "0.0.0.0:8787"
//! tls-cert = "/etc/weft/web.crt"
//! tls-key = "/etc/weft/web.key"
//! token-file = "/var/lib/weft-web/token"
//! authority-key = "/etc/weft/authority.key"
//! session-lifetime = "8h"
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::args::{WebArgs, default_control};
use crate::config::values::{Secret, UsageError, check_private};

/// Where the console listens unless told.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// How long a login lasts unless told.
pub(crate) const DEFAULT_SESSION_LIFETIME: &str = "12h";

/// The keys of the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct File {
    listen: Option<String>,
    control: Option<PathBuf>,
    token_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    insecure_http: Option<bool>,
    authority_key: Option<PathBuf>,
    network_secret: Option<Secret>,
    session_lifetime: Option<String>,
}

impl File {
    /// Reads and parses `path`; a file that holds the network secret must be private
    /// to its owner, like the node's.
    fn load(path: &Path) -> Result<Self, UsageError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UsageError(format!("cannot read config file {}: {e}", path.display())))?;
        let file: Self = toml::from_str(&text)
            .map_err(|e| UsageError(format!("bad config file {}: {}", path.display(), e.message().trim())))?;
        if file.network_secret.as_ref().is_some_and(|s| !s.0.is_empty()) {
            check_private(path, "config file", "holds network-secret and")?;
        }
        Ok(file)
    }
}

/// What `weft web` runs with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) listen: String,
    pub(crate) control: PathBuf,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) tls: Option<(PathBuf, PathBuf)>,
    pub(crate) insecure_http: bool,
    pub(crate) authority_key: Option<PathBuf>,
    pub(crate) network_secret: Option<Secret>,
    pub(crate) session_lifetime: String,
}

impl Settings {
    /// The flags over the file over the defaults; a certificate without its key (or
    /// the other way round), from wherever each came, is refused.
    pub(crate) fn of(a: &WebArgs) -> Result<Self, UsageError> {
        let f = a.config.as_deref().map(File::load).transpose()?.unwrap_or_default();
        let tls_cert = a.tls_cert.clone().or(f.tls_cert);
        let tls_key = a.tls_key.clone().or(f.tls_key);
        let tls = match (tls_cert, tls_key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => return Err(UsageError("tls-cert needs tls-key (the certificate's private key)".into())),
            (None, Some(_)) => return Err(UsageError("tls-key needs tls-cert (the certificate it belongs to)".into())),
        };
        let insecure_http = a.insecure_http || f.insecure_http.unwrap_or(false);
        if insecure_http && tls.is_some() {
            return Err(UsageError("insecure-http and tls-cert/tls-key exclude each other: pick one".into()));
        }
        Ok(Self {
            listen: a.listen.clone().or(f.listen).unwrap_or_else(|| DEFAULT_LISTEN.to_owned()),
            control: a.control.clone().or(f.control).unwrap_or_else(default_control),
            token_file: a.token_file.clone().or(f.token_file),
            tls,
            insecure_http,
            authority_key: a.authority_key.clone().or(f.authority_key),
            network_secret: a.network_secret.clone().or(f.network_secret),
            session_lifetime: a
                .session_lifetime
                .clone()
                .or(f.session_lifetime)
                .unwrap_or_else(|| DEFAULT_SESSION_LIFETIME.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::args::{Cli, Command};

    fn args(argv: &[&str]) -> WebArgs {
        let mut full = vec!["weft", "web"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Command::Web(a) => *a,
            other => panic!("not weft web: {other:?}"),
        }
    }

    /// A file removed on drop.
    struct Temp(PathBuf);

    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn file(text: &str, mode: u32) -> (Temp, String) {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("weft-web-settings-{}-{n}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        let s = p.to_str().unwrap().to_owned();
        (Temp(p), s)
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_the_defaults() {
        let s = Settings::of(&args(&[])).unwrap();
        assert_eq!((s.listen.as_str(), s.session_lifetime.as_str()), (DEFAULT_LISTEN, DEFAULT_SESSION_LIFETIME));
        assert!(s.tls.is_none() && !s.insecure_http && s.token_file.is_none());
        let (_d, p) = file(
            "listen = \"0.0.0.0:9000\"\ntls-cert = \"/c.pem\"\ntls-key = \"/k.pem\"\ntoken-file = \"/t\"\n\
             session-lifetime = \"8h\"\ncontrol = \"/run/x.sock\"\n",
            0o644,
        );
        let s = Settings::of(&args(&["--config", &p])).unwrap();
        assert_eq!(s.listen, "0.0.0.0:9000");
        assert_eq!(s.tls, Some(("/c.pem".into(), "/k.pem".into())));
        assert_eq!((s.token_file, s.control), (Some("/t".into()), PathBuf::from("/run/x.sock")));
        assert_eq!(s.session_lifetime, "8h");
        let s = Settings::of(&args(&["--config", &p, "--listen", "127.0.0.1:1", "--session-lifetime", "1h"])).unwrap();
        assert_eq!((s.listen.as_str(), s.session_lifetime.as_str()), ("127.0.0.1:1", "1h"));
    }

    #[test]
    fn bad_files_and_half_tls_are_refused_with_the_reason() {
        let err = |argv: &[&str]| Settings::of(&args(argv)).unwrap_err().0;
        assert!(err(&["--config", "/nonexistent/web.toml"]).contains("cannot read config file /nonexistent/web.toml"));
        let (_d, p) = file("lissen = \"0.0.0.0:1\"\n", 0o644);
        assert!(err(&["--config", &p]).contains("unknown field `lissen`"), "{}", err(&["--config", &p]));
        let (_d, p) = file("tls-cert = \"/c.pem\"\n", 0o644);
        assert!(err(&["--config", &p]).contains("tls-cert needs tls-key"));
        let (_d2, p2) = file("insecure-http = true\n", 0o644);
        assert!(err(&["--config", &p2, "--tls-cert", "/c", "--tls-key", "/k"]).contains("exclude each other"));
        let (_d, p) = file("network-secret = \"a long enough secret\"\n", 0o644);
        assert!(err(&["--config", &p]).contains("chmod 600"), "{}", err(&["--config", &p]));
        let (_d, p) = file("network-secret = \"a long enough secret\"\n", 0o600);
        assert!(Settings::of(&args(&["--config", &p])).unwrap().network_secret.is_some());
    }
}
