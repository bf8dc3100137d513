//! `weft up --join TOKEN`: a new machine gets its member certificate from an issuer
//! before it starts.
//!
//! The token ([`weft_core::invite::Token`]) gives the network name, secret, entry
//! points and the signed invite. For each UDP entry point in turn: an XX handshake
//! learns the member's key and whether it issues (its hello's [`caps::ISSUER`] and
//! its certificate, checked against the invite's authority and marked issuer by it:
//! the invite goes to no member on its own word); then
//! an IK init to that key carries the invite, and the answer carries the certificate
//! or the issuer's reason for refusing one. No session is made. The certificate is
//! kept in the state directory (`certificate`), so a restart with the same token
//! starts at once and uses the invite no further. It runs before the daemon's
//! logging is set up (the config decides that), so it reports on standard error.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use rand::RngCore;
use weft_core::admission::MacKeys;
use weft_core::cert::Certificate;
use weft_core::crypto::Cipher;
use weft_core::handshake::{Hello, Initiator, Params, Protocol, Psk, Stamp, StaticKey, caps};
use weft_core::invite::Token;
use weft_core::wire::{HandshakeHeader, MessageType, RejectRepr};
use weft_datapath::transport::Proto;

use crate::config::args::UpArgs;
use crate::config::values::{PeerUri, UsageError};

/// Where the certificate a join got is kept, in the state directory.
pub const CERT_FILE: &str = "certificate";
/// How long one handshake message waits for its answer.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// Sends of one handshake message before the entry point counts as silent.
const TRIES: u32 = 3;

/// Fills what `--join` gives (network name, secret, entry points, authority) into
/// `args` where they are not set, and the certificate: the one a join kept in the
/// state directory, or a new one from an issuer.
pub fn prepare(mut args: UpArgs) -> Result<UpArgs> {
    let file = args.config.as_deref().map(crate::config::FileConfig::load).transpose()?.unwrap_or_default();
    let Some(text) = args.join.clone().or_else(|| file.join.clone()) else { return Ok(args) };
    let token = Token::from_text(&text).map_err(|e| {
        UsageError(format!(
            "invalid --join token: {e} (expected weft-invite:..., as `weft authority invite` prints it)"
        ))
    })?;
    let invite = token.invite.body().clone();
    if args.network_name.is_none() && file.network_name.is_none() {
        args.network_name = Some(invite.network.clone());
    }
    if args.network_secret.is_none() && file.network_secret.is_none() {
        args.network_secret = Some(token.secret.as_str().into());
    }
    if args.peer.is_empty() && file.peer.is_empty() {
        args.peer = token.entry_points.clone();
    }
    if args.authorities.is_empty() && file.authority.is_empty() {
        args.authorities = vec![invite.authority.to_string()];
    }
    if args.certificate.is_some() || file.certificate.is_some() {
        return Ok(args);
    }
    let network = args.network_name.clone().or_else(|| file.network_name.clone()).unwrap_or_default();
    let state_dir = args
        .state_dir
        .clone()
        .or_else(|| file.state_dir.clone())
        .unwrap_or_else(crate::config::args::default_state_dir);
    let key = super::state::load_or_create_key(&state_dir)?;
    let path = state_dir.join(CERT_FILE);
    if let Some(cert) = kept(&path, &key, &network, &token) {
        eprintln!("joined before: using the certificate kept in {} ({})", path.display(), cert.body().name);
    } else {
        let hostname =
            args.hostname.clone().or_else(|| file.hostname.clone()).unwrap_or_else(crate::config::system_hostname);
        let cert = join(&token, &network, &key, &hostname)?;
        super::state::write_private(&path, format!("{}\n", cert.to_text()).as_bytes())?;
        let b = cert.body();
        eprintln!(
            "joined network {network:?} as {} ({}/{}, groups {:?}): certificate kept in {}",
            b.name,
            b.ipv4.0,
            b.ipv4.1,
            b.groups,
            path.display()
        );
    }
    args.certificate = Some(path.display().to_string());
    Ok(args)
}

/// The certificate a join kept at `path`, if it still admits this node.
fn kept(path: &Path, key: &StaticKey, network: &str, token: &Token) -> Option<Certificate> {
    let text = std::fs::read_to_string(path).ok()?;
    let cert = Certificate::from_text(&text).ok()?;
    match cert.check(&[token.invite.body().authority], network, &key.public, unix()) {
        Ok(()) => Some(cert),
        Err(r) => {
            eprintln!("the certificate kept in {} no longer admits this node ({r}): joining again", path.display());
            None
        }
    }
}

fn unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Asks the token's entry points, in turn, for a certificate.
pub fn join(token: &Token, network: &str, key: &StaticKey, hostname: &str) -> Result<Certificate> {
    let psk = Psk::derive(network, &token.secret);
    let macs = MacKeys::new(&psk);
    let hello = Hello {
        protocol: Some(Protocol::ours(0)),
        ..Hello::new(Cipher::Aes128Gcm, std::net::Ipv4Addr::UNSPECIFIED, 0, hostname)
    };
    let mut params = Params { local: key.clone(), psk, network_name: network.to_owned(), hello };
    let mut problems = Vec::new();
    for uri in &token.entry_points {
        let addr = match uri.parse::<PeerUri>().and_then(|u| {
            if u.proto == Proto::Udp { u.resolve() } else { Err(UsageError(format!("{u}: the join speaks udp only"))) }
        }) {
            Ok(ep) => ep.addr,
            Err(e) => {
                problems.push(e.0);
                continue;
            }
        };
        match ask(&mut params, &macs, token, addr) {
            Ok(cert) => return Ok(cert),
            Err(e) => {
                eprintln!("join: {uri}: {e:#}");
                problems.push(format!("{uri}: {e:#}"));
            }
        }
    }
    bail!("cannot join network {network:?} with this invite:\n  {}", problems.join("\n  "))
}

/// One entry point: learn its key (XX), then show it the invite (IK).
fn ask(params: &mut Params, macs: &MacKeys, token: &Token, to: SocketAddr) -> Result<Certificate> {
    let bind: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse()?;
    let sock = UdpSocket::bind(bind).context("cannot open a UDP socket")?;
    sock.connect(to).with_context(|| format!("cannot reach {to}"))?;
    let authority = token.invite.body().authority;
    params.hello.join = None;
    let (done, _) = exchange(&sock, macs, params, None).context("no member answered (is the entry point up?)")?;
    let issuer = done.hello.protocol().caps & caps::ISSUER != 0;
    let cert = done
        .hello
        .cert
        .as_deref()
        .and_then(|c| Certificate::from_bytes(c).ok())
        .filter(|c| c.check(&[authority], &params.network_name, &done.remote_static, unix()).is_ok());
    let member = cert.is_some();
    let marked = cert.is_some_and(|c| c.body().issuer);
    if !member {
        bail!("it shows no certificate of the invite's authority: not a member of this network");
    }
    if !issuer {
        bail!(
            "member {:?} does not issue certificates: list a member started with --authority-key among the invite's entry points",
            done.hello.hostname
        );
    }
    // Its own word (the capability) is not enough: the authority must have marked it
    // an issuer, or the invite is not handed over.
    if !marked {
        bail!(
            "member {:?} says it issues certificates but its certificate does not mark it an issuer: the invite is not handed to it",
            done.hello.hostname
        );
    }
    params.hello.join = Some(token.invite.to_bytes());
    let (done, _) = exchange(&sock, macs, params, Some(done.remote_static)).context("the issuer did not answer")?;
    params.hello.join = None;
    if let Some(why) = done.hello.join_refused {
        bail!("the issuer {:?} refused: {why}", done.hello.hostname);
    }
    let cert = done
        .hello
        .issued
        .as_deref()
        .map(Certificate::from_bytes)
        .transpose()
        .ok()
        .flatten()
        .context("the issuer's answer carries no readable certificate")?;
    cert.check(&[authority], &params.network_name, &params.local.public, unix())
        .map_err(|r| anyhow::anyhow!("the issued certificate does not admit this node: {r}"))?;
    Ok(cert)
}

/// Sends an init (XX without `remote`, IK with it) until a response comes, and
/// reads it.
fn exchange(
    sock: &UdpSocket,
    macs: &MacKeys,
    params: &Params,
    remote: Option<[u8; 32]>,
) -> Result<(weft_core::handshake::Completed, Option<Vec<u8>>)> {
    let index = rand::thread_rng().next_u32() | 1;
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let (initiator, noise) = Initiator::start(params, remote.as_ref(), Stamp::from_unix(since))?;
    let mut msg = Vec::with_capacity(12 + noise.len() + 32);
    HandshakeHeader {
        kind: MessageType::HandshakeInit,
        pattern: initiator.pattern(),
        sender_index: index,
        receiver_index: 0,
    }
    .emit(&mut msg);
    msg.extend_from_slice(&noise);
    let mut sealed = msg.clone();
    let mac1 = macs.seal(&mut sealed, None);
    let mut buf = vec![0u8; 2048];
    for _ in 0..TRIES {
        sock.send(&sealed).context("cannot send")?;
        let deadline = Instant::now() + ANSWER_WAIT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            sock.set_read_timeout(Some(left))?;
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                // An ICMP unreachable from an earlier send: nobody listens there yet.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                Err(e) => return Err(e).context("cannot receive"),
            };
            let got = &buf[..n];
            if MessageType::of(got) == Some(MessageType::CookieReply) {
                // The member is under load: prove the address and try again at once.
                if let Some(cookie) = macs.open_cookie_reply(got, &mac1) {
                    sealed = msg.clone();
                    macs.seal(&mut sealed, Some(&cookie));
                    sock.send(&sealed).context("cannot send")?;
                }
                continue;
            }
            let Some(body) = macs.check(got) else { continue };
            match MessageType::of(body) {
                Some(MessageType::Reject) => {
                    if let Ok(r) = RejectRepr::parse(body)
                        && r.receiver_index == index
                    {
                        bail!("it refused the handshake ({:?})", r.reason);
                    }
                }
                Some(MessageType::HandshakeResponse) => {
                    let Ok((hdr, noise)) = HandshakeHeader::parse(body) else { continue };
                    if hdr.receiver_index != index {
                        continue;
                    }
                    return initiator.read_response(params, noise).map_err(|e| {
                        anyhow::anyhow!(
                            "its answer does not authenticate ({e}): the token's secret is not this network's"
                        )
                    });
                }
                _ => {}
            }
        }
    }
    bail!("no answer to {TRIES} handshakes in {} s", TRIES * ANSWER_WAIT.as_secs() as u32)
}
