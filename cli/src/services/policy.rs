//! The access policy on a running node: the file read and checked (`policy = FILE`),
//! compiled against the members this node knows, recompiled when they change, put in
//! force in the data path's connection table ([`weft_core::firewall::Firewall`]), and
//! explained (`weft policy explain`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use weft_core::firewall::{Active, Firewall};
use weft_core::policy::{Member, Policy, proto};

use crate::config::values::UsageError;

/// A policy file, read and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The file.
    pub path: PathBuf,
    /// A short hash of its text.
    pub version: String,
    /// The policy.
    pub policy: Policy,
    /// Its version when the authority signed it (then `path` is where it is kept).
    pub signed: Option<u64>,
}

impl Loaded {
    /// Reads and parses `path` (its tests run once members are known).
    pub fn read(path: &Path) -> Result<Self, UsageError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UsageError(format!("cannot read policy file {}: {e}", path.display())))?;
        let policy = Policy::parse(&text).map_err(|e| UsageError(format!("policy file {}: {e}", path.display())))?;
        Ok(Self { path: path.to_owned(), version: version(&text), policy, signed: None })
    }

    /// A policy signed by the authority (encoded), kept at `path`.
    pub fn signed(bytes: &[u8], path: &Path) -> Result<Self, String> {
        let sp = weft_core::policy::SignedPolicy::from_bytes(bytes).map_err(|e| format!("not a signed policy: {e}"))?;
        let policy = Policy::parse(&sp.text).map_err(|e| format!("signed policy version {}: {e}", sp.version))?;
        Ok(Self { path: path.to_owned(), version: sp.version.to_string(), policy, signed: Some(sp.version) })
    }

    /// Where it came from, in words.
    pub fn source(&self) -> String {
        match self.signed {
            Some(v) => format!("signed by the authority, version {v}"),
            None => self.path.display().to_string(),
        }
    }
}

/// The first 12 hex digits of the text's SHA-256.
fn version(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The policy in force on a node and what it was compiled against.
#[derive(Debug, Default)]
pub struct Enforced {
    /// The file's policy (none: everything passes).
    pub loaded: Option<Loaded>,
    /// The members it was last compiled against.
    pub members: Vec<Member>,
    /// Its tests when it was put in force: passed, skipped.
    pub tests: (usize, usize),
}

impl Enforced {
    /// Puts `loaded` in force against `members`, unless one of its tests fails (then
    /// what was in force stays, and the error says which test).
    pub fn apply(
        &mut self,
        fw: &Firewall,
        loaded: Option<Loaded>,
        members: Vec<Member>,
        overlay: &[(IpAddr, u8)],
    ) -> Result<(), String> {
        match &loaded {
            None => fw.set(None),
            Some(l) => {
                let tests = l
                    .policy
                    .check_known_tests(&members, overlay)
                    .map_err(|e| format!("policy ({}) refused: {e}", l.source()))?;
                fw.set(Some(Arc::new(Active::new(l.policy.compile(&members, overlay)))));
                self.tests = tests;
            }
        }
        self.loaded = loaded;
        self.members = members;
        Ok(())
    }

    /// Recompiles when the members changed (a new member, a moved address, new
    /// groups): the rules name members, the data path matches addresses.
    pub fn refresh(&mut self, fw: &Firewall, members: Vec<Member>, overlay: &[(IpAddr, u8)]) {
        let Some(l) = &self.loaded else { return };
        if members == self.members {
            return;
        }
        // Flows admitted by rules that still cover them stay (the table re-checks).
        let compiled = l.policy.compile(&members, overlay);
        let active = match fw.active() {
            Some(old) => Active::recompiled(compiled, &old),
            None => Active::new(compiled),
        };
        fw.set(Some(Arc::new(active)));
        if let Ok(t) = l.policy.check_known_tests(&members, overlay) {
            self.tests = t;
        } else {
            tracing::warn!(
                "a test of the access policy fails with the members as they are now: `weft policy explain` says why"
            );
        }
        self.members = members;
    }

    /// Which rule decides a flow from `from` to `to` (`NAME:PORT`) of `proto`.
    pub fn explain(&self, from: &str, to: &str, proto_name: &str, overlay: &[(IpAddr, u8)]) -> Result<String, String> {
        let Some(l) = &self.loaded else {
            return Ok("no access policy: every member reaches everything".into());
        };
        let p = match proto_name {
            "tcp" => proto::TCP,
            "udp" => proto::UDP,
            "icmp" => proto::ICMP,
            o => return Err(format!("--proto {o}: expected tcp, udp or icmp")),
        };
        let (name, port) = match to.rsplit_once(':') {
            Some((n, port)) if !n.contains(':') || n.starts_with('[') => {
                (n.trim_matches(['[', ']']), port.parse::<u16>().map_err(|_| format!("bad port in {to:?}"))?)
            }
            _ if p == proto::ICMP => (to, 0),
            _ => return Err(format!("{to:?}: say DST:PORT")),
        };
        let src = l
            .policy
            .addr_of(from, &self.members)
            .ok_or_else(|| format!("{from:?} is no member or address this node knows"))?;
        let dst = l
            .policy
            .addr_of(name, &self.members)
            .ok_or_else(|| format!("{name:?} is no member or address this node knows"))?;
        let c = l.policy.compile(&self.members, overlay);
        Ok(match c.allows(src, dst, p, port) {
            Some(r) => {
                let rule = &l.policy.rules[r];
                let list = |v: &[weft_core::policy::Selector]| {
                    v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                };
                format!(
                    "{from} ({src}) -> {name} ({dst}) {proto_name} {port}: allowed by rule {} (from [{}] to [{}], {}{})",
                    r + 1,
                    list(&rule.from),
                    list(&rule.to),
                    rule.proto,
                    if rule.ports.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " ports {}",
                            rule.ports
                                .iter()
                                .map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
                                .collect::<Vec<_>>()
                                .join(",")
                        )
                    }
                )
            }
            None => format!(
                "{from} ({src}) -> {name} ({dst}) {proto_name} {port}: denied (no rule allows it; policy {})",
                l.version
            ),
        })
    }
}

/// `weft policy check FILE`.
pub fn check(path: &Path) -> anyhow::Result<()> {
    let l = Loaded::read(path)?;
    let n = l.policy.check_tests(&[], &[]).map_err(|e| UsageError(format!("policy file {}: {e}", path.display())))?;
    for name in weft_core::policy::unresolved(&l.policy, &[]) {
        eprintln!(
            "note: {name} names no [hosts] entry: it resolves only on a running node (a member's host name, or a certificate group)"
        );
    }
    println!("{}: {} rule(s), {n} test(s) passed, version {}", path.display(), l.policy.rules.len(), l.version);
    Ok(())
}
