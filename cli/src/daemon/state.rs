//! The state directory: the node's static key, created on first start (mode 0600),
//! and the self-signed TLS certificate of wss:// and quic:// listeners. Every start
//! checks that the private keys are still private (no group or other access) and
//! refuses them otherwise, naming the `chmod` that fixes it.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};
use weft_core::cert::Revocation;
use weft_core::handshake::StaticKey;
use weft_datapath::transport::conn::TlsIdentity;

use crate::config::values::UsageError;

const KEY_FILE: &str = "node.key";
/// Host names bound to the member that held each first, and the exit pin.
const NAMES_FILE: &str = "names.json";
/// Format of [`NAMES_FILE`]; a newer node reads every older one.
const NAMES_VERSION: u32 = 1;
const TLS_CERT_FILE: &str = "tls-cert.pem";
const TLS_KEY_FILE: &str = "tls-key.pem";

/// The TLS identity of wss:// and quic:// listeners: `given` (`--tls-cert`,
/// `--tls-key`), else a self-signed pair kept in `dir`, made on first use. Peers do
/// not check it (the Noise handshake authenticates them), so self-signed is fine.
pub fn load_or_create_tls(dir: &Path, given: Option<&(std::path::PathBuf, std::path::PathBuf)>) -> Result<TlsIdentity> {
    let (cert, key) = match given {
        Some((c, k)) => (c.clone(), k.clone()),
        None => {
            let (c, k) = (dir.join(TLS_CERT_FILE), dir.join(TLS_KEY_FILE));
            if !c.exists() || !k.exists() {
                let cert = rcgen::generate_simple_self_signed(vec!["weft".to_owned()])
                    .context("cannot generate a TLS certificate")?;
                write_private(&k, cert.signing_key.serialize_pem().as_bytes())?;
                fs::write(&c, cert.cert.pem()).with_context(|| format!("cannot write {}", c.display()))?;
                info!(path = %c.display(), "created self-signed TLS certificate for wss:// and quic://");
            }
            (c, k)
        }
    };
    let bad = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        UsageError(format!("cannot use TLS {what} {}: {e}", p.display()))
    };
    let chain = CertificateDer::pem_file_iter(&cert)
        .map_err(|e| bad("certificate", &cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("certificate", &cert, &e))?;
    if chain.is_empty() {
        return Err(bad("certificate", &cert, &"no CERTIFICATE block in the file").into());
    }
    crate::config::values::check_private(&key, "TLS key", "")?;
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| bad("key", &key, &e))?;
    Ok(TlsIdentity { chain, key })
}

pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Loads the node key from `dir`, creating the directory and the key if needed.
///
/// The file's first word names its format. Format 1, `ed25519 <hex>` (since 0.1.0),
/// holds the node's Ed25519 seed; the Noise X25519 key derives from it. Format 0 (two
/// hex lines: an X25519 pair, which cannot sign the node's records) is replaced by a
/// new key: the node id changes once. A first word this build does not know is a
/// format from a newer weft: an error that says so and keeps the file (it is the
/// node's identity), never "corrupt".
pub fn load_or_create_key(dir: &Path) -> Result<StaticKey> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create state directory {}", dir.display()))?;
    let path = dir.join(KEY_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            // A key others could read may be known to them: say so rather than quietly
            // tightening the mode.
            crate::config::values::check_private(&path, "node key", "")?;
            match parse_key(&text) {
                Ok(Some(key)) => Ok(key),
                Ok(None) => {
                    let key = StaticKey::generate().context("cannot generate node key")?;
                    write_private(&path, key_file(&key).as_bytes())?;
                    warn!(
                        path = %path.display(),
                        node = %weft_peers::NodeId::from_public(&key.public),
                        "node key was of the old format (X25519 only, cannot sign records): replaced by a new \
                         Ed25519 identity; this node's id changes once"
                    );
                    Ok(key)
                }
                Err(KeyFileError::Newer(word)) => bail!(
                    "node key {} is of a format this weft does not read (it begins {word:?}): a newer weft wrote it; \
                     run that release or a later one (keep the file: it is this node's identity)",
                    path.display()
                ),
                Err(KeyFileError::Corrupt(e)) => Err(e)
                    .with_context(|| format!("corrupt node key {} (delete it to make a new identity)", path.display())),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = StaticKey::generate().context("cannot generate node key")?;
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("cannot write node key {}", path.display()))?;
            f.write_all(key_file(&key).as_bytes())?;
            f.sync_all()?;
            info!(path = %path.display(), "created node key");
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read node key {}", path.display())),
    }
}

const KEY_TAG: &str = "ed25519 ";

fn key_file(key: &StaticKey) -> String {
    format!("{KEY_TAG}{}\n", hex(key.seed_bytes()))
}

/// Why a key file could not be read.
#[derive(Debug)]
enum KeyFileError {
    /// A format named by a word this build does not know (a newer weft's).
    Newer(String),
    Corrupt(anyhow::Error),
}

/// The key in a key file; `None` for format 0 (two hex lines: an X25519 pair).
fn parse_key(text: &str) -> Result<Option<StaticKey>, KeyFileError> {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim();
    if let Some(seed) = first.strip_prefix(KEY_TAG) {
        let seed: [u8; 32] = unhex(seed.trim())
            .and_then(|b| b.try_into().map_err(|_| anyhow::anyhow!("expected a 32-byte seed")))
            .map_err(KeyFileError::Corrupt)?;
        return Ok(Some(StaticKey::from_seed(seed)));
    }
    let second = lines.next().unwrap_or("").trim();
    match (unhex(first), unhex(second)) {
        (Ok(a), Ok(b)) if a.len() == 32 && b.len() == 32 => Ok(None),
        _ => {
            // A format word (letters, digits, `-`, `/`, `.`, beginning with a letter)
            // followed by its data: written by a newer weft.
            let word = first.split_whitespace().next().unwrap_or("");
            let is_word = word.len() <= 32
                && word.starts_with(|c: char| c.is_ascii_alphabetic())
                && word.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '/' | '.' | '_'));
            if is_word && first.len() > word.len() && unhex(word).is_err() {
                Err(KeyFileError::Newer(word.to_owned()))
            } else {
                Err(KeyFileError::Corrupt(anyhow::anyhow!("expected \"{}<64 hex digits>\"", KEY_TAG)))
            }
        }
    }
}

/// First line of an authority key file: its format.
pub(crate) const KEY_HEADER: &str = "weft-authority-key 1";

/// Reads an authority key file (refusing one that others may read).
pub(crate) fn load_key(path: &Path) -> Result<weft_core::cert::AuthorityKey> {
    let text = fs::read_to_string(path)
        .map_err(|e| UsageError(format!("cannot read the authority key {}: {e}", path.display())))?;
    crate::config::values::check_private(path, "authority key", "")?;
    let mut lines = text.lines().map(str::trim);
    let bad = |why: &str| UsageError(format!("{} is not an authority key ({why})", path.display()));
    match lines.next() {
        Some(KEY_HEADER) => {}
        Some(h) if h.starts_with("weft-authority-key ") => {
            return Err(bad(&format!("format {:?}, newer than this weft reads: upgrade weft", &h[19..])).into());
        }
        _ => return Err(bad(&format!("its first line is not {KEY_HEADER:?}")).into()),
    }
    let seed = lines
        .next()
        .and_then(|l| l.strip_prefix("ed25519 "))
        .and_then(|h| unhex(h.trim()).ok()?.try_into().ok())
        .ok_or_else(|| bad("expected \"ed25519 <64 hex digits>\" on its second line"))?;
    Ok(weft_core::cert::AuthorityKey::from_seed(seed))
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Result<Vec<u8>> {
    if !s.is_ascii() || !s.len().is_multiple_of(2) {
        bail!("odd hex length");
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).context("bad hex")).collect()
}

/// Makes sure `dir` is this user's own private directory: created here with mode
/// 0700 if missing, else it must be a real directory (not a link) owned by this user
/// and closed to group and others. In a shared directory such as `/tmp` another user
/// could have created the name first to read or replace the node's socket and state.
pub fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    let m = fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let me = crate::control::access::own_uid();
    if !m.file_type().is_dir() {
        bail!("{} is not a directory (a link or a file someone else put there): refusing to use it", dir.display());
    }
    if m.uid() != me {
        bail!(
            "{} belongs to uid {}, not to this user ({me}): another user may have created it to take over this \
             node's control socket; remove it or set XDG_RUNTIME_DIR",
            dir.display(),
            m.uid()
        );
    }
    if m.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} is open to other users (mode {:o}): chmod 700 it, or remove it",
            dir.display(),
            m.permissions().mode() & 0o777
        );
    }
    Ok(())
}

/// [`NAMES_FILE`] on disk.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct NamesFile {
    version: u32,
    /// Lower-case host name → node id (16 hex digits).
    names: std::collections::BTreeMap<String, String>,
    /// `--use-exit-node`'s value and the node id it was pinned to.
    exit_pin: Option<(String, String)>,
    /// Proxied prefix (`ADDR/LEN`) → the node id seen announcing it first (a network
    /// without an authority). Absent before 0.3: older releases ignore it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    subnets: std::collections::BTreeMap<String, String>,
}

/// Reads the name bindings and exit pin kept in `dir` (none before the first save).
/// A file from a newer format, or one that does not parse, is an error that names it:
/// quietly starting afresh would hand every name to whoever claims it next.
pub fn load_names(dir: &Path) -> Result<weft_peers::Names> {
    let path = dir.join(NAMES_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(weft_peers::Names::default()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let fix = "(move it away to bind names afresh)";
    let f: NamesFile =
        serde_json::from_str(&text).with_context(|| format!("corrupt name bindings {} {fix}", path.display()))?;
    if f.version > NAMES_VERSION {
        bail!("{} has format {} (this weft reads up to {NAMES_VERSION}) {fix}", path.display(), f.version);
    }
    let id = |s: &str| {
        s.parse::<weft_peers::NodeId>()
            .map_err(|e| anyhow::anyhow!("corrupt name bindings {}: {e} {fix}", path.display()))
    };
    let mut names = Vec::new();
    for (n, i) in &f.names {
        names.push((n.clone(), id(i)?));
    }
    let pin = match &f.exit_pin {
        Some((w, i)) => Some((w.clone(), id(i)?)),
        None => None,
    };
    let mut subnets = Vec::new();
    for (net, i) in &f.subnets {
        let parsed = net.split_once('/').and_then(|(a, p)| Some((a.parse().ok()?, p.parse().ok()?)));
        let Some(prefix) = parsed else {
            bail!("corrupt name bindings {}: {net:?} is not a prefix {fix}", path.display());
        };
        subnets.push((prefix, id(i)?));
    }
    Ok(weft_peers::Names::new(names, pin).with_subnets(subnets))
}

/// Keeps the name bindings and exit pin in `dir` (written whole, then renamed over the
/// old file, so a crash leaves one or the other).
pub fn save_names(dir: &Path, names: &weft_peers::Names) -> Result<()> {
    let f = NamesFile {
        version: NAMES_VERSION,
        names: names.bindings().map(|(n, id)| (n.to_owned(), id.to_string())).collect(),
        exit_pin: names.exit_pin_entry().map(|(w, id)| (w.to_owned(), id.to_string())),
        subnets: names.subnet_bindings().map(|((a, p), id)| (format!("{a}/{p}"), id.to_string())).collect(),
    };
    let text = serde_json::to_string_pretty(&f).context("cannot encode name bindings")?;
    let tmp = dir.join(format!("{NAMES_FILE}.tmp"));
    write_private(&tmp, text.as_bytes())?;
    fs::rename(&tmp, dir.join(NAMES_FILE)).with_context(|| format!("cannot replace {}", dir.join(NAMES_FILE).display()))
}

/// What the state thread writes.
enum Job {
    Names(weft_peers::Names),
    Revocations(Vec<Revocation>),
    Issued(Vec<weft_peers::Issued>),
    Policy(String),
    Certificates(Vec<Vec<u8>>),
}

/// The thread that writes the name bindings, the exit pin, the revocations, the
/// issuer's ledger and the signed policy to the state directory, the latest of each
/// that is queued, so the control loop never waits for a disk.
pub struct StateWriter {
    tx: std::sync::mpsc::Sender<Job>,
}

impl StateWriter {
    /// Starts the thread for state directory `dir`.
    pub fn spawn(dir: std::path::PathBuf) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new().name("weft-state".into()).spawn(move || {
            while let Ok(job) = rx.recv() {
                let (mut names, mut revocations, mut issued, mut policy) = (None, None, None, None);
                let mut certificates = None;
                for job in std::iter::once(job).chain(rx.try_iter()) {
                    match job {
                        Job::Names(n) => names = Some(n),
                        Job::Revocations(r) => revocations.get_or_insert_with(Vec::new).extend(r),
                        Job::Issued(l) => issued = Some(l),
                        Job::Policy(p) => policy = Some(p),
                        Job::Certificates(c) => certificates = Some(c),
                    }
                }
                if let Some(c) = certificates
                    && let Err(e) = save_certificates(&dir, &c)
                {
                    warn!("cannot keep the newest certificates of the members: {e:#}");
                }
                if let Some(l) = issued
                    && let Err(e) = save_issued(&dir, &l)
                {
                    warn!("cannot keep the ledger of issued certificates: {e:#}");
                }
                if let Some(n) = names
                    && let Err(e) = save_names(&dir, &n)
                {
                    warn!("cannot keep the name bindings: {e:#}");
                }
                if let Some(r) = revocations
                    && let Err(e) = append_revocations(&dir, &r)
                {
                    warn!("cannot keep the revocations: {e:#}");
                }
                if let Some(p) = policy
                    && let Err(e) = save_policy(&dir, &p)
                {
                    warn!("cannot keep the signed policy: {e:#}");
                }
            }
        })?;
        Ok(Self { tx })
    }

    /// Queues `names` to be written (a newer one queued meanwhile wins).
    pub fn save(&self, names: weft_peers::Names) {
        let _ = self.tx.send(Job::Names(names));
    }

    /// Queues new revocations to be added to the file (in order).
    pub fn save_revocations(&self, list: Vec<Revocation>) {
        let _ = self.tx.send(Job::Revocations(list));
    }

    /// Queues the issuer's ledger to be written (a newer one queued meanwhile wins).
    pub fn save_issued(&self, list: Vec<weft_peers::Issued>) {
        let _ = self.tx.send(Job::Issued(list));
    }

    /// Queues the newest certificate of each member (encoded) to be written (a newer
    /// list queued meanwhile wins).
    pub fn save_certificates(&self, list: Vec<Vec<u8>>) {
        let _ = self.tx.send(Job::Certificates(list));
    }

    /// Queues a signed policy (its text form) to be written (a newer one queued
    /// meanwhile wins).
    pub fn save_policy(&self, text: String) {
        let _ = self.tx.send(Job::Policy(text));
    }
}

/// The ledger of certificates this node issued for invites: a header naming its
/// format, then one line per certificate: invite id, node id (hex), IPv4 address,
/// unix time, host name.
const ISSUED_FILE: &str = "issued";
const ISSUED_HEADER: &str = "weft-issued 1";

/// Writes the whole ledger to `dir` (then renamed over the old file).
pub fn save_issued(dir: &Path, list: &[weft_peers::Issued]) -> Result<()> {
    let mut text = format!("{ISSUED_HEADER}\n");
    for e in list {
        text.push_str(&format!("{} {} {} {} {}\n", hex(&e.invite), hex(&e.node), e.ipv4, e.at, e.name));
    }
    let tmp = dir.join(format!("{ISSUED_FILE}.tmp"));
    write_private(&tmp, text.as_bytes())?;
    let path = dir.join(ISSUED_FILE);
    fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
}

/// The ledger kept in `dir` (empty when there is none).
pub fn load_issued(dir: &Path) -> Result<Vec<weft_peers::Issued>> {
    let path = dir.join(ISSUED_FILE);
    let Some(text) = read_kept(&path, ISSUED_HEADER)? else { return Ok(Vec::new()) };
    let lines = text.lines().enumerate().skip(1);
    let key32 = |s: &str| -> Option<[u8; 32]> { unhex(s).ok()?.try_into().ok() };
    lines
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let f: Vec<&str> = l.splitn(5, ' ').collect();
            let parsed = match f.as_slice() {
                [inv, node, ip, at, name] => (|| {
                    Some(weft_peers::Issued {
                        invite: key32(inv)?,
                        node: key32(node)?,
                        ipv4: ip.parse().ok()?,
                        at: at.parse().ok()?,
                        name: (*name).to_owned(),
                    })
                })(),
                _ => None,
            };
            parsed.with_context(|| format!("{} line {}: not a ledger entry", path.display(), i + 1))
        })
        .collect()
}

/// The newest certificate this node has seen for each member: a header naming the
/// format, then one certificate per line (`weft-cert:...`). A member's older
/// certificate stays refused after a restart.
const CERTIFICATES_FILE: &str = "newest-certificates";
const CERTIFICATES_HEADER: &str = "weft-newest-certificates 1";

/// Writes the newest certificates (encoded) to `dir` (whole, then renamed over the
/// old file).
pub fn save_certificates(dir: &Path, list: &[Vec<u8>]) -> Result<()> {
    let mut text = format!("{CERTIFICATES_HEADER}\n");
    for bytes in list {
        let cert = weft_core::cert::Certificate::from_bytes(bytes).context("a certificate the engine kept")?;
        text.push_str(&cert.to_text());
        text.push('\n');
    }
    let tmp = dir.join(format!("{CERTIFICATES_FILE}.tmp"));
    write_private(&tmp, text.as_bytes())?;
    let path = dir.join(CERTIFICATES_FILE);
    fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
}

/// The newest certificates kept in `dir`, encoded (none when there is no file). A
/// newer format, or a line that is not a certificate, is an error naming the file and
/// the line.
pub fn load_certificates(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let path = dir.join(CERTIFICATES_FILE);
    let Some(text) = read_kept(&path, CERTIFICATES_HEADER)? else { return Ok(Vec::new()) };
    text.lines()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            weft_core::cert::Certificate::from_text(l)
                .map(|c| c.to_bytes())
                .with_context(|| format!("{} line {}: not a certificate", path.display(), i + 1))
        })
        .collect()
}

/// The revocations file: a header naming its format, then one revocation per line.
const REVOCATIONS_FILE: &str = "revocations";
const REVOCATIONS_HEADER: &str = "weft-revocations 1";

/// Adds `new` to the revocations kept in `dir`: appended, one line each, in one
/// write; the file (with its header) is made whole first when there is none. A crash
/// mid-write leaves at most a cut last line, which [`load_revocations`] skips.
pub fn append_revocations(dir: &Path, new: &[Revocation]) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let path = dir.join(REVOCATIONS_FILE);
    if !path.exists() {
        return save_revocations(dir, new);
    }
    let mut text = String::with_capacity(new.len() * 200);
    for r in new {
        text.push_str(&r.to_text());
        text.push('\n');
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {} to append", path.display()))?;
    // A line a crash cut short would glue onto this one: cut it off first (a line is
    // far shorter than the tail read).
    let len = f.metadata().with_context(|| format!("cannot read {}", path.display()))?.len();
    let tail_len = len.min(4096);
    let mut tail = vec![0u8; tail_len as usize];
    f.seek(SeekFrom::Start(len - tail_len)).and_then(|_| f.read_exact(&mut tail))?;
    let mut end = len;
    if tail.last().is_some_and(|&b| b != b'\n') {
        end = tail.iter().rposition(|&b| b == b'\n').map_or(len - tail_len, |i| len - tail_len + i as u64 + 1);
        f.set_len(end).with_context(|| format!("cannot cut {}", path.display()))?;
    }
    f.seek(SeekFrom::Start(end))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot append to {}", path.display()))
}

/// Writes every revocation to `dir` (whole, then renamed over the old file).
pub fn save_revocations(dir: &Path, list: &[Revocation]) -> Result<()> {
    let mut text = format!("{REVOCATIONS_HEADER}\n");
    for r in list {
        text.push_str(&r.to_text());
        text.push('\n');
    }
    let tmp = dir.join(format!("{REVOCATIONS_FILE}.tmp"));
    write_private(&tmp, text.as_bytes())?;
    let path = dir.join(REVOCATIONS_FILE);
    fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
}

/// The signed access policy kept: a header naming the format, then the policy's text
/// form (`weft-policy:...`).
const POLICY_FILE: &str = "policy";
const POLICY_HEADER: &str = "weft-policy 1";

/// Keeps the signed policy `text` in `dir` (whole, then renamed over the old file).
pub fn save_policy(dir: &Path, text: &str) -> Result<()> {
    let tmp = dir.join(format!("{POLICY_FILE}.tmp"));
    write_private(&tmp, format!("{POLICY_HEADER}\n{text}\n").as_bytes())?;
    let path = dir.join(POLICY_FILE);
    fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
}

/// The signed policy kept in `dir`, encoded (none when there is no file).
pub fn load_policy(dir: &Path) -> Result<Option<Vec<u8>>> {
    let path = dir.join(POLICY_FILE);
    let Some(text) = read_kept(&path, POLICY_HEADER)? else { return Ok(None) };
    let line = text.lines().nth(1).unwrap_or_default();
    let p = weft_core::policy::SignedPolicy::from_text(line)
        .with_context(|| format!("{} line 2: not a signed policy", path.display()))?;
    Ok(Some(p.to_bytes()))
}

/// A state file whose first line is `header` ("weft-NAME FORMAT"): its text, or none
/// when there is no file. Another format of the same name is "newer, keep the file";
/// anything else is not such a file.
fn read_kept(path: &Path, header: &str) -> Result<Option<String>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let word = header.split(' ').next().unwrap_or(header);
    match text.lines().next() {
        Some(h) if h == header => Ok(Some(text)),
        Some(h) if h.split(' ').next() == Some(word) => bail!(
            "{} has format {:?}, newer than this weft reads: upgrade weft (keep the file)",
            path.display(),
            &h[word.len()..].trim()
        ),
        _ => bail!("{} does not begin {header:?}", path.display()),
    }
}

/// The revocations kept in `dir` (none when there is no file). A newer format, or a
/// line that is not a revocation, is an error naming the file and the line — except
/// a last line without its newline (an append a crash cut), which is skipped.
pub fn load_revocations(dir: &Path) -> Result<Vec<Revocation>> {
    let path = dir.join(REVOCATIONS_FILE);
    let Some(text) = read_kept(&path, REVOCATIONS_HEADER)? else { return Ok(Vec::new()) };
    let cut = !text.ends_with('\n');
    let count = text.lines().count();
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate().skip(1).filter(|(_, l)| !l.trim().is_empty()) {
        match Revocation::from_text(l) {
            Ok(r) => out.push(r),
            Err(_) if cut && i + 1 == count => {
                warn!("{} line {}: cut short (by a crash while it was written): skipped", path.display(), i + 1)
            }
            Err(e) => return Err(e).with_context(|| format!("{} line {}: not a revocation", path.display(), i + 1)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn key_is_created_private_and_reused() {
        let dir = std::env::temp_dir().join(format!("weft-state-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = load_or_create_key(&dir).unwrap();
        let mode = fs::metadata(dir.join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let b = load_or_create_key(&dir).unwrap();
        assert_eq!(a.public, b.public);
        assert!(fs::read_to_string(dir.join(KEY_FILE)).unwrap().starts_with("ed25519 "));
        // A key file of the old format (an X25519 pair) is replaced by a new identity,
        // written back in the new format and kept private.
        fs::write(dir.join(KEY_FILE), format!("{}\n{}\n", "11".repeat(32), "22".repeat(32))).unwrap();
        let c = load_or_create_key(&dir).unwrap();
        assert_ne!(c.public, a.public);
        assert_eq!(load_or_create_key(&dir).unwrap().public, c.public);
        let mode = fs::metadata(dir.join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        fs::write(dir.join(KEY_FILE), "zz\n").unwrap();
        let e = format!("{:#}", load_or_create_key(&dir).unwrap_err());
        assert!(e.contains("corrupt node key"), "{e}");
        // A format a newer weft wrote is named as such, and the file is left alone.
        let newer = "weft-key/2 ed25519 00ff\n";
        fs::write(dir.join(KEY_FILE), newer).unwrap();
        let e = format!("{:#}", load_or_create_key(&dir).unwrap_err());
        assert!(e.contains("a newer weft wrote it") && e.contains("weft-key/2") && !e.contains("corrupt"), "{e}");
        assert_eq!(fs::read_to_string(dir.join(KEY_FILE)).unwrap(), newer);
        // A bad seed under the known tag is corrupt, not newer.
        // Non-ASCII where hex digits belong is corrupt, never a panic.
        fs::write(dir.join(KEY_FILE), format!("ed25519 {}éa\n", "a".repeat(61))).unwrap();
        assert!(format!("{:#}", load_or_create_key(&dir).unwrap_err()).contains("corrupt node key"));
        fs::write(dir.join(KEY_FILE), "ed25519 abcd\n").unwrap();
        assert!(format!("{:#}", load_or_create_key(&dir).unwrap_err()).contains("corrupt node key"));

        // The self-signed TLS pair is made once, private, and reused.
        let t1 = load_or_create_tls(&dir, None).unwrap();
        let mode = fs::metadata(dir.join(TLS_KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let t2 = load_or_create_tls(&dir, None).unwrap();
        assert_eq!(t1.chain, t2.chain);
        // Given files that are not PEM are refused by name.
        let junk = dir.join("junk.pem");
        fs::write(&junk, "not a certificate").unwrap();
        let e = load_or_create_tls(&dir, Some(&(junk.clone(), junk))).unwrap_err().to_string();
        assert!(e.contains("junk.pem"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_open_to_others_are_refused_on_every_start() {
        let dir = std::env::temp_dir().join(format!("weft-state-mode-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        load_or_create_key(&dir).unwrap();
        load_or_create_tls(&dir, None).unwrap();
        let node_key = dir.join(KEY_FILE);
        let tls_key = dir.join(TLS_KEY_FILE);
        for mode in [0o644, 0o640, 0o604] {
            fs::set_permissions(&node_key, fs::Permissions::from_mode(mode)).unwrap();
            let e = load_or_create_key(&dir).unwrap_err();
            assert!(e.downcast_ref::<UsageError>().is_some(), "{e}");
            assert!(e.to_string().contains(&format!("chmod 600 {}", node_key.display())), "{e}");
            // Refusing is all it does: the mode stays as it was.
            assert_eq!(fs::metadata(&node_key).unwrap().permissions().mode() & 0o777, mode);

            fs::set_permissions(&tls_key, fs::Permissions::from_mode(mode)).unwrap();
            let e = load_or_create_tls(&dir, None).unwrap_err().to_string();
            assert!(e.contains(&format!("chmod 600 {}", tls_key.display())), "{e}");
            // A given --tls-key is checked the same way.
            let given = (dir.join(TLS_CERT_FILE), tls_key.clone());
            let e = load_or_create_tls(&dir, Some(&given)).unwrap_err().to_string();
            assert!(e.contains(&format!("chmod 600 {}", tls_key.display())), "{e}");
        }
        fs::set_permissions(&node_key, fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(&tls_key, fs::Permissions::from_mode(0o400)).unwrap();
        load_or_create_key(&dir).unwrap();
        load_or_create_tls(&dir, None).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_issuers_ledger_and_the_revocations_survive_a_restart_and_a_newer_format_is_kept() {
        let dir = std::env::temp_dir().join(format!("weft-ledger-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert!(load_issued(&dir).unwrap().is_empty(), "no file: an empty ledger");
        let ledger = vec![
            weft_peers::Issued {
                invite: [1; 32],
                node: [2; 32],
                ipv4: [10, 0, 0, 9].into(),
                name: "a b".into(),
                at: 7,
            },
            weft_peers::Issued { invite: [1; 32], node: [3; 32], ipv4: [10, 0, 0, 10].into(), name: "c".into(), at: 8 },
        ];
        save_issued(&dir, &ledger).unwrap();
        assert_eq!(load_issued(&dir).unwrap(), ledger);
        fs::write(dir.join(ISSUED_FILE), "weft-issued 2\nwhatever\n").unwrap();
        let e = format!("{:#}", load_issued(&dir).unwrap_err());
        assert!(e.contains("newer than this weft reads") && e.contains("keep the file"), "{e}");
        fs::write(dir.join(ISSUED_FILE), "weft-issued 1\nnot an entry\n").unwrap();
        assert!(format!("{:#}", load_issued(&dir).unwrap_err()).contains("line 2: not a ledger entry"));
        fs::write(dir.join(REVOCATIONS_FILE), "weft-revocations 9\n").unwrap();
        assert!(format!("{:#}", load_revocations(&dir).unwrap_err()).contains("\"9\", newer"));
        fs::write(dir.join(REVOCATIONS_FILE), "something else\n").unwrap();
        assert!(format!("{:#}", load_revocations(&dir).unwrap_err()).contains("does not begin"));
        // The newest certificates seen: kept and read back (both formats), a bad line named.
        assert!(load_certificates(&dir).unwrap().is_empty(), "no file: none kept");
        let auth = weft_core::cert::AuthorityKey::from_seed([4; 32]);
        let cert = |issued| {
            weft_core::cert::CertBody {
                authority: auth.id(),
                node: [5; 32],
                network: String::new(),
                name: "n".into(),
                ipv4: ([10, 0, 0, 5].into(), 24),
                ipv6: None,
                groups: vec![],
                subnets: vec![],
                exit: false,
                portal: false,
                not_before: 1,
                not_after: 2,
                issued,
                issuer: false,
            }
            .sign(&auth)
            .unwrap()
            .to_bytes()
        };
        let kept = vec![cert(Some(1)), cert(None)];
        save_certificates(&dir, &kept).unwrap();
        assert_eq!(load_certificates(&dir).unwrap(), kept);
        let mode = fs::metadata(dir.join(CERTIFICATES_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        fs::write(dir.join(CERTIFICATES_FILE), "weft-newest-certificates 1\nweft-cert:AA\n").unwrap();
        assert!(format!("{:#}", load_certificates(&dir).unwrap_err()).contains("line 2: not a certificate"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn revocations_are_appended_and_a_line_a_crash_cut_is_skipped() {
        let dir = std::env::temp_dir().join(format!("weft-revocations-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let a = weft_core::cert::AuthorityKey::from_seed([1; 32]);
        let b = weft_core::cert::AuthorityKey::from_seed([2; 32]);
        let r = |k: &weft_core::cert::AuthorityKey, n: u8| Revocation::issue(k, [n; 32], 100);
        append_revocations(&dir, &[r(&a, 1)]).unwrap();
        append_revocations(&dir, &[r(&b, 2), r(&a, 3)]).unwrap();
        assert_eq!(load_revocations(&dir).unwrap(), [r(&a, 1), r(&b, 2), r(&a, 3)], "any authority's, in order");
        // A crash cut the last append: the cut line is skipped, the next append starts
        // on a line of its own.
        let path = dir.join(REVOCATIONS_FILE);
        let mut text = fs::read_to_string(&path).unwrap();
        text.push_str(&r(&a, 4).to_text()[..40]);
        fs::write(&path, &text).unwrap();
        assert_eq!(load_revocations(&dir).unwrap().len(), 3);
        append_revocations(&dir, &[r(&a, 5)]).unwrap();
        assert_eq!(load_revocations(&dir).unwrap(), [r(&a, 1), r(&b, 2), r(&a, 3), r(&a, 5)]);
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn subnet_bindings_survive_a_restart() {
        let dir = std::env::temp_dir().join(format!("weft-subnets-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let id: weft_peers::NodeId = "66687aadf862bd77".parse().unwrap();
        let names = weft_peers::Names::default().with_subnets([(("192.168.50.0".parse().unwrap(), 24), id)]);
        save_names(&dir, &names).unwrap();
        assert_eq!(load_names(&dir).unwrap(), names);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn name_bindings_survive_a_restart_and_a_bad_file_is_named() {
        let dir = std::env::temp_dir().join(format!("weft-names-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(load_names(&dir).unwrap(), weft_peers::Names::default());
        let id: weft_peers::NodeId = "66687aadf862bd77".parse().unwrap();
        let names = weft_peers::Names::new([("gw".to_owned(), id)], Some(("gw".to_owned(), id)));
        save_names(&dir, &names).unwrap();
        assert_eq!(load_names(&dir).unwrap(), names);
        let mode = fs::metadata(dir.join(NAMES_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        fs::write(dir.join(NAMES_FILE), r#"{"version": 9, "names": {}, "exit_pin": null}"#).unwrap();
        assert!(format!("{:#}", load_names(&dir).unwrap_err()).contains("format 9"));
        fs::write(dir.join(NAMES_FILE), "{").unwrap();
        assert!(format!("{:#}", load_names(&dir).unwrap_err()).contains("corrupt name bindings"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_private_dir_is_made_0700_and_a_foreign_or_open_one_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weft-private-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        private_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(format!("{:#}", private_dir(&dir).unwrap_err()).contains("open to other users"));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let link = dir.with_extension("link");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(format!("{:#}", private_dir(&link).unwrap_err()).contains("not a directory"));
        if crate::control::access::is_root() {
            // Another owner: what a local user who made the name first would leave.
            std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
            assert!(format!("{:#}", private_dir(&dir).unwrap_err()).contains("belongs to uid 65534"));
        }
        let _ = fs::remove_file(&link);
        let _ = fs::remove_dir_all(&dir);
    }
}
