//! The `ip` command (iproute2), run and checked.

use tracing::{debug, warn};

/// Runs `ip ARGS`, logging a failure (route changes are best effort: the mesh works
/// without them, only the proxied subnets would be unreachable).
pub(crate) fn run_ip(args: &[&str]) {
    if let Err(e) = ip(args) {
        warn!(?args, error = %e, "ip command failed");
    }
}

/// Runs `ip ARGS`; the error is its standard error (or why it could not run).
pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    match std::process::Command::new("ip").args(args).output() {
        Ok(o) if o.status.success() => {
            debug!(?args, "ip");
            Ok(())
        }
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(format!("cannot run ip: {e}")),
    }
}
