//! `policy = FILE`: the access policy file, read and parsed (its tests run once the
//! members are known, in `services::policy`), or a policy the authority signed.

use std::path::{Path, PathBuf};

use weft_core::policy::Policy;

use super::values::UsageError;

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
pub(crate) fn version(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref()[..6].iter().map(|b| format!("{b:02x}")).collect()
}
