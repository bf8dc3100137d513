//! The subcommands other than `weft up`: clients of a running node's control socket
//! (`status`, `peers`, `peer add`, `wg add`, `reload`, ...) and the local ones (`secret
//! generate`, `authority`, `id`, `cert show`, `completions`, `man`).

use anyhow::Result;

use crate::config::args::{
    self, AuthorityCommand, CertCommand, Command, ExitCommand, PeerCommand, PolicyCommand, RevokeCommand,
    SecretCommand, WgCommand,
};
use crate::config::values::UsageError;
use crate::config::{NodeConfig, secret};
use crate::{daemon, meta};

pub(crate) mod authority;
pub(crate) mod ledger;
pub(crate) mod show;

/// Runs `command`.
pub(crate) fn run(command: Command) -> Result<()> {
    match command {
        Command::Up(args) => {
            daemon::run(NodeConfig::resolve(&args)?, daemon::Reloadable { args: *args, log_level_pinned: true })
        }
        Command::Status(q) => query(&q, show::status),
        Command::Peers(q) => query(&q, show::peers),
        Command::Routes(q) => query(&q, show::routes),
        Command::Netcheck(q) => query(&q, show::netcheck),
        Command::Peer(PeerCommand::Add(a)) => change(&a.control, &weft_control::Request::AddPeer { uri: a.peer }),
        Command::Peer(PeerCommand::Remove(a)) => {
            change(&a.control, &weft_control::Request::RemovePeer { peer: a.peer })
        }
        Command::Wg(WgCommand::Add(a)) => wg_add(&a),
        Command::Wg(WgCommand::List(q)) => query(&q, show::portal),
        Command::Wg(WgCommand::Remove(a)) => change(&a.control, &weft_control::Request::WgRemove { name: a.name }),
        Command::Reload(a) => change(&a.control, &weft_control::Request::Reload),
        Command::Exit(ExitCommand::Accept(a)) => change(&a.control, &weft_control::Request::AcceptExit),
        Command::Secret(SecretCommand::Generate) => {
            println!("{}", secret::generate()?);
            Ok(())
        }
        Command::Authority(AuthorityCommand::Init(a)) => authority::init(&a.out),
        Command::Authority(AuthorityCommand::Sign(a)) => authority::sign(&a),
        Command::Authority(AuthorityCommand::Revoke(a)) => authority::revoke(&a),
        Command::Authority(AuthorityCommand::Invite(a)) => authority::invite(&a),
        Command::Authority(AuthorityCommand::SignPolicy(a)) => authority::sign_policy(&a),
        Command::Policy(PolicyCommand::Push(a)) => {
            let text = if a.policy.trim_start().starts_with(weft_core::policy::SIGNED_POLICY_PREFIX) {
                a.policy.clone()
            } else {
                std::fs::read_to_string(&a.policy).map_err(|e| {
                    UsageError(format!(
                        "{:?} is neither a signed policy (weft-policy:...) nor a file that can be read: {e}",
                        a.policy
                    ))
                })?
            };
            let p = weft_core::policy::SignedPolicy::from_text(&text)
                .map_err(|e| UsageError(format!("invalid signed policy: {e}")))?;
            change(&a.control, &weft_control::Request::PushPolicy { policy: p.to_text() })
        }
        Command::Id(a) => authority::id(a.state_dir.as_deref()),
        Command::Cert(CertCommand::Show(a)) => authority::show(&a),
        Command::Policy(PolicyCommand::Check(a)) => crate::services::policy::check(&a.file),
        Command::Policy(PolicyCommand::Explain(a)) => {
            change(&a.control, &weft_control::Request::ExplainPolicy { from: a.from, to: a.to, proto: a.proto })
        }
        Command::Policy(PolicyCommand::Denials(q)) if q.json => {
            let s = status(&q.control)?;
            let list = s.policy.map(|p| p.recent_denials).unwrap_or_default();
            println!("{}", serde_json::to_string_pretty(&list)?);
            Ok(())
        }
        Command::Policy(PolicyCommand::Denials(q)) => query(&q, show::denials),
        Command::Revoke(RevokeCommand::Add(a)) => {
            let revocation = authority::read_revocation(&a.revocation)?;
            change(&a.control, &weft_control::Request::AddRevocation { revocation })
        }
        // The console sits above the commands (`crate::web` uses their signing code):
        // `crate::run` starts it.
        Command::Web(_) => anyhow::bail!("`weft web` is started by weft::run, not by commands::run"),
        Command::Version(a) => meta::version(a.json),
        Command::Completions(a) => meta::completions(a.shell),
        Command::Man(a) if a.markdown => meta::markdown(),
        Command::Man(a) => meta::man(a.command.as_deref()),
    }
}

/// Asks the node for its status and prints it as JSON or with `table`.
fn query(q: &args::QueryArgs, table: fn(&weft_control::StatusJson) -> String) -> Result<()> {
    let s = status(&q.control)?;
    if q.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", table(&s));
    }
    Ok(())
}

/// The node's status, from its control socket.
fn status(control: &std::path::Path) -> Result<weft_control::StatusJson> {
    match weft_control::request(control, &weft_control::Request::Status)? {
        weft_control::Reply::Status(s) => Ok(*s),
        weft_control::Reply::Error { message } => {
            anyhow::bail!("node refused the request: {}", show::printable(&message))
        }
        weft_control::Reply::Done { .. } | weft_control::Reply::WgClient(_) => {
            anyhow::bail!("unexpected reply from the node")
        }
    }
}

/// `weft wg add`: prints the new client's config (and a QR code of it with `--qr`).
fn wg_add(a: &args::WgAddArgs) -> Result<()> {
    match weft_control::request(&a.control, &weft_control::Request::WgAdd { name: a.name.clone() })? {
        weft_control::Reply::WgClient(c) if a.json => println!("{}", serde_json::to_string_pretty(&c)?),
        weft_control::Reply::WgClient(c) => {
            print!("{}", c.config);
            if a.qr {
                let code = qrcode::QrCode::new(c.config.as_bytes())
                    .map_err(|e| anyhow::anyhow!("cannot make a QR code of the config: {e}"))?;
                let art = code
                    .render::<qrcode::render::unicode::Dense1x2>()
                    .dark_color(qrcode::render::unicode::Dense1x2::Light)
                    .light_color(qrcode::render::unicode::Dense1x2::Dark)
                    .build();
                println!("\n{art}");
            }
            eprintln!(
                "client {} has address {}; this is the only copy of its private key",
                show::printable(&c.name),
                c.address
            );
        }
        weft_control::Reply::Error { message } => return Err(UsageError(show::printable(&message).into_owned()).into()),
        _ => anyhow::bail!("unexpected reply from the node"),
    }
    Ok(())
}

/// Sends a request that changes the node and prints what it did. A refusal is the
/// caller's bad input (exit 2).
fn change(path: &std::path::Path, req: &weft_control::Request) -> Result<()> {
    match weft_control::request(path, req)? {
        // Messages may quote peer-supplied names: no raw control characters.
        weft_control::Reply::Done { message } => println!("{}", show::printable(&message)),
        weft_control::Reply::Error { message } => return Err(UsageError(show::printable(&message).into_owned()).into()),
        weft_control::Reply::Status(_) | weft_control::Reply::WgClient(_) => {
            anyhow::bail!("unexpected reply from the node")
        }
    }
    Ok(())
}
