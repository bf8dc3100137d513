//! The authority's ledger: beside the key file (`auth.key.ledger`), one JSON line per
//! certificate `weft authority sign` issued (node key, host name, addresses, issue
//! time) and per node key `weft authority revoke` revoked. It binds each host name
//! and address to one key: signing one for another key is refused, unless that key
//! is revoked and the admin says `--replace`. Access policy resolves names through
//! certificates, so a name must never be signed to two live keys.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::values::UsageError;
use crate::daemon::state::hex;

/// One line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum Entry {
    /// A certificate was issued.
    Signed {
        /// The node key (64 hex digits).
        node: String,
        /// Its host name.
        name: String,
        /// Its IPv4 overlay address.
        ipv4: Ipv4Addr,
        /// Its IPv6 overlay address, when granted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ipv6: Option<Ipv6Addr>,
        /// When, unix seconds.
        issued: u64,
    },
    /// A node key was revoked.
    Revoked {
        /// The node key (64 hex digits).
        node: String,
        /// When, unix seconds.
        at: u64,
    },
}

/// The ledger of the authority key at `key`: its entries, oldest first.
pub(crate) struct Ledger {
    path: PathBuf,
    entries: Vec<Entry>,
}

/// What a new certificate asks for.
pub(crate) struct Ask<'a> {
    pub(crate) node: &'a [u8; 32],
    pub(crate) name: &'a str,
    pub(crate) ipv4: Ipv4Addr,
    pub(crate) ipv6: Option<Ipv6Addr>,
}

impl Ledger {
    /// The ledger beside authority key file `key` (empty when there is none yet: a
    /// key made before ledgers, or nothing signed).
    pub(crate) fn load(key: &Path) -> Result<Self> {
        let mut path = key.as_os_str().to_owned();
        path.push(".ledger");
        let path = PathBuf::from(path);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read the authority's ledger {}", path.display())),
        };
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let e: Entry = serde_json::from_str(line).map_err(|e| {
                UsageError(format!(
                    "{} line {}: not a ledger entry ({e}); fix or move the file (it binds names and addresses to keys)",
                    path.display(),
                    i + 1
                ))
            })?;
            entries.push(e);
        }
        Ok(Self { path, entries })
    }

    /// Why `ask` may not be signed: a name or address the ledger holds for another
    /// key. With `replace`, a holder the ledger records as revoked lets it go.
    pub(crate) fn refusal(&self, ask: &Ask<'_>, replace: bool) -> Option<String> {
        let me = hex(ask.node);
        let revoked = |n: &str| self.entries.iter().any(|e| matches!(e, Entry::Revoked { node, .. } if node == n));
        let mut held = Vec::new();
        for e in &self.entries {
            let Entry::Signed { node, name, ipv4, ipv6, .. } = e else { continue };
            if *node == me {
                continue;
            }
            let what = if name.eq_ignore_ascii_case(ask.name) {
                format!("host name {name:?}")
            } else if *ipv4 == ask.ipv4 {
                format!("address {ipv4}")
            } else if ipv6.is_some() && *ipv6 == ask.ipv6 {
                format!("address {}", ipv6.unwrap_or(Ipv6Addr::UNSPECIFIED))
            } else {
                continue;
            };
            if replace && revoked(node) {
                continue;
            }
            held.push((what, node.clone()));
        }
        let (what, node) = held.first()?;
        Some(if replace {
            format!(
                "{what} was signed for node {node}, which is not revoked: revoke it first (`weft authority revoke --key KEY {node}`, then `weft revoke add` on a member), then sign again with --replace"
            )
        } else if revoked(node) {
            format!(
                "{what} was signed for node {node} (revoked): give it to this key with --replace, or choose another"
            )
        } else {
            format!(
                "{what} was signed for node {node}: choose another, or move it to this key by revoking that one (`weft authority revoke --key KEY {node}`) and signing with --replace"
            )
        })
    }

    /// Appends `e` to the ledger file (mode 0600, made if missing).
    pub(crate) fn append(&mut self, e: Entry) -> Result<()> {
        let mut line = serde_json::to_string(&e).context("cannot encode a ledger entry")?;
        line.push('\n');
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .with_context(|| format!("cannot write the authority's ledger {}", self.path.display()))?;
        f.write_all(line.as_bytes())?;
        f.sync_all()?;
        self.entries.push(e);
        Ok(())
    }

    /// Whether node key `node` is recorded as revoked.
    pub(crate) fn is_revoked(&self, node: &[u8; 32]) -> bool {
        let n = hex(node);
        self.entries.iter().any(|e| matches!(e, Entry::Revoked { node, .. } if *node == n))
    }

    /// Where it is kept.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_or_address_moves_to_another_key_only_after_a_revocation_and_with_replace() {
        let dir = std::env::temp_dir().join(format!("weft-authority-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("auth.key");
        let mut l = Ledger::load(&key).unwrap();
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let ask = |node, name, ipv4| Ask { node, name, ipv4, ipv6: None };
        assert_eq!(l.refusal(&ask(&a, "alice", ip("10.0.0.1")), false), None);
        l.append(Entry::Signed { node: hex(&a), name: "alice".into(), ipv4: ip("10.0.0.1"), ipv6: None, issued: 1 })
            .unwrap();
        // Read back from the file: the same refusals.
        let mut l = Ledger::load(&key).unwrap();
        assert_eq!(l.refusal(&ask(&a, "alice", ip("10.0.0.9")), false), None, "the same key re-certified");
        let why = l.refusal(&ask(&b, "ALICE", ip("10.0.0.2")), false).unwrap();
        assert!(why.contains("host name \"alice\"") && why.contains(&hex(&a)), "{why}");
        assert!(l.refusal(&ask(&b, "bob", ip("10.0.0.1")), false).unwrap().contains("address 10.0.0.1"));
        let why = l.refusal(&ask(&b, "alice", ip("10.0.0.2")), true).unwrap();
        assert!(why.contains("not revoked"), "{why}");
        l.append(Entry::Revoked { node: hex(&a), at: 2 }).unwrap();
        let l = Ledger::load(&key).unwrap();
        assert!(l.is_revoked(&a));
        assert!(l.refusal(&ask(&b, "alice", ip("10.0.0.1")), false).unwrap().contains("--replace"));
        assert_eq!(l.refusal(&ask(&b, "alice", ip("10.0.0.1")), true), None);
        std::fs::write(l.path(), "{\"signed\":1}\n").unwrap();
        assert!(Ledger::load(&key).err().unwrap().to_string().contains("line 1: not a ledger entry"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
