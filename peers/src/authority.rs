//! Admission by certificate, in a network with an authority: whether a handshake's
//! hello comes with a member certificate this network's authority signed for the
//! key the handshake proved, valid now, and claims nothing the certificate does not
//! grant. In a network without an authority, a hello that carries a certificate is
//! refused too: the peer belongs to an authority network this node is not set up for.

use std::collections::{HashMap, HashSet};

use weft_control::FailureKind;
use weft_core::cert::{AuthorityId, Certificate, Revocation};
use weft_core::handshake::Hello;

use crate::identity::PeerKey;

/// Revocations kept by a node: each signed by a trusted authority, in the order they
/// arrived (a peer is sent the ones past what it was sent already).
#[derive(Debug, Default)]
pub(crate) struct Revocations {
    list: Vec<Revocation>,
    keys: HashSet<[u8; 32]>,
}

/// Revocations a node keeps, at most (each is 137 bytes; a network that revoked this
/// many members needs a new authority).
pub(crate) const MAX_REVOCATIONS: usize = 65_536;

impl Revocations {
    /// Takes `r` if one of `trusted` signed it: `Ok(true)` when it is new.
    pub(crate) fn add(&mut self, r: Revocation, trusted: &[AuthorityId]) -> Result<bool, String> {
        if trusted.is_empty() {
            return Err("this node has no authority (--authority) to check a revocation against".into());
        }
        // A key revoked already costs no signature check (a member repeating one).
        if self.keys.contains(&r.node) {
            return Ok(false);
        }
        if !r.verify(trusted) {
            return Err(format!("not signed by this network's authority (it names {})", r.authority));
        }
        if self.list.len() >= MAX_REVOCATIONS {
            return Err(format!("this node already keeps {MAX_REVOCATIONS} revocations"));
        }
        self.keys.insert(r.node);
        self.list.push(r);
        Ok(true)
    }

    /// Takes `r` kept in the state directory (it was checked when it arrived): kept
    /// whatever the authorities trusted now, so an authority rollover revokes
    /// nothing back in. `Ok(true)` when it is new.
    pub(crate) fn add_kept(&mut self, r: Revocation) -> Result<bool, String> {
        if self.keys.contains(&r.node) {
            return Ok(false);
        }
        if self.list.len() >= MAX_REVOCATIONS {
            return Err(format!("this node already keeps {MAX_REVOCATIONS} revocations"));
        }
        self.keys.insert(r.node);
        self.list.push(r);
        Ok(true)
    }

    /// Whether node key `key` is revoked.
    pub(crate) fn contains(&self, key: &[u8; 32]) -> bool {
        self.keys.contains(key)
    }

    /// Every revocation, oldest first.
    pub(crate) fn list(&self) -> &[Revocation] {
        &self.list
    }
}

/// The newest certificate this node has seen for each member key (checked against a
/// trusted authority when it was taken): a certificate issued before it is refused,
/// in a hello and in a record, so a member re-certified with fewer rights cannot come
/// back with an older certificate. Kept in the state directory
/// ([`crate::Action::SaveCertificates`]).
#[derive(Debug, Default)]
pub(crate) struct Newest {
    by_key: HashMap<[u8; 32], Certificate>,
}

/// Member keys whose newest certificate a node keeps, at most (each at most 512
/// bytes; only certificates its authority signed are kept).
pub(crate) const MAX_NEWEST: usize = 65_536;

impl Newest {
    /// Takes `cert` (signed by a trusted authority, checked by the caller) when it
    /// was issued after the one held for its key: returns whether it was.
    pub(crate) fn note(&mut self, cert: &Certificate) -> bool {
        let key = cert.body().node;
        match self.by_key.get(&key) {
            Some(held) if held.issued() >= cert.issued() => false,
            None if self.by_key.len() >= MAX_NEWEST => false,
            _ => {
                self.by_key.insert(key, cert.clone());
                true
            }
        }
    }

    /// The issue time of the newest certificate held for `key`, when `cert` (for
    /// that key) was issued before it.
    pub(crate) fn older(&self, cert: &Certificate) -> Option<u64> {
        let held = self.by_key.get(&cert.body().node)?.issued();
        (cert.issued() < held).then_some(held)
    }

    /// Every certificate held, in no order.
    pub(crate) fn certs(&self) -> impl Iterator<Item = &Certificate> {
        self.by_key.values()
    }

    /// Every certificate held, encoded (what the state directory keeps).
    pub(crate) fn encoded(&self) -> Vec<Vec<u8>> {
        self.by_key.values().map(Certificate::to_bytes).collect()
    }
}

/// Why `hello` (from the node whose handshake proved `key`) is refused in `network`
/// trusting `authorities` at `unix` seconds, with the failure kind; `None` admits.
/// A certificate issued before the newest seen for the key (`newest`) is refused.
pub(crate) fn refusal(
    authorities: &[AuthorityId],
    revoked: &Revocations,
    newest: &Newest,
    network: &str,
    key: &PeerKey,
    hello: &Hello,
    unix: u64,
) -> Option<(String, FailureKind)> {
    if revoked.contains(&key.0) {
        return Some(("was revoked by the network's authority".into(), FailureKind::CertificateRefused));
    }
    let bytes = match (&hello.cert, authorities.is_empty()) {
        (None, true) => return None,
        (Some(bytes), true) => {
            let from =
                Certificate::from_bytes(bytes).map(|c| format!(" of {}", c.body().authority)).unwrap_or_default();
            return Some((
                format!(
                    "presents a member certificate{from}: its network has an authority and this node has none (start it with --authority and --certificate)"
                ),
                FailureKind::AuthorityRequired,
            ));
        }
        (None, false) => {
            return Some((
                "has no member certificate: this network admits only members its authority signed".into(),
                FailureKind::NoCertificate,
            ));
        }
        (Some(bytes), false) => bytes,
    };
    let cert = match Certificate::from_bytes(bytes) {
        Ok(c) => c,
        Err(e) => return Some((format!("presents an unreadable certificate ({e})"), FailureKind::CertificateRefused)),
    };
    if let Err(r) = cert.check(authorities, network, &key.0, unix) {
        return Some((format!("presents a certificate that is refused: {r}"), FailureKind::CertificateRefused));
    }
    if let Some(held) = newest.older(&cert) {
        return Some((
            format!(
                "presents an older certificate (issued at {}) than the newest its authority issued it (issued at {held}): refused, restart it with its newest certificate",
                cert.issued()
            ),
            FailureKind::CertificateRefused,
        ));
    }
    let b = cert.body();
    let beyond =
        |what: String| Some((format!("{what}, which its certificate does not grant"), FailureKind::BeyondCertificate));
    if (hello.ipv4, hello.prefix) != b.ipv4 {
        return beyond(format!(
            "claims {}/{} (its certificate grants {}/{})",
            hello.ipv4, hello.prefix, b.ipv4.0, b.ipv4.1
        ));
    }
    if hello.hostname != b.name {
        return beyond(format!("calls itself {:?} (its certificate names it {:?})", hello.hostname, b.name));
    }
    if let Some((a, p)) = hello.ipv6
        && Some((a, p)) != b.ipv6
    {
        return beyond(format!("claims {a}/{p}"));
    }
    None
}

/// Why topology record `rec` is not taken in a network trusting `authorities` (at
/// `unix` seconds): its origin is revoked, or its certificate is missing, refused,
/// older than the newest seen for its origin (`newest`), or does not grant the
/// record's address or name. `None` takes it (and always without an authority).
pub(crate) fn record_refusal(
    authorities: &[AuthorityId],
    revoked: &Revocations,
    newest: &Newest,
    network: &str,
    rec: &crate::topology::Record,
    unix: u64,
) -> Option<String> {
    if authorities.is_empty() {
        return None;
    }
    if revoked.contains(&rec.key) {
        return Some("its origin was revoked".into());
    }
    let Some(bytes) = &rec.cert else { return Some("it carries no certificate".into()) };
    let cert = match Certificate::from_bytes(bytes) {
        Ok(c) => c,
        Err(e) => return Some(format!("its certificate is unreadable ({e})")),
    };
    if let Err(r) = cert.check(authorities, network, &rec.key, unix) {
        return Some(format!("its certificate is refused: {r}"));
    }
    if let Some(held) = newest.older(&cert) {
        return Some(format!(
            "its certificate is older (issued at {}) than the newest seen for its origin (issued at {held})",
            cert.issued()
        ));
    }
    let b = cert.body();
    let v6_ok = rec.overlay6.is_none_or(|a| b.ipv6.is_some_and(|(g, _)| g == a));
    if rec.overlay != b.ipv4.0 || rec.hostname != b.name || !v6_ok {
        return Some("it claims an address or name its certificate does not grant".into());
    }
    None
}

/// Whether record `rec`'s origin may proxy `a/p` (an exit's offer when `p` is 0):
/// always without an authority; with one, only what its certificate grants (checked
/// when the record was taken, [`record_refusal`]).
pub(crate) fn grants(authorities: &[AuthorityId], rec: &crate::topology::Record, a: std::net::IpAddr, p: u8) -> bool {
    if authorities.is_empty() {
        return true;
    }
    let Some(cert) = rec.cert.as_deref().and_then(|c| Certificate::from_bytes(c).ok()) else { return false };
    let b = cert.body();
    if p == 0 {
        return b.exit;
    }
    let want = weft_core::cert::Prefix { addr: a, len: p };
    b.subnets.iter().any(|g| g.covers(&want))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use weft_core::cert::{AuthorityKey, CertBody};
    use weft_core::crypto::Cipher;

    use super::*;

    fn hello(cert: Option<Vec<u8>>) -> Hello {
        Hello { cert, ..Hello::new(Cipher::Aes128Gcm, Ipv4Addr::new(10, 1, 0, 5), 24, "build-01") }
    }

    fn cert(key: &AuthorityKey, node: [u8; 32]) -> Vec<u8> {
        CertBody {
            authority: key.id(),
            node,
            network: "office".into(),
            name: "build-01".into(),
            ipv4: (Ipv4Addr::new(10, 1, 0, 5), 24),
            ipv6: None,
            groups: vec![],
            subnets: vec![],
            exit: false,
            portal: false,
            not_before: 1_000,
            not_after: 2_000,
            issued: Some(1_000),
            issuer: false,
        }
        .sign(key)
        .unwrap()
        .to_bytes()
    }

    #[test]
    fn only_a_valid_certificate_for_the_proved_key_admits_and_only_what_it_grants() {
        let auth = AuthorityKey::from_seed([1; 32]);
        let trusted = [auth.id()];
        let key = PeerKey([9; 32]);
        let none = Revocations::default();
        let fresh = Newest::default();
        let kind = |h: &Hello, t: &[AuthorityId], unix| refusal(t, &none, &fresh, "office", &key, h, unix).map(|r| r.1);
        let good = hello(Some(cert(&auth, key.0)));
        assert_eq!(kind(&good, &trusted, 1_500), None);
        assert_eq!(kind(&hello(None), &[], 1_500), None, "no authority, no certificate: as before");
        assert_eq!(kind(&good, &[], 1_500), Some(FailureKind::AuthorityRequired));
        assert_eq!(kind(&hello(None), &trusted, 1_500), Some(FailureKind::NoCertificate));
        assert_eq!(kind(&good, &trusted, 2_000), Some(FailureKind::CertificateRefused), "expired");
        let stolen = hello(Some(cert(&auth, [8; 32])));
        assert_eq!(kind(&stolen, &trusted, 1_500), Some(FailureKind::CertificateRefused), "another key's");
        let rogue = AuthorityKey::from_seed([2; 32]);
        assert_eq!(kind(&hello(Some(cert(&rogue, key.0))), &trusted, 1_500), Some(FailureKind::CertificateRefused));
        assert_eq!(kind(&hello(Some(vec![1, 2, 3])), &trusted, 1_500), Some(FailureKind::CertificateRefused));
        let mut other_addr = good.clone();
        other_addr.ipv4 = Ipv4Addr::new(10, 1, 0, 6);
        assert_eq!(kind(&other_addr, &trusted, 1_500), Some(FailureKind::BeyondCertificate));
        let mut other_name = good.clone();
        other_name.hostname = "gateway".into();
        assert_eq!(kind(&other_name, &trusted, 1_500), Some(FailureKind::BeyondCertificate));
        let mut v6 = good;
        v6.ipv6 = Some(("fd00::5".parse().unwrap(), 64));
        assert_eq!(kind(&v6, &trusted, 1_500), Some(FailureKind::BeyondCertificate));
        // A revoked key is refused whatever its certificate.
        let mut revoked = Revocations::default();
        let r = Revocation::issue(&auth, key.0, 1_400);
        assert_eq!(revoked.add(r.clone(), &[rogue.id()]).map_err(|_| ()), Err(()), "another authority's");
        assert_eq!(revoked.add(r.clone(), &[]).map_err(|_| ()), Err(()), "no authority here");
        assert_eq!(revoked.add(r.clone(), &trusted), Ok(true));
        assert_eq!(revoked.add(r, &trusted), Ok(false), "known already");
        let good = hello(Some(cert(&auth, key.0)));
        let got = refusal(&trusted, &revoked, &fresh, "office", &key, &good, 1_500).unwrap();
        assert_eq!(got.1, FailureKind::CertificateRefused);
        assert!(got.0.contains("revoked"), "{}", got.0);
    }

    #[test]
    fn a_certificate_issued_before_the_newest_seen_for_its_key_is_refused_in_hellos_and_records() {
        let auth = AuthorityKey::from_seed([1; 32]);
        let trusted = [auth.id()];
        let key = PeerKey([9; 32]);
        let none = Revocations::default();
        let signed = |issued: Option<u64>, groups: &[&str]| {
            let mut b = Certificate::from_bytes(&cert(&auth, key.0)).unwrap().body().clone();
            b.issued = issued;
            b.groups = groups.iter().map(|g| (*g).to_owned()).collect();
            b.sign(&auth).unwrap()
        };
        // v1 (format 1, counts as issued at not_before 1_000) with group dev; v2 later
        // with none.
        let (v1, v2) = (signed(None, &["dev"]), signed(Some(1_100), &[]));
        let mut newest = Newest::default();
        let check = |n: &Newest, c: &Certificate| {
            refusal(&trusted, &none, n, "office", &key, &hello(Some(c.to_bytes())), 1_500)
        };
        assert_eq!(check(&newest, &v1), None, "nothing newer seen yet");
        assert!(newest.note(&v1));
        assert!(newest.note(&v2), "issued later: the newest now");
        assert!(!newest.note(&v1), "an older one never replaces it");
        assert!(!newest.note(&v2), "nor the same one");
        assert_eq!(check(&newest, &v2), None);
        let (why, kind) = check(&newest, &v1).unwrap();
        assert_eq!(kind, FailureKind::CertificateRefused);
        assert!(why.contains("older certificate") && why.contains("1100"), "{why}");
        assert_eq!(newest.encoded(), vec![v2.to_bytes()]);
        // The same in a record.
        let origin = weft_core::handshake::StaticKey::from_seed([4; 32]);
        let rec_cert = |issued| {
            let mut b = v1.body().clone();
            b.node = origin.public;
            b.issued = Some(issued);
            b.sign(&auth).unwrap()
        };
        let rec = |c: &Certificate| crate::topology::Record {
            signer: origin.signing_public,
            cert: Some(c.to_bytes()),
            ..crate::topology::Record::blank(origin.public, "build-01", Ipv4Addr::new(10, 1, 0, 5))
        };
        assert!(newest.note(&rec_cert(1_200)));
        assert_eq!(record_refusal(&trusted, &none, &newest, "office", &rec(&rec_cert(1_200)), 1_500), None);
        let why = record_refusal(&trusted, &none, &newest, "office", &rec(&rec_cert(1_150)), 1_500).unwrap();
        assert!(why.contains("older"), "{why}");
    }

    #[test]
    fn records_are_taken_only_with_their_origins_certificate_and_grant_only_what_it_says() {
        use crate::topology::Record;
        let auth = AuthorityKey::from_seed([1; 32]);
        let trusted = [auth.id()];
        let origin = weft_core::handshake::StaticKey::from_seed([4; 32]);
        let cert = CertBody {
            authority: auth.id(),
            node: origin.public,
            network: "office".into(),
            name: "router".into(),
            ipv4: (Ipv4Addr::new(10, 1, 0, 7), 24),
            ipv6: None,
            groups: vec![],
            subnets: vec![weft_core::cert::Prefix { addr: [192, 168, 50, 0].into(), len: 24 }],
            exit: false,
            portal: false,
            not_before: 1_000,
            not_after: 2_000,
            issued: Some(1_000),
            issuer: false,
        }
        .sign(&auth)
        .unwrap()
        .to_bytes();
        let mut rec = Record {
            signer: origin.signing_public,
            cert: Some(cert),
            ..Record::blank(origin.public, "router", Ipv4Addr::new(10, 1, 0, 7))
        };
        let none = Revocations::default();
        let fresh = Newest::default();
        let refusal = |r: &Record, t: &[AuthorityId]| record_refusal(t, &none, &fresh, "office", r, 1_500);
        assert_eq!(refusal(&rec, &trusted), None);
        assert_eq!(refusal(&Record { cert: None, ..rec.clone() }, &[]), None, "no authority: as before");
        assert!(refusal(&Record { cert: None, ..rec.clone() }, &trusted).is_some());
        assert!(refusal(&Record { overlay: Ipv4Addr::new(10, 1, 0, 8), ..rec.clone() }, &trusted).is_some());
        assert!(refusal(&Record { hostname: "gateway".into(), ..rec.clone() }, &trusted).is_some());
        assert!(record_refusal(&trusted, &none, &fresh, "office", &rec, 2_000).is_some(), "expired");
        let mut revoked = Revocations::default();
        revoked.add(Revocation::issue(&auth, origin.public, 1_200), &trusted).unwrap();
        assert!(record_refusal(&trusted, &revoked, &fresh, "office", &rec, 1_500).is_some());
        // Grants: inside the certified subnet yes, beyond it or an exit no.
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert!(grants(&trusted, &rec, ip("192.168.50.0"), 24));
        assert!(grants(&trusted, &rec, ip("192.168.50.128"), 25));
        assert!(!grants(&trusted, &rec, ip("192.168.0.0"), 16));
        assert!(!grants(&trusted, &rec, ip("10.9.0.0"), 16));
        assert!(!grants(&trusted, &rec, ip("0.0.0.0"), 0), "no exit grant");
        assert!(grants(&[], &rec, ip("0.0.0.0"), 0), "no authority: as before");
        rec.cert = None;
        assert!(!grants(&trusted, &rec, ip("192.168.50.0"), 24));
    }
}
