//! The command line.

use std::path::PathBuf;

use clap::Parser;

/// Desktop status window for a Weft node: peers, routes and live throughput.
#[derive(Debug, Parser)]
#[command(name = "weft-gui", version, about, long_about = None)]
pub struct Args {
    /// The node's control socket (root and members of the socket's group, `weft`, may
    /// connect).
    #[arg(long, env = "WEFT_CONTROL", value_name = "PATH", default_value = "/run/weft/weft.sock")]
    pub control: PathBuf,

    /// Save a PNG of the window to PATH after --screenshot-after seconds and exit
    /// (for documentation and tests).
    #[arg(long, value_name = "PATH", hide = true)]
    pub screenshot: Option<PathBuf>,

    /// Seconds to wait before the screenshot.
    #[arg(long, value_name = "SECS", default_value_t = 5.0, hide = true)]
    pub screenshot_after: f64,

    /// Print the man page (roff) to standard output and exit.
    #[arg(long, hide = true)]
    pub man: bool,
}

impl Args {
    /// The man page, weft-gui(1), in roff.
    pub fn man_page() -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        clap_mangen::Man::new(<Self as clap::CommandFactory>::command()).render(&mut out)?;
        Ok(out)
    }
}
