//! `weft-gui`: see the library crate.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use weft_gui::args::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    let result = if args.man {
        Args::man_page().and_then(|page| std::io::stdout().write_all(&page)).map_err(anyhow::Error::from)
    } else {
        weft_gui::app::run(args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
