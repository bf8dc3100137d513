//! The portal's clients on disk (`wg-portal.json`, mode 0600, format 1): the portal's key
//! and each client's name, public key, preshared key and address, checked against the
//! portal network when read; and the addresses a new client may get.

use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};
use tracing::info;
use weft_core::route::prefix_mask;

use crate::config::values::Ipv4Net;

/// The file of the portal's key and clients, in the state directory.
pub(crate) const STORE_FILE: &str = "wg-portal.json";

/// Longest client name.
pub(super) const MAX_NAME: usize = 32;

/// The format of `wg-portal.json` this build writes and the newest it reads. 0.1.0
/// wrote no `format` field: such a file is format 1.
pub(super) const STORE_FORMAT: u32 = 1;

pub(super) fn store_format_1() -> u32 {
    1
}

/// What is kept on disk.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Store {
    /// The file's format ([`STORE_FORMAT`]; absent in files of 0.1.0).
    #[serde(default = "store_format_1")]
    pub(super) format: u32,
    /// The portal's X25519 private key, base64.
    pub(super) private_key: String,
    pub(super) clients: Vec<StoredClient>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredClient {
    pub(super) name: String,
    /// X25519 public key, base64 (as `wg` shows it).
    pub(super) public_key: String,
    /// Preshared key, base64.
    pub(super) preshared_key: String,
    pub(super) address: Ipv4Addr,
}

/// A client name: 1 to 32 of `A-Z a-z 0-9 . _ -`.
pub(super) fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(ok_char) {
        return Err(format!(
            "invalid client name {name:?}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-' (e.g. alice-phone)"
        ));
    }
    Ok(())
}

pub(super) fn random32() -> Result<[u8; 32]> {
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut b).map_err(|_| anyhow::anyhow!("the OS random generator failed"))?;
    Ok(b)
}

pub(super) fn key32(text: &str, what: &str) -> Result<[u8; 32]> {
    let v = B64.decode(text.trim()).with_context(|| format!("{what} is not base64"))?;
    v.try_into().map_err(|_| anyhow::anyhow!("{what} is not 32 bytes"))
}

impl Store {
    /// Reads the store, or makes a new portal key when there is none. Every client
    /// must be valid for the portal network `net`: a name, keys, and an address of its
    /// own inside the network (not the network, portal or broadcast address).
    pub(super) fn load_or_create(path: &Path, net: Ipv4Net) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                crate::config::values::check_private(path, "WireGuard portal file", "holds private keys and")?;
                let s: Self = serde_json::from_str(&text)
                    .with_context(|| format!("corrupt WireGuard portal file {}", path.display()))?;
                if s.format > STORE_FORMAT {
                    anyhow::bail!(
                        "WireGuard portal file {} has format {}, written by a newer weft; this build reads format {STORE_FORMAT} and older (upgrade weft, or restore the file's backup)",
                        path.display(),
                        s.format
                    );
                }
                key32(&s.private_key, "the portal's private key")
                    .with_context(|| format!("corrupt WireGuard portal file {}", path.display()))?;
                s.check(net).map_err(|e| {
                    anyhow::anyhow!("WireGuard portal file {}: {e} (fix or remove that client)", path.display())
                })?;
                Ok(s)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let s = Self { format: STORE_FORMAT, private_key: B64.encode(random32()?), clients: Vec::new() };
                s.save(path)?;
                info!(path = %path.display(), "created the WireGuard portal key");
                Ok(s)
            }
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    pub(super) fn check(&self, net: Ipv4Net) -> Result<(), String> {
        let mut names = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        let mut addrs = std::collections::HashSet::new();
        let hosts = free_hosts(net);
        for c in &self.clients {
            check_name(&c.name)?;
            let key = key32(&c.public_key, "public key").map_err(|e| format!("client {:?}: {e}", c.name))?;
            key32(&c.preshared_key, "preshared key").map_err(|e| format!("client {:?}: {e}", c.name))?;
            if !hosts.contains(&c.address) {
                return Err(format!(
                    "client {:?} has address {}, which is not a client address of --wg-portal-net {net}",
                    c.name, c.address
                ));
            }
            if !names.insert(c.name.as_str()) || !keys.insert(key) || !addrs.insert(c.address) {
                return Err(format!("client {:?} repeats a name, key or address of another client", c.name));
            }
        }
        Ok(())
    }

    /// Writes the store (mode 0600) through a temporary file and a rename, so that a
    /// crash never leaves half a file.
    pub(super) fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(serde_json::to_string_pretty(self)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }
}

/// The client addresses of `net`: every host after the portal's own (.0 is the
/// network, .1 the portal, the last the broadcast address).
pub(super) fn free_hosts(net: Ipv4Net) -> std::ops::RangeInclusive<Ipv4Addr> {
    let base = u32::from(net.addr);
    let last = base | !prefix_mask(net.prefix);
    Ipv4Addr::from(base + 2)..=Ipv4Addr::from(last - 1)
}

/// The lowest client address of `net` that is not taken.
pub(super) fn free_address(net: Ipv4Net, taken: &[Ipv4Addr]) -> Option<Ipv4Addr> {
    let r = free_hosts(net);
    (u32::from(*r.start())..=u32::from(*r.end())).map(Ipv4Addr::from).find(|a| !taken.contains(a))
}
