//! `weft authority init|sign|revoke`, `weft id` and `weft cert show`: the local
//! commands of a network with an authority (no running node needed).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use weft_core::cert::{AuthorityKey, CertBody, Prefix, Revocation};

use crate::commands::ledger::{Ask, Entry, Ledger};
use crate::config::args::{AuthorityInviteArgs, AuthorityRevokeArgs, AuthoritySignArgs, CertShowArgs};
use crate::config::membership::read_cert;
use crate::config::values::PeerUri;
use crate::config::values::{IpNet, Ipv4Net, UsageError};
use crate::daemon::state::{KEY_HEADER, hex, load_key};
use rand::RngCore;
use weft_core::invite::{INVITE_PREFIX, InviteBody, Token};

/// `weft authority init --out FILE`.
pub(crate) fn init(out: &Path) -> Result<()> {
    let mut seed = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
        .map_err(|_| anyhow::anyhow!("the OS random generator failed"))?;
    let key = AuthorityKey::from_seed(seed);
    let mut f = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(out) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(UsageError(format!(
                "{} exists: refusing to overwrite an authority key (choose another --out)",
                out.display()
            ))
            .into());
        }
        Err(e) => return Err(e).with_context(|| format!("cannot write {}", out.display())),
    };
    f.write_all(format!("{KEY_HEADER}\ned25519 {}\n", hex(key.seed_bytes())).as_bytes())?;
    f.sync_all()?;
    println!("{}", key.id());
    eprintln!(
        "wrote the authority's private key to {} (keep it off the nodes); start every member with --authority {}",
        out.display(),
        key.id()
    );
    Ok(())
}

/// Parses a node id: 64 hex digits (the node's static public key).
pub(crate) fn parse_node_id(s: &str) -> Result<[u8; 32], UsageError> {
    unhex32(s.trim()).ok_or_else(|| {
        UsageError(format!(
            "invalid node id {s:?}: expected 64 hex digits, as `weft id` prints them (the 16-digit id in `weft status` is only its short form)"
        ))
    })
}

/// Parses a duration: a number and s, m, h, d or w.
pub(crate) fn parse_duration(s: &str) -> Result<u64, UsageError> {
    let bad =
        || UsageError(format!("invalid duration {s:?}: expected a number and s, m, h, d or w, such as 90d or 24h"));
    let s = s.trim();
    let unit = s.chars().last().ok_or_else(bad)?;
    let n: u64 = s[..s.len() - unit.len_utf8()].parse().map_err(|_| bad())?;
    let secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 7 * 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).filter(|d| *d > 0).ok_or_else(bad)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `weft authority sign`: builds the certificate from the flags and prints it.
pub(crate) fn sign(a: &AuthoritySignArgs) -> Result<()> {
    let key = load_key(&a.key)?;
    let node = parse_node_id(&a.node_id)?;
    if a.name.is_empty() || a.name.len() > 255 || a.name.chars().any(char::is_control) {
        return Err(
            UsageError(format!("invalid --name {:?}: 1 to 255 bytes without control characters", a.name)).into()
        );
    }
    let ipv4: Ipv4Net = a.ipv4.parse()?;
    let ipv6 = match &a.ipv6 {
        None => None,
        Some(s) => match IpNet::parse_cidr(s) {
            Some(IpNet { addr: std::net::IpAddr::V6(v6), prefix }) if prefix > 0 => Some((v6, prefix)),
            _ => {
                return Err(UsageError(format!("invalid --ipv6 {s:?}: expected ADDR/PREFIX such as fd00::5/64")).into());
            }
        },
    };
    let groups = parse_groups(&a.groups)?;
    let mut subnets = Vec::new();
    for s in &a.subnets {
        let n = IpNet::parse_cidr(s)
            .ok_or_else(|| UsageError(format!("invalid --subnet {s:?}: expected CIDR such as 192.168.1.0/24")))?
            .network();
        subnets.push(Prefix { addr: n.addr, len: n.prefix });
    }
    let now = now_unix();
    let body = CertBody {
        authority: key.id(),
        node,
        network: a.network_name.clone().unwrap_or_default(),
        name: a.name.clone(),
        ipv4: (ipv4.addr, ipv4.prefix),
        ipv6,
        groups,
        subnets,
        exit: a.exit,
        portal: a.portal,
        not_before: now,
        not_after: now.saturating_add(parse_duration(&a.expires)?),
        issued: Some(now),
        issuer: a.issuer,
    };
    // One key per host name and address: the ledger beside the key file says who
    // holds each.
    let mut ledger = Ledger::load(&a.key)?;
    let ask = Ask { node: &node, name: &a.name, ipv4: ipv4.addr, ipv6: ipv6.map(|(a, _)| a) };
    if let Some(why) = ledger.refusal(&ask, a.replace) {
        return Err(UsageError(format!("refusing to sign: {why}")).into());
    }
    let cert = body.sign(&key).map_err(|e| UsageError(format!("cannot issue this certificate: {e}")))?;
    ledger.append(Entry::Signed {
        node: hex(&node),
        name: a.name.clone(),
        ipv4: ipv4.addr,
        ipv6: ipv6.map(|(a, _)| a),
        issued: now,
    })?;
    eprintln!("{} is now bound to this node key in {}", a.name, ledger.path().display());
    println!("{}", cert.to_text());
    Ok(())
}

/// Groups given as flags: trimmed, checked, without repeats.
pub(crate) fn parse_groups(given: &[String]) -> Result<Vec<String>, UsageError> {
    let mut groups = Vec::new();
    for g in given.iter().map(|g| g.trim()).filter(|g| !g.is_empty()) {
        if g.len() > 64 || !g.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
            return Err(UsageError(format!("invalid group {g:?}: 1 to 64 letters, digits, '-', '_' or '.'")));
        }
        if !groups.iter().any(|x: &String| x == g) {
            groups.push(g.to_owned());
        }
    }
    Ok(groups)
}

/// `weft authority revoke`: a node id, or an invite (`--invite TOKEN|ID`).
pub(crate) fn revoke(a: &AuthorityRevokeArgs) -> Result<()> {
    let key = load_key(&a.key)?;
    let subject = match (&a.node_id, &a.invite) {
        (_, Some(inv)) => match Token::from_text(inv) {
            Ok(t) => t.invite.body().id,
            Err(_) if !inv.trim_start().starts_with(INVITE_PREFIX) => parse_node_id(inv).map_err(|_| {
                UsageError(format!("invalid --invite {inv:?}: expected the token (weft-invite:...) or its 64-hex id"))
            })?,
            Err(e) => return Err(UsageError(format!("invalid --invite token: {e}")).into()),
        },
        (Some(id), None) => parse_node_id(id)?,
        (None, None) => return Err(UsageError("name the NODE-ID to revoke, or --invite".into()).into()),
    };
    let revocation = revocation(&key, &a.key, subject, a.invite.is_none())?;
    println!("{}", revocation.to_text());
    Ok(())
}

/// Signs the revocation of `subject` (a node key, or an invite's id when `node` is
/// false) with `key`, whose file is `key_path`; a node key's revocation is written to
/// the ledger beside it, which frees its names and addresses for `sign --replace`.
/// `weft authority revoke` and the web console both revoke through here.
pub(crate) fn revocation(key: &AuthorityKey, key_path: &Path, subject: [u8; 32], node: bool) -> Result<Revocation> {
    let revocation = Revocation::issue(key, subject, now_unix());
    if node {
        let mut ledger = Ledger::load(key_path)?;
        if !ledger.is_revoked(&subject) {
            ledger.append(Entry::Revoked { node: hex(&subject), at: revocation.issued })?;
        }
    }
    Ok(revocation)
}

/// `weft authority invite`: signs an invite and prints the token.
pub(crate) fn invite(a: &AuthorityInviteArgs) -> Result<()> {
    let key = load_key(&a.key)?;
    let spec = InviteSpec {
        network: &a.network_name,
        secret: &a.network_secret.0,
        peers: &a.peers,
        groups: &a.groups,
        expires: &a.expires,
        uses: a.uses,
        cert_expires: &a.cert_expires,
    };
    let made = make_invite(&key, &spec)?;
    eprintln!(
        "invite {} for network {:?}: {}, expires {}; it carries the network secret, so hand it over as you would the secret",
        made.id,
        a.network_name,
        uses_text(a.uses),
        utc(made.expires),
    );
    println!("{}", made.token);
    Ok(())
}

/// What an invite is made of, as the flags (or the web console's form) give it.
pub(crate) struct InviteSpec<'a> {
    /// The network it joins.
    pub(crate) network: &'a str,
    /// The network's secret, carried in the token.
    pub(crate) secret: &'a str,
    /// Entry points: members' udp:// URIs.
    pub(crate) peers: &'a [String],
    /// Groups the issued certificates carry.
    pub(crate) groups: &'a [String],
    /// How long it may be used (`24h`).
    pub(crate) expires: &'a str,
    /// How many machines may join with it (0: any number).
    pub(crate) uses: u32,
    /// How long the certificates issued for it are valid (`365d`).
    pub(crate) cert_expires: &'a str,
}

/// A signed invite.
pub(crate) struct MadeInvite {
    /// The one-line token (`weft-invite:...`).
    pub(crate) token: String,
    /// Its id, 64 hex digits (what `weft authority revoke --invite` takes).
    pub(crate) id: String,
    /// Until when it may be used, unix seconds.
    pub(crate) expires: u64,
    /// The groups it grants, checked.
    pub(crate) groups: Vec<String>,
}

/// Checks `spec` and signs the invite with `key` (`weft authority invite` and the web
/// console).
pub(crate) fn make_invite(key: &AuthorityKey, spec: &InviteSpec<'_>) -> Result<MadeInvite> {
    if spec.network.is_empty() || spec.network.len() > 64 {
        return Err(UsageError(format!("invalid --network-name {:?}: 1 to 64 bytes", spec.network)).into());
    }
    if spec.secret.is_empty() {
        return Err(UsageError("invalid network secret: it is empty".into()).into());
    }
    if spec.peers.is_empty() {
        return Err(UsageError("an invite needs at least one entry point (a member's udp:// URI)".into()).into());
    }
    let mut entry_points = Vec::new();
    for p in spec.peers {
        let uri: PeerUri = p.parse()?;
        if uri.proto != weft_datapath::transport::Proto::Udp {
            return Err(UsageError(format!(
                "--peer {p}: a new machine joins over udp; give a member's udp:// address (it may use other transports once it is a member)"
            ))
            .into());
        }
        entry_points.push(uri.to_string());
    }
    let lifetime = parse_duration(spec.cert_expires)?;
    let lifetime = u32::try_from(lifetime)
        .map_err(|_| UsageError(format!("--cert-expires {}: at most about 136 years", spec.cert_expires)))?;
    let mut id = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut id);
    let groups = parse_groups(spec.groups)?;
    let body = InviteBody {
        authority: key.id(),
        id,
        expires: now_unix().saturating_add(parse_duration(spec.expires)?),
        uses: spec.uses,
        lifetime,
        network: spec.network.to_owned(),
        groups: groups.clone(),
    };
    let invite = body.sign(key).map_err(|e| UsageError(format!("cannot make this invite: {e}")))?;
    let expires = invite.body().expires;
    let token = Token { secret: spec.secret.to_owned(), entry_points, invite };
    let text = token.to_text().map_err(|e| UsageError(format!("cannot make this invite: {e}")))?;
    Ok(MadeInvite { token: text, id: hex(&id), expires, groups })
}

/// An invite's uses in words.
pub(crate) fn uses_text(uses: u32) -> String {
    if uses == 0 { "any number of uses".to_owned() } else { format!("{uses} use(s)") }
}

/// `weft authority sign-policy`: checks the policy (its tests, through its `[hosts]`)
/// and prints it signed.
pub(crate) fn sign_policy(a: &crate::config::args::AuthoritySignPolicyArgs) -> Result<()> {
    let key = load_key(&a.key)?;
    let text = std::fs::read_to_string(&a.file)
        .map_err(|e| UsageError(format!("cannot read policy file {}: {e}", a.file.display())))?;
    let signed = signed_policy(&key, &a.network_name, a.policy_version, &text)
        .map_err(|e| UsageError(format!("policy file {}: {}", a.file.display(), e.0)))?;
    eprintln!("{}", signed.summary);
    println!("{}", signed.policy.to_text());
    Ok(())
}

/// A policy checked and signed.
pub(crate) struct Signed {
    /// The signed policy.
    pub(crate) policy: weft_core::policy::SignedPolicy,
    /// What was signed, in words: version, rules, tests.
    pub(crate) summary: String,
}

/// Checks policy `text` (its tests, through its `[hosts]`) and signs it for `network`
/// as `version` (default: now): `weft authority sign-policy` and the web console.
pub(crate) fn signed_policy(
    key: &AuthorityKey,
    network: &str,
    version: Option<u64>,
    text: &str,
) -> Result<Signed, UsageError> {
    let policy = weft_core::policy::Policy::parse(text).map_err(|e| UsageError(e.to_string()))?;
    let (passed, skipped) = policy.check_known_tests(&[], &[]).map_err(|e| UsageError(e.to_string()))?;
    let version = version.unwrap_or_else(now_unix);
    let signed = weft_core::policy::SignedPolicy::sign(key, network, version, text)
        .map_err(|e| UsageError(format!("cannot sign it: {e}")))?;
    let summary = format!(
        "policy version {version} for network {network:?}: {} rule(s), {passed} test(s) passed{}",
        policy.rules.len(),
        if skipped > 0 {
            format!(", {skipped} left to the members (they name hosts the file does not)")
        } else {
            String::new()
        }
    );
    Ok(Signed { policy: signed, summary })
}

/// `weft id`: the node key's public half, made if missing.
pub(crate) fn id(state_dir: Option<&Path>) -> Result<()> {
    let dir = state_dir.map_or_else(crate::config::args::default_state_dir, Path::to_path_buf);
    let key = crate::daemon::state::load_or_create_key(&dir)?;
    println!("{}", hex(&key.public));
    Ok(())
}

/// A revocation given as text or as a file holding it, checked to parse.
pub(crate) fn read_revocation(arg: &str) -> Result<String> {
    let text = if arg.trim_start().starts_with(weft_core::cert::REVOCATION_PREFIX) {
        arg.to_owned()
    } else {
        std::fs::read_to_string(arg).map_err(|e| {
            UsageError(format!(
                "{arg:?} is neither a revocation (weft-revocation:...) nor a file that can be read: {e}"
            ))
        })?
    };
    Revocation::from_text(&text).map_err(|e| UsageError(format!("invalid revocation: {e}")))?;
    Ok(text.trim().to_owned())
}

/// `weft cert show`.
pub(crate) fn show(a: &CertShowArgs) -> Result<()> {
    let cert = read_cert(&a.cert)?;
    let b = cert.body();
    let signed = cert.signed_by_its_authority();
    let now = now_unix();
    let state = if !signed {
        "BAD SIGNATURE"
    } else if now < b.not_before {
        "not valid yet"
    } else if now >= b.not_after {
        "expired"
    } else {
        "valid"
    };
    let subnets: Vec<String> = b.subnets.iter().map(ToString::to_string).collect();
    if a.json {
        let v = serde_json::json!({
            "node_id": hex(&b.node),
            "short_id": weft_peers::NodeId::from_public(&b.node).to_string(),
            "name": b.name,
            "network": (!b.network.is_empty()).then_some(&b.network),
            "ipv4": format!("{}/{}", b.ipv4.0, b.ipv4.1),
            "ipv6": b.ipv6.map(|(a, p)| format!("{a}/{p}")),
            "groups": b.groups,
            "subnets": subnets,
            "exit": b.exit,
            "portal": b.portal,
            "not_before": b.not_before,
            "not_after": b.not_after,
            "issued": cert.issued(),
            "issuer": b.issuer,
            "authority": b.authority.to_string(),
            "state": state.to_lowercase().replace(' ', "_"),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let printable = |s: &str| crate::commands::show::printable(s).into_owned();
        let none = || "none".to_owned();
        println!("certificate of {} ({state})", printable(&b.name));
        println!("  node id     {} (short {})", hex(&b.node), weft_peers::NodeId::from_public(&b.node));
        println!(
            "  network     {}",
            if b.network.is_empty() { "any that trusts this authority".to_owned() } else { printable(&b.network) }
        );
        println!("  ipv4        {}/{}", b.ipv4.0, b.ipv4.1);
        println!("  ipv6        {}", b.ipv6.map_or_else(none, |(a, p)| format!("{a}/{p}")));
        println!("  groups      {}", if b.groups.is_empty() { none() } else { printable(&b.groups.join(", ")) });
        println!("  subnets     {}", if subnets.is_empty() { none() } else { subnets.join(", ") });
        println!("  exit node   {}", if b.exit { "may offer" } else { "no" });
        println!("  wg portal   {}", if b.portal { "may run" } else { "no" });
        println!("  valid       {} to {}", utc(b.not_before), utc(b.not_after));
        println!(
            "  issued      {}{}",
            utc(cert.issued()),
            if b.issued.is_none() { " (format 1: its start of validity)" } else { "" }
        );
        println!("  issuer      {}", if b.issuer { "may issue to machines with an invite" } else { "no" });
        println!("  authority   {}", b.authority);
    }
    if !signed {
        return Err(
            UsageError("the certificate's signature does not verify under the authority it names".into()).into()
        );
    }
    Ok(())
}

/// Unix seconds as `YYYY-MM-DD HH:MM UTC` (the proleptic Gregorian calendar, from
/// the count of days: Howard Hinnant's `civil_from_days`).
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02} UTC")
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    crate::daemon::state::unhex(s).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_node_ids_parse_or_say_why() {
        assert_eq!(parse_duration("90d").unwrap(), 90 * 86_400);
        assert_eq!(parse_duration("24h").unwrap(), 86_400);
        assert_eq!(parse_duration("2w").unwrap(), 14 * 86_400);
        for bad in ["", "d", "10", "10y", "-1d", "0s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_node_id(&"ab".repeat(32)).unwrap(), [0xab; 32]);
        let e = parse_node_id("e361616bc623cf03").unwrap_err().0;
        assert!(e.contains("short form"), "{e}");
        assert!(parse_node_id(&"zz".repeat(32)).is_err());
        assert!(parse_node_id(&format!("{}éa", "a".repeat(61))).is_err(), "non-ASCII: an error, not a panic");
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(1_800_000_000), "2027-01-15 08:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
    }

    #[test]
    fn an_authority_key_file_is_private_versioned_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weft-authority-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("auth.key");
        init(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let key = load_key(&path).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().starts_with("weft-authority-key 1\ned25519 "));
        // A second init must not replace the key every member trusts.
        let e = init(&path).unwrap_err().to_string();
        assert!(e.contains("refusing to overwrite"), "{e}");
        assert_eq!(load_key(&path).unwrap().id(), key.id());
        std::fs::write(&path, "weft-authority-key 2\nsomething\n").unwrap();
        assert!(format!("{:#}", load_key(&path).unwrap_err()).contains("newer than this weft reads"));
        std::fs::write(&path, "hello\n").unwrap();
        assert!(format!("{:#}", load_key(&path).unwrap_err()).contains("not an authority key"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
