//! Text generated from the clap definitions, for packaging: `weft completions SHELL`,
//! the hidden `weft man [COMMAND]`, and `weft man --markdown` (docs/reference/cli.md).

use std::fmt::Write as _;
use std::io::Write;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::config::args::{COMMIT, Cli, DEFAULT_CONTROL, VERSION, default_control};
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

/// Prints the command-line reference as Markdown: every visible subcommand, its usage
/// and every option, with its environment variable, default and possible values.
pub(crate) fn markdown() -> Result<()> {
    print(render_markdown().as_bytes())
}

/// The Markdown of `weft man --markdown`. Deterministic: no terminal width, no version
/// or commit, and the control socket's default (which depends on who runs it) spelled
/// out rather than computed.
fn render_markdown() -> String {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         <!-- Generated from the clap definitions (cli/src/config/args.rs) by `weft man --markdown`; \
         do not edit. Regenerate: WEFT_BLESS=1 cargo test -p weft --test cli_meta -->\n\n\
         Every subcommand of `weft` and every flag, as `weft COMMAND --help` prints them. \
         Flags of `weft up` are also keys of its configuration file ([config.md](config.md)). \
         Options marked *global* are accepted by every subcommand.\n\n",
    );
    let mut index = String::new();
    let mut body = String::new();
    section(&cli, "weft", 2, &mut index, &mut body);
    out.push_str(&index);
    out.push('\n');
    out.push_str(&body);
    out
}

fn section(cmd: &clap::Command, path: &str, level: usize, index: &mut String, body: &mut String) {
    let slug = path.replace(' ', "-");
    let _ = writeln!(index, "{}- [`{path}`](#{slug})", "  ".repeat(level - 2));
    let _ = writeln!(body, "{} `{path}`\n", "#".repeat(level.min(4)));
    if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
        let _ = writeln!(body, "{}\n", about.to_string().trim());
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage: ");
    let _ = writeln!(body, "```text\n{usage}\n```\n");
    // Global options are listed once, under `weft`.
    let top = level == 2;
    let args: Vec<_> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
        .filter(|a| top || !a.is_global_set())
        .collect();
    let (positional, options): (Vec<_>, Vec<_>) = args.into_iter().partition(|a| a.is_positional());
    for a in positional.iter().chain(options.iter()) {
        let _ = writeln!(body, "- {}", describe(a));
    }
    if !positional.is_empty() || !options.is_empty() {
        body.push('\n');
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        section(sub, &format!("{path} {}", sub.get_name()), level + 1, index, body);
    }
}

/// One line (or paragraph) per argument: its spelling, then its help and facts.
fn describe(a: &clap::Arg) -> String {
    let value = a.get_value_names().map(|v| v.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>().join(" "));
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
    let mut spelling = Vec::new();
    if let Some(s) = a.get_short() {
        spelling.push(format!("-{s}"));
    }
    if let Some(l) = a.get_long() {
        spelling.push(format!("--{l}"));
    }
    let head = if a.is_positional() {
        value.unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()))
    } else {
        let mut h = spelling.join(", ");
        if takes_value {
            let v = value.unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()));
            let _ = write!(h, " {v}");
        }
        h
    };
    let mut line = format!("`{head}`");
    if matches!(a.get_action(), clap::ArgAction::Append) {
        line.push_str(" (repeatable)");
    }
    if let Some(help) = a.get_long_help().or_else(|| a.get_help()) {
        let help = help.to_string().trim().replace("\n\n", " ").replace('\n', " ");
        let _ = write!(line, ": {help}");
    }
    let mut facts = Vec::new();
    if a.is_global_set() {
        facts.push("global".to_owned());
    }
    if let Some(env) = a.get_env() {
        facts.push(format!("env `{}`", env.to_string_lossy()));
    }
    let defaults: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if !defaults.is_empty() && takes_value {
        if a.get_id() == "control" && defaults == [default_control().to_string_lossy()] {
            facts.push(format!(
                "default `{DEFAULT_CONTROL}` for root, else `$XDG_RUNTIME_DIR/weft/weft.sock` \
                 (`/tmp/weft-UID/weft.sock` without `XDG_RUNTIME_DIR`)"
            ));
        } else {
            facts.push(format!("default `{}`", defaults.join(",")));
        }
    }
    let values: Vec<String> =
        a.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| format!("`{}`", v.get_name())).collect();
    if !values.is_empty() && takes_value {
        facts.push(format!("one of {}", values.join(", ")));
    }
    if !facts.is_empty() {
        let _ = write!(line, " ({})", facts.join("; "));
    }
    line
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
