//! meshsim: boots a simulated mesh of real engines and the real data plane on a
//! virtual clock ([`weft_bench::sim`]), runs until it converges, then measures it at
//! rest.
//!
//! ```text
//! cargo run --release -p weft-bench --bin meshsim -- --nodes N --seed S [--loss PCT] [--json]
//!     [--control PATH [--serve-s SECS]]
//! ```
//!
//! That interface is stable (issue 12): `--json` prints one object with at least
//! `nodes`, `converged_virtual_s`, `steady_bytes_per_node_s`, `max_sessions_per_node`
//! and `wall_s`. Exit status 1 (and a message on stderr) when the mesh does not
//! converge within `--limit-s` virtual seconds after the last join.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use weft_bench::sim::{Plan, run};

/// Simulates a Weft mesh on a virtual clock and reports convergence and traffic at rest.
#[derive(Debug, Parser)]
#[command(name = "meshsim", version)]
struct Args {
    /// Nodes in the mesh.
    #[arg(long)]
    nodes: usize,
    /// Seed of every random choice (keys, topology, latencies, loss).
    #[arg(long)]
    seed: u64,
    /// Loss on every link, in percent (1 = 1 %).
    #[arg(long, default_value_t = 0.0, value_parser = percent)]
    loss: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Virtual milliseconds between two nodes' boots.
    #[arg(long, default_value_t = 50)]
    join_gap_ms: u64,
    /// Virtual seconds measured at rest after convergence (at least 60 for the
    /// recorded figures).
    #[arg(long, default_value_t = 60)]
    steady_s: u64,
    /// Give up when not converged this many virtual seconds after the last join.
    #[arg(long, default_value_t = 300)]
    limit_s: u64,
    /// Extra reachable (never dialled) pairs, as a fraction of the node count.
    #[arg(long, default_value_t = 0.3)]
    extra_links: f64,
    /// After the report, node 0 answers `weft status` on this Unix socket (for `weft
    /// web --control PATH`, `weft peers --control PATH`) while the mesh runs on in
    /// step with the wall clock.
    #[arg(long, value_name = "PATH")]
    control: Option<std::path::PathBuf>,
    /// How long `--control` serves, in wall seconds.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    serve_s: u64,
}

fn percent(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=100.0).contains(&p) { Ok(p) } else { Err("a percentage from 0 to 100".into()) }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.nodes == 0 {
        eprintln!("meshsim: --nodes must be at least 1");
        return ExitCode::from(2);
    }
    let plan = Plan {
        join_gap_ms: args.join_gap_ms,
        extra_links: args.extra_links,
        loss: args.loss / 100.0,
        ..Plan::new(args.nodes, args.seed)
    };
    let (mut net, r) = match run(plan, Duration::from_secs(args.limit_s), Duration::from_secs(args.steady_s)) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("meshsim: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        let v = serde_json::json!({
            "nodes": r.nodes,
            "seed": args.seed,
            "loss_pct": args.loss,
            "join_gap_ms": args.join_gap_ms,
            "converged_virtual_s": r.after_last_join.as_secs_f64(),
            "converged_total_virtual_s": r.converge.as_secs_f64(),
            "converge_bytes_per_node_s": r.converge_rate.total(),
            "steady_s": r.steady_window.as_secs_f64(),
            "steady_bytes_per_node_s": r.steady_rate.total(),
            "steady_sent_bytes_per_node_s": r.steady_rate.sent,
            "steady_relayed_bytes_per_node_s": r.steady_rate.relayed,
            "still_converged": r.still_converged,
            "max_sessions_per_node": r.max_sessions,
            "mean_sessions_per_node": r.mean_sessions,
            "links": r.links,
            "direct_links": r.direct_links,
            "diameter": r.diameter,
            "check_wall_s": r.check_wall.as_secs_f64(),
            "cheap_checks": r.cheap_checks.0,
            "cheap_checks_wall_s": r.cheap_checks.1.as_secs_f64(),
            "full_checks": r.full_checks.0,
            "full_checks_wall_s": r.full_checks.1.as_secs_f64(),
            "wall_s": r.wall.as_secs_f64(),
        });
        println!("{v}");
    } else {
        println!("nodes                    {}", r.nodes);
        println!(
            "converged_virtual_s      {:.2} (after the last join; {:.2} from the first boot)",
            r.after_last_join.as_secs_f64(),
            r.converge.as_secs_f64()
        );
        println!(
            "steady_bytes_per_node_s  {:.0} ({:.0} sent + {:.0} relayed, over {} s at rest{})",
            r.steady_rate.total(),
            r.steady_rate.sent,
            r.steady_rate.relayed,
            r.steady_window.as_secs(),
            if r.still_converged { "" } else { "; NOT converged at the end" }
        );
        println!("converge_bytes_per_node_s {:.0}", r.converge_rate.total());
        println!("max_sessions_per_node    {} (mean {:.1})", r.max_sessions, r.mean_sessions);
        println!("links                    {} (direct {}), diameter {} hops", r.links, r.direct_links, r.diameter);
        println!(
            "wall_s                   {:.2} (convergence checks {:.2}: {} cheap in {:.2}, {} full in {:.2})",
            r.wall.as_secs_f64(),
            r.check_wall.as_secs_f64(),
            r.cheap_checks.0,
            r.cheap_checks.1.as_secs_f64(),
            r.full_checks.0,
            r.full_checks.1.as_secs_f64()
        );
    }
    if let Some(path) = &args.control {
        eprintln!("meshsim: node 0 answers `weft status` at {} for {} s", path.display(), args.serve_s);
        match weft_bench::control::serve(&mut net, path, Duration::from_secs(args.serve_s)) {
            Ok(s) => eprintln!(
                "meshsim: answered {} status requests (refused {} others); the mesh ran {:.1} s more",
                s.status,
                s.refused,
                s.ran.as_secs_f64()
            ),
            Err(e) => {
                eprintln!("meshsim: control socket {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
