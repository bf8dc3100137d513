//! Text generated from the clap definitions, for packaging: `weft completions SHELL`
//! and the hidden `weft man [COMMAND]`.

use std::io::Write;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::config::args::{COMMIT, Cli, VERSION};
use crate::config::values::UsageError;

/// `weft version [--json]`.
pub(crate) fn version(json: bool) -> Result<()> {
    use weft_core::handshake::Protocol;
    if json {
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "commit": COMMIT,
            "protocol": Protocol::VERSION,
            "min_protocol": Protocol::MIN,
        });
        println!("{v}");
    } else {
        println!("weft {VERSION}");
    }
    Ok(())
}

/// Prints the completion script for `shell`.
pub(crate) fn completions(shell: Shell) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "weft", &mut out);
    print(&out)
}

/// Prints weft(1), or weft-COMMAND(1) for a visible subcommand.
pub(crate) fn man(command: Option<&str>) -> Result<()> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let page = match command {
        None => cli,
        Some(name) => cli
            .find_subcommand(name)
            .filter(|c| !c.is_hide_set())
            .cloned()
            .ok_or_else(|| UsageError(format!("no man page for {name:?}: not a weft subcommand")))?,
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page).source(format!("weft {VERSION}")).manual("Weft").render(&mut out)?;
    print(&out)
}

fn print(bytes: &[u8]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes).and_then(|()| stdout.flush()).context("cannot write to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_protocol_this_build_speaks() {
        let want = format!(" protocol {}", weft_core::handshake::Protocol::VERSION);
        assert!(VERSION.ends_with(&want), "{VERSION:?} should end with {want:?}");
    }
}
