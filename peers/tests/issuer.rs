//! The issuer, sans IO: a new machine's IK init with an invite, answered with a
//! certificate or the reason it is refused (issue 51, item 8). An issuer never hands
//! out an address or host name that a certificate it saw grants another key (a
//! joiner grinding keys lands on an offline member's address otherwise), re-issues
//! for a known (invite, key) only while the invite is valid, and issues only when its
//! own certificate marks it an issuer. The clock is the test's: an epoch taken once,
//! then instants past it (the engine never reads one).
#![allow(unreachable_pub, clippy::unwrap_used, clippy::disallowed_methods)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use weft_bench::harness;
use weft_core::admission::MacKeys;
use weft_core::cert::{AuthorityKey, CertBody, Certificate};
use weft_core::crypto::Cipher;
use weft_core::endpoint::Endpoint;
use weft_core::handshake::{Initiator, Params, Protocol, Stamp, StaticKey};
use weft_core::invite::{Invite, InviteBody};
use weft_core::wire::{HandshakeHeader, MessageType};
use weft_peers::{Action, Input, Node, NodeId, Timers};

const NET: &str = "office";
const SECRET: &str = "issuer test secret";
/// The harness's wall clock (unix seconds) at its epoch.
const WALL: u64 = 1_800_000_000;

fn authority() -> AuthorityKey {
    AuthorityKey::from_seed([5; 32])
}

/// A certificate of the authority for `key` at `ipv4` named `name`.
fn cert_for(key: [u8; 32], name: &str, ipv4: Ipv4Addr, issuer: bool) -> Certificate {
    let auth = authority();
    CertBody {
        authority: auth.id(),
        node: key,
        network: NET.into(),
        name: name.into(),
        ipv4: (ipv4, 24),
        ipv6: None,
        groups: Vec::new(),
        subnets: Vec::new(),
        exit: false,
        portal: false,
        not_before: WALL - 86_400,
        not_after: WALL + 86_400,
        issued: Some(WALL - 86_400),
        issuer,
    }
    .sign(&auth)
    .unwrap()
}

/// An issuer at 10.126.0.1/24 holding the authority key; its certificate marked an
/// issuer or not.
fn issuer(epoch: Instant, marked: bool) -> (Node, [u8; 32]) {
    let key = StaticKey::from_seed([1; 32]);
    let public = key.public;
    let mut p = harness::params(key, NET, SECRET, Cipher::Aes128Gcm, Ipv4Addr::new(10, 126, 0, 1), "issuer".into());
    p.hello.prefix = 24;
    p.hello.cert = Some(cert_for(public, "issuer", p.hello.ipv4, marked).to_bytes());
    let endpoint = Endpoint::udp(SocketAddr::from(([192, 0, 2, 1], 11010)));
    let mut cfg = harness::config(p, vec![], epoch, Timers::default(), endpoint);
    cfg.authorities = vec![authority().id()];
    let mut node = Node::new(cfg, Box::new(ChaCha8Rng::seed_from_u64(7)));
    node.set_issuer(authority(), Vec::new());
    (node, public)
}

fn invite(expires: u64, uses: u32) -> Invite {
    let auth = authority();
    InviteBody {
        authority: auth.id(),
        id: [3; 32],
        expires,
        uses,
        lifetime: 86_400,
        network: NET.into(),
        groups: vec![],
    }
    .sign(&auth)
    .unwrap()
}

/// `joiner` asks `node` (key `issuer`) for a certificate with `invite` at `now`:
/// the certificate, or the issuer's reason.
fn ask(
    node: &mut Node,
    issuer: &[u8; 32],
    now: Instant,
    joiner: &StaticKey,
    invite: &Invite,
) -> Result<Certificate, String> {
    let mut p: Params =
        harness::params(joiner.clone(), NET, SECRET, Cipher::Aes128Gcm, Ipv4Addr::UNSPECIFIED, "laptop".into());
    p.hello.prefix = 0;
    p.hello.protocol = Some(Protocol::ours(0));
    p.hello.join = Some(invite.to_bytes());
    // Stamps only grow per key.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let since =
        Duration::from_secs(WALL) + Duration::from_nanos(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let (init, noise) = Initiator::start(&p, Some(issuer), Stamp::from_unix(since)).unwrap();
    let mut msg = Vec::new();
    HandshakeHeader { kind: MessageType::HandshakeInit, pattern: init.pattern(), sender_index: 7, receiver_index: 0 }
        .emit(&mut msg);
    msg.extend_from_slice(&noise);
    let macs = MacKeys::new(&p.psk);
    macs.seal(&mut msg, None);
    let from = Endpoint::udp(SocketAddr::from(([192, 0, 2, 9], 40000)));
    node.handle(now, Input::Datagram { from, via: None, bytes: &msg });
    while let Some(a) = node.poll_action() {
        let Action::Send { bytes, .. } = a else { continue };
        let Some(body) = macs.check(&bytes) else { continue };
        if MessageType::of(body) != Some(MessageType::HandshakeResponse) {
            continue;
        }
        let (_, noise) = HandshakeHeader::parse(body).unwrap();
        let (done, _) = init.read_response(&p, noise).unwrap();
        if let Some(why) = done.hello.join_refused {
            return Err(why);
        }
        return Ok(Certificate::from_bytes(done.hello.issued.as_deref().unwrap()).unwrap());
    }
    panic!("the issuer did not answer")
}

/// A key whose node id makes the issuer start its address search at host `host`
/// of the /24 (what a joiner grinding keys looks for).
fn key_landing_on(host: u8) -> StaticKey {
    (0u64..)
        .map(|i| {
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&i.to_be_bytes());
            StaticKey::from_seed(seed)
        })
        .find(|k| NodeId::from_public(&k.public).to_bytes()[3] == host)
        .unwrap()
}

#[test]
fn a_ground_key_never_lands_on_the_address_or_name_of_a_member_the_issuer_saw_before() {
    let epoch = Instant::now();
    let (mut node, me) = issuer(epoch, true);
    // An offline member the issuer saw before (kept in its state directory): .77,
    // "laptop".
    let offline = StaticKey::from_seed([9; 32]).public;
    let seen = cert_for(offline, "laptop", Ipv4Addr::new(10, 126, 0, 77), false);
    assert_eq!(node.remember_certificates(vec![seen.to_bytes()]), 1);
    let joiner = key_landing_on(77);
    let inv = invite(WALL + 3600, 1);
    let cert = ask(&mut node, &me, epoch, &joiner, &inv).unwrap();
    assert_ne!(cert.body().ipv4.0, Ipv4Addr::new(10, 126, 0, 77), "the offline member's address was handed out");
    assert_ne!(cert.body().name, "laptop", "the offline member's name was handed out");
    assert!(cert.body().issued.is_some(), "an issued certificate carries its issue time");
    // A key ground onto an address the issuer's ledger gave another key: not that
    // one either.
    let given = cert.body().ipv4.0;
    let second = key_landing_on(given.octets()[3]);
    let other = ask(&mut node, &me, epoch + Duration::from_secs(1), &second, &invite(WALL + 3600, 0));
    assert_ne!(other.unwrap().body().ipv4.0, given);
}

#[test]
fn a_known_invite_and_key_get_their_certificate_again_only_while_the_invite_is_valid() {
    let epoch = Instant::now();
    let (mut node, me) = issuer(epoch, true);
    let joiner = StaticKey::from_seed([11; 32]);
    let inv = invite(WALL + 60, 1);
    let first = ask(&mut node, &me, epoch, &joiner, &inv).unwrap();
    // Its answer was lost: asked again within the validity, the same address.
    let again = ask(&mut node, &me, epoch + Duration::from_secs(10), &joiner, &inv).unwrap();
    assert_eq!(again.body().ipv4, first.body().ipv4);
    assert_eq!(node.issued().len(), 1, "one use");
    // After the invite expired: refused, whatever the ledger holds.
    let late = ask(&mut node, &me, epoch + Duration::from_secs(61), &joiner, &inv).unwrap_err();
    assert!(late.contains("the invite expired"), "{late}");
}

#[test]
fn a_member_whose_certificate_is_not_marked_issuer_issues_nothing() {
    let epoch = Instant::now();
    let (mut node, me) = issuer(epoch, false);
    let why = ask(&mut node, &me, epoch, &StaticKey::from_seed([12; 32]), &invite(WALL + 60, 1)).unwrap_err();
    assert!(why.contains("does not mark it an issuer"), "{why}");
    assert!(node.issued().is_empty());
}
