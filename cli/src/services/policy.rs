//! The access policy on a running node: the file read and checked (`policy = FILE`),
//! compiled against the members this node knows, recompiled when they change, put in
//! force in the data path's connection table ([`weft_core::firewall::Firewall`]), and
//! explained (`weft policy explain`).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use weft_core::firewall::{Active, Firewall};
use weft_core::policy::{Member, proto};

use crate::config::values::UsageError;

use crate::config::policy::Loaded;

/// The policy in force on a node and what it was compiled against.
#[derive(Debug, Default)]
pub struct Enforced {
    /// The file's policy (none: everything passes).
    pub loaded: Option<Loaded>,
    /// The members it was last compiled against.
    pub members: Vec<Member>,
    /// Its tests when it was put in force: passed, skipped.
    pub tests: (usize, usize),
    /// Why the policy the authority signed for this network could not be applied
    /// here: the node then denies every flow but its own (fails closed).
    pub refused: Option<String>,
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
        self.refused = None;
        self.loaded = loaded;
        self.members = members;
        Ok(())
    }

    /// A policy signed for this network that cannot be applied here: deny every flow
    /// but this node's own (and their answers) until one that can arrives.
    pub fn fail_closed(&mut self, fw: &Firewall, why: String) {
        fw.set(Some(Arc::new(Active::new(weft_core::policy::Compiled::default()))));
        self.loaded = None;
        self.tests = (0, 0);
        self.refused = Some(why);
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
        if let Some(why) = &self.refused {
            return Ok(format!("denied: {why}; every flow but this node's own is denied"));
        }
        let Some(l) = &self.loaded else {
            return Ok("no access policy: every member reaches everything".into());
        };
        explain_flow(&l.policy, &format!("policy {}", l.version), &self.members, overlay, (from, to, proto_name))
    }
}

/// Which rule of `policy` (named `what` in the answer) decides a flow (`from`, `to` as
/// `NAME:PORT`, protocol name) between `members`: the answer of `weft policy
/// explain`, and of the web console for the policy in force or a draft.
pub fn explain_flow(
    policy: &weft_core::policy::Policy,
    what: &str,
    members: &[Member],
    overlay: &[(IpAddr, u8)],
    (from, to, proto_name): (&str, &str, &str),
) -> Result<String, String> {
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
    let src =
        policy.addr_of(from, members).ok_or_else(|| format!("{from:?} is no member or address this node knows"))?;
    let dst =
        policy.addr_of(name, members).ok_or_else(|| format!("{name:?} is no member or address this node knows"))?;
    let c = policy.compile(members, overlay);
    Ok(match c.allows(src, dst, p, port) {
        Some(r) => format!(
            "{from} ({src}) -> {name} ({dst}) {proto_name} {port}: allowed by rule {} ({})",
            r + 1,
            describe(&policy.rules[r])
        ),
        None => format!("{from} ({src}) -> {name} ({dst}) {proto_name} {port}: denied (no rule allows it; {what})"),
    })
}

/// A rule in words: `from [a, b] to [c], tcp ports 22,80-81`.
pub fn describe(rule: &weft_core::policy::Rule) -> String {
    let list = |v: &[weft_core::policy::Selector]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let ports = if rule.ports.is_empty() {
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
    };
    format!("from [{}] to [{}], {}{ports}", list(&rule.from), list(&rule.to), rule.proto)
}

/// `weft policy check FILE`.
pub fn check(path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("cannot read policy file {}: {e}", path.display())))?;
    let c = check_text(&text).map_err(|e| UsageError(format!("policy file {}: {e}", path.display())))?;
    for name in &c.unresolved {
        eprintln!(
            "note: {name} names no [hosts] entry: it resolves only on a running node (a member's host name, or a certificate group)"
        );
    }
    println!("{}: {} rule(s), {} test(s) passed, version {}", path.display(), c.rules, c.tests, c.version);
    Ok(())
}

/// What `weft policy check` found in a policy that passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// Its rules.
    pub rules: usize,
    /// Its tests, all passed.
    pub tests: usize,
    /// Names it uses that no `[hosts]` entry gives: they resolve on a running node.
    pub unresolved: Vec<String>,
    /// A short hash of the text.
    pub version: String,
}

/// Parses policy `text` and runs its tests, names resolving through its `[hosts]`
/// (`weft policy check` and the web console's editor): the first problem, or what it holds.
pub fn check_text(text: &str) -> Result<Checked, String> {
    let policy = weft_core::policy::Policy::parse(text).map_err(|e| e.to_string())?;
    let tests = policy.check_tests(&[], &[]).map_err(|e| e.to_string())?;
    let unresolved = weft_core::policy::unresolved(&policy, &[]);
    Ok(Checked { rules: policy.rules.len(), tests, unresolved, version: crate::config::policy::version(text) })
}
