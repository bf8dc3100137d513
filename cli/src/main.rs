//! The `weft` binary: parse the command line, run it, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use weft::config::args::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match weft::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(weft::exit_code(&e))
        }
    }
}
