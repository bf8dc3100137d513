//! Handshake admission against one real engine: outsiders cost no Diffie-Hellman and
//! leave no trace, floods are answered with cookies and bounded tables, and nothing
//! about an unproven initiator is acted on.
// The virtual clock starts at a real instant; the engine itself never reads it.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use weft_bench::harness;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use weft_bench::harness::static_key;
use weft_core::admission::MacKeys;
use weft_core::crypto::Cipher;
use weft_core::endpoint::Endpoint;
use weft_core::handshake::{Initiator, Params, Stamp};
use weft_core::wire::{HandshakeHeader, MessageType};
use weft_peers::node::{Action, Input, MAX_PENDING_RESP, Node};
use weft_peers::{Config, NodeId, Timers};

const NET: &str = "admission";
const SECRET: &str = "correct horse battery staple";

fn params(i: u64, secret: &str, ipv4: Ipv4Addr) -> Params {
    let key = static_key(&mut ChaCha8Rng::seed_from_u64(0xad00 + i));
    harness::params(key, NET, secret, Cipher::Aes128Gcm, ipv4, format!("n{i}"))
}

fn responder(epoch: Instant, dynamic: bool) -> Node {
    let me: Endpoint = Endpoint::udp(SocketAddr::from(([192, 0, 2, 1], 11010)));
    let mut cfg: Config =
        harness::config(params(0, SECRET, Ipv4Addr::new(10, 9, 0, 1)), vec![], epoch, Timers::default(), me);
    if dynamic {
        cfg.dynamic = Some((Ipv4Addr::new(10, 9, 0, 0), 16));
    }
    let mut node = Node::new(cfg, Box::new(ChaCha8Rng::seed_from_u64(7)));
    node.handle_timeout(epoch);
    while node.poll_action().is_some() {}
    node
}

/// An init as a node with `p` would send it (MACed with `p`'s PSK).
fn init(p: &Params, remote: Option<&[u8; 32]>, sender_index: u32) -> Vec<u8> {
    // Each index its own, later stamp (IK inits of one key must grow).
    let stamp = Stamp::from_unix(Duration::from_secs(1_900_000_000 + u64::from(sender_index)));
    let (i, msg) = Initiator::start(p, remote, stamp).unwrap();
    let mut b = Vec::new();
    HandshakeHeader { kind: MessageType::HandshakeInit, pattern: i.pattern(), sender_index, receiver_index: 0 }
        .emit(&mut b);
    b.extend_from_slice(&msg);
    MacKeys::new(&p.psk).seal(&mut b, None);
    b
}

fn spoofed(i: u32) -> Endpoint {
    let [a, b] = (i as u16).to_be_bytes();
    Endpoint::udp(SocketAddr::from(([198, 51, a, b], 40000)))
}

fn sends(node: &mut Node) -> Vec<(Endpoint, Vec<u8>)> {
    let mut v = Vec::new();
    while let Some(a) = node.poll_action() {
        if let Action::Send { to, bytes } = a {
            v.push((to, bytes));
        }
    }
    v
}

#[test]
fn outsiders_cost_no_dh_and_leave_no_trace() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let outsider = params(1, "a guessed secret", Ipv4Addr::new(10, 9, 0, 2));
    let b_public = params(0, SECRET, Ipv4Addr::new(10, 9, 0, 1)).local.public;
    let mut junk = init(&outsider, None, 5);
    let mut unmaced = junk[..junk.len() - 32].to_vec();
    unmaced.extend_from_slice(&[0; 32]);
    junk[20] ^= 1;
    let inputs =
        [init(&outsider, None, 1), init(&outsider, Some(&b_public), 2), unmaced, junk, vec![5, 1, 0, 0, 9, 0, 0, 0]];
    for (i, bytes) in inputs.iter().enumerate() {
        b.handle(epoch, Input::Datagram { from: spoofed(i as u32), via: None, bytes });
    }
    assert!(sends(&mut b).is_empty(), "an outsider got an answer");
    let st = b.status(epoch);
    assert!(st.inbound_failures.is_empty() && st.peers.is_empty(), "outsiders left a trace: {st:?}");
    assert_eq!(b.admission(epoch).bad_mac, 5);
}

#[test]
fn a_member_init_is_answered() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    b.handle(epoch, Input::Datagram { from: spoofed(1), via: None, bytes: &init(&member, None, 1) });
    let out = sends(&mut b);
    assert_eq!(out.len(), 1);
    assert_eq!(MessageType::of(&out[0].1), Some(MessageType::HandshakeResponse));
    assert!(MacKeys::new(&member.psk).check(&out[0].1).is_some(), "the response carries mac1");
}

#[test]
fn a_flood_is_answered_with_cookies_not_dh() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    let replay = init(&member, None, 77);
    let (mut responses, mut cookies) = (0, 0);
    for i in 0..1000u32 {
        b.handle(epoch, Input::Datagram { from: spoofed(i), via: None, bytes: &replay });
        for (_, bytes) in sends(&mut b) {
            match MessageType::of(&bytes) {
                Some(MessageType::HandshakeResponse) => responses += 1,
                Some(MessageType::CookieReply) => {
                    assert!(bytes.len() < replay.len(), "a cookie reply never amplifies");
                    cookies += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // The first LOAD_INITS_PER_SEC cost a DH; after that only cookies.
    assert_eq!(responses, weft_peers::node::LOAD_INITS_PER_SEC as usize);
    assert_eq!(cookies, 1000 - responses);
    let a = b.admission(epoch);
    assert!(a.under_load);
    assert_eq!(a.cookies_sent, cookies as u64);
    // The load lasts one more second after its window, then it is gone.
    assert!(b.admission(epoch + Duration::from_millis(1500)).under_load);
    assert!(!b.admission(epoch + Duration::from_secs(2)).under_load);
}

#[test]
fn one_source_cannot_take_every_slot() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    let replay = init(&member, None, 77);
    let mut answered = 0;
    for _ in 0..200 {
        b.handle(epoch, Input::Datagram { from: spoofed(1), via: None, bytes: &replay });
        answered += sends(&mut b).len();
    }
    assert_eq!(answered, weft_peers::node::SOURCE_BURST as usize);
    assert_eq!(b.admission(epoch).rate_limited, 200 - answered as u64);
    // Another address is not affected, and the source's bucket refills.
    b.handle(epoch, Input::Datagram { from: spoofed(2), via: None, bytes: &replay });
    assert_eq!(sends(&mut b).len(), 1);
    let later = epoch + Duration::from_secs(1);
    b.handle(later, Input::Datagram { from: spoofed(1), via: None, bytes: &replay });
    assert_eq!(sends(&mut b).len(), 1);
}

#[test]
fn pending_responses_are_capped() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    let replay = init(&member, None, 77);
    // Below the load threshold (200 a second), from many sources, for long enough to
    // exceed the table if it were not capped (the XX timeout is 10 s).
    let mut answered = 0;
    for s in 0..60u32 {
        let now = epoch + Duration::from_millis(u64::from(s) * 100);
        for i in 0..20u32 {
            b.handle(now, Input::Datagram { from: spoofed(s * 20 + i), via: None, bytes: &replay });
            answered += sends(&mut b).len();
        }
    }
    // Half full is load: the rest are asked for cookies (a spoofed source never gets
    // one), so the table never fills and a real member still gets in.
    assert_eq!(answered, 1200);
    let a = b.admission(epoch);
    assert_eq!(a.cookies_sent, 1200 - MAX_PENDING_RESP as u64 / 2);
    assert_eq!(a.evicted, 0);
    assert!(b.admission(epoch + Duration::from_secs(6)).under_load, "the table is still half full");
}

#[test]
fn relayed_inits_are_limited_by_the_relaying_neighbour_too() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    let replay = init(&member, None, 77);
    // One neighbour relays inits under random sender ids: each id is fresh, the
    // neighbour's budget is not.
    let mut answered = 0;
    for i in 0..400u64 {
        let sender = NodeId::from_bytes((0x5eed_0000 + i).to_be_bytes());
        b.handle(epoch, Input::Datagram { from: spoofed(1), via: Some(sender), bytes: &replay });
        answered += sends(&mut b).len();
    }
    assert_eq!(answered, weft_peers::node::RELAY_BURST as usize);
    assert_eq!(b.admission(epoch).rate_limited, 400 - answered as u64);
    // Another neighbour is not affected.
    let sender = NodeId::from_bytes([9; 8]);
    b.handle(epoch, Input::Datagram { from: spoofed(2), via: Some(sender), bytes: &replay });
    assert_eq!(sends(&mut b).len(), 1);
}

#[test]
fn an_unproven_initiator_never_moves_a_dhcp_address() {
    // An IK init that claims our --dhcp address, replayed or sent by someone who
    // never proves the PSK with a data packet: the old engine moved at once.
    let epoch = Instant::now();
    let mut b = responder(epoch, true);
    let b_params = params(0, SECRET, Ipv4Addr::new(10, 9, 0, 1));
    let claimant = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 1));
    b.handle(
        epoch,
        Input::Datagram { from: spoofed(1), via: None, bytes: &init(&claimant, Some(&b_params.local.public), 3) },
    );
    let mut now = epoch;
    for _ in 0..50 {
        now += Duration::from_millis(200);
        b.handle_timeout(now);
        while let Some(a) = b.poll_action() {
            assert!(!matches!(a, Action::SetAddress { .. }), "moved for an unproven claim");
        }
    }
    let st = b.status(now);
    assert!(st.peers.is_empty());
}

/// An init resealed with the cookie of a cookie reply (what an initiator does next).
fn with_cookie(init: &[u8], reply: &[u8], psk_of: &Params) -> Vec<u8> {
    let macs = MacKeys::new(&psk_of.psk);
    let mac1 = weft_core::admission::mac1_of(init);
    let cookie = macs.open_cookie_reply(reply, &mac1).expect("a cookie for this init");
    let mut b = init[..init.len() - 32].to_vec();
    macs.seal(&mut b, Some(&cookie));
    b
}

#[test]
fn a_replayed_ik_init_gets_no_answer_and_leaves_no_state() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let b_public = params(0, SECRET, Ipv4Addr::new(10, 9, 0, 1)).local.public;
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    let captured = init(&member, Some(&b_public), 7);
    b.handle(epoch, Input::Datagram { from: spoofed(1), via: None, bytes: &captured });
    assert_eq!(sends(&mut b).len(), 1, "the first copy is answered");
    // The same init again, from anywhere, later: one DH, then nothing.
    for (i, s) in [1, 2, 3, 40].into_iter().enumerate() {
        let now = epoch + Duration::from_millis(100 * i as u64);
        b.handle(now, Input::Datagram { from: spoofed(s), via: None, bytes: &captured });
        assert!(sends(&mut b).is_empty(), "a replay from {s} was answered");
    }
    assert_eq!(b.admission(epoch).replayed, 4);
    // An older init of the same key (made before the one accepted) is a replay too;
    // a newer one is a new handshake.
    b.handle(epoch, Input::Datagram { from: spoofed(1), via: None, bytes: &init(&member, Some(&b_public), 6) });
    assert!(sends(&mut b).is_empty());
    b.handle(epoch, Input::Datagram { from: spoofed(1), via: None, bytes: &init(&member, Some(&b_public), 8) });
    assert_eq!(sends(&mut b).len(), 1);
    assert_eq!(b.admission(epoch).replayed, 5);
}

#[test]
fn an_unproven_sender_never_draws_more_bytes_than_it_sent() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    // Inits as this release sends them are padded to their answer's size.
    let padded = init(&member, None, 7);
    b.handle(epoch, Input::Datagram { from: spoofed(1), via: None, bytes: &padded });
    let answers = sends(&mut b);
    assert_eq!(answers.len(), 1);
    assert!(answers[0].1.len() <= padded.len(), "{} bytes answered to {}", answers[0].1.len(), padded.len());
    // A responder whose answer is larger than the init (a long host name; or any
    // responder to a release before 0.2.0, which does not pad) sends a cookie,
    // smaller than the init, and the response once the sender proves its address.
    let me = Endpoint::udp(SocketAddr::from(([192, 0, 2, 1], 11010)));
    let mut long = params(0, SECRET, Ipv4Addr::new(10, 9, 0, 1));
    long.hello.hostname = "n".repeat(200);
    let mut b =
        Node::new(harness::config(long, vec![], epoch, Timers::default(), me), Box::new(ChaCha8Rng::seed_from_u64(7)));
    b.handle_timeout(epoch);
    while b.poll_action().is_some() {}
    b.handle(epoch, Input::Datagram { from: spoofed(2), via: None, bytes: &padded });
    let cookie = sends(&mut b);
    assert_eq!(cookie.len(), 1);
    assert_eq!(MessageType::of(&cookie[0].1), Some(MessageType::CookieReply));
    assert!(cookie[0].1.len() < padded.len(), "the cookie reply is smaller than the init");
    b.handle(
        epoch,
        Input::Datagram { from: spoofed(2), via: None, bytes: &with_cookie(&padded, &cookie[0].1, &member) },
    );
    let answers = sends(&mut b);
    assert_eq!(answers.len(), 1);
    assert_eq!(MessageType::of(&answers[0].1), Some(MessageType::HandshakeResponse));
    assert!(answers[0].1.len() > padded.len(), "only a proven sender draws the larger answer");
}

#[test]
fn a_full_table_drops_its_oldest_unproven_entry_not_the_newcomer() {
    let epoch = Instant::now();
    let mut b = responder(epoch, false);
    let member = params(1, SECRET, Ipv4Addr::new(10, 9, 0, 2));
    let replay = init(&member, None, 77);
    // Sources that receive (they return the cookie): past half the table that is
    // asked of everyone, and the table still takes every newcomer.
    let total = MAX_PENDING_RESP as u32 + 100;
    let mut answered = 0;
    for s in 0..total {
        let now = epoch + Duration::from_millis(u64::from(s) * 4);
        b.handle(now, Input::Datagram { from: spoofed(s), via: None, bytes: &replay });
        let mut out = sends(&mut b);
        if let [(_, reply)] = out.as_slice()
            && MessageType::of(reply) == Some(MessageType::CookieReply)
        {
            let proven = with_cookie(&replay, reply, &member);
            b.handle(now, Input::Datagram { from: spoofed(s), via: None, bytes: &proven });
            out = sends(&mut b);
        }
        assert_eq!(out.len(), 1, "source {s} got no answer");
        assert_eq!(MessageType::of(&out[0].1), Some(MessageType::HandshakeResponse));
        answered += 1;
    }
    assert_eq!(answered, total);
    let a = b.admission(epoch);
    assert_eq!(a.evicted, u64::from(total) - MAX_PENDING_RESP as u64);
    assert_eq!(a.rate_limited, 0);
}
