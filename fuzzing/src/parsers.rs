//! One target per parser of peer bytes. Each parses arbitrary input and, when it
//! parses, checks that encoding the result again gives the same bytes back (or at
//! least parses to the same value).

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use weft_core::cert::{AuthorityId, Certificate, Revocation};
use weft_core::handshake::Hello;
use weft_core::invite::{Invite, Token};
use weft_core::portmap::{EpochWatch, pcp, pmp};
use weft_core::wire::{
    DATA_HEADER_LEN, DataHeader, HANDSHAKE_HEADER_LEN, HandshakeHeader, RELAY_HEADER_LEN, RejectRepr, RelayHeader,
};
use weft_datapath::transport::conn::{Reassembly, fragment};
use weft_datapath::transport::frame::{self, FrameError};
use weft_peers::topology::Record;

/// `DataHeader::parse`: a header that parses emits the same 16 bytes.
pub fn data_header(data: &[u8]) {
    if let Ok(h) = DataHeader::parse(data) {
        let mut out = [0u8; DATA_HEADER_LEN];
        h.emit(&mut out);
        assert_eq!(out[..], data[..DATA_HEADER_LEN]);
    }
}

/// `HandshakeHeader::parse`: the header emits the same 12 bytes and the Noise
/// message is exactly the rest.
pub fn handshake_header(data: &[u8]) {
    if let Ok((h, rest)) = HandshakeHeader::parse(data) {
        let mut out = Vec::new();
        h.emit(&mut out);
        assert_eq!(out[..], data[..HANDSHAKE_HEADER_LEN]);
        assert_eq!(rest, &data[HANDSHAKE_HEADER_LEN..]);
    }
}

/// `RejectRepr::parse`: parse → emit → parse is the identity.
pub fn reject(data: &[u8]) {
    if let Ok(r) = RejectRepr::parse(data) {
        assert_eq!(RejectRepr::parse(&r.emit()), Ok(r));
    }
}

/// `RelayHeader::parse`: the header emits the same 20 bytes and wraps the rest back
/// into the input.
pub fn relay_header(data: &[u8]) {
    if let Ok(h) = RelayHeader::parse(data) {
        let mut out = [0u8; RELAY_HEADER_LEN];
        h.emit(&mut out);
        assert_eq!(out[..], data[..RELAY_HEADER_LEN]);
        assert_eq!(h.wrap(&data[RELAY_HEADER_LEN..]), data);
    }
}

/// `Hello::parse` (the payload of every handshake message): a hello that parses has
/// no control character in its host name and emits the bytes it was parsed from
/// (trailing bytes ignored; a replaced control character aside).
pub fn hello(data: &[u8]) {
    if let Ok(h) = Hello::parse(data) {
        assert!(!h.hostname.chars().any(char::is_control), "a control character in a host name got through");
        let refused = h.join_refused.as_deref().unwrap_or_default();
        assert!(!refused.chars().any(char::is_control), "a control character in a join refusal got through");
        let mut out = Vec::new();
        h.emit(&mut out);
        // Byte for byte the input's prefix, unless parse replaced control characters in
        // the host name or the join refusal (with '?', which may be shorter than the
        // character): with no '?' in either, nothing was replaced.
        if !h.hostname.contains('?') && !refused.contains('?') {
            assert_eq!(out[..], data[..out.len()]);
        }
        assert_eq!(Hello::parse(&out).ok(), Some(h));
    }
}

/// `Certificate::from_bytes`, `Revocation::from_bytes`, `Invite::from_bytes` and
/// `Token::from_bytes` (member certificates, revocations and invites, carried by
/// handshakes, records and `--join` tokens): what parses encodes back to the input
/// byte for byte and through the text form, and checking it never panics.
pub fn cert(data: &[u8]) {
    if let Ok(c) = Certificate::from_bytes(data) {
        assert_eq!(c.to_bytes(), data);
        assert_eq!(Certificate::from_text(&c.to_text()).as_ref(), Ok(&c));
        let b = c.body();
        let _ = c.check(&[b.authority, AuthorityId([0; 32])], &b.network, &b.node, b.not_before);
    }
    if let Ok(r) = Revocation::from_bytes(data) {
        assert_eq!(r.to_bytes(), data);
        assert_eq!(Revocation::from_text(&r.to_text()).as_ref(), Ok(&r));
        let _ = r.verify(&[r.authority]);
    }
    if let Ok(i) = Invite::from_bytes(data) {
        assert_eq!(i.to_bytes(), data);
        let _ = i.verify(&[i.body().authority]);
    }
    if let Ok(t) = Token::from_bytes(data) {
        assert_eq!(t.to_bytes().as_deref(), Ok(data));
        let text = t.to_text().unwrap_or_default();
        assert_eq!(Token::from_text(&text).as_ref(), Ok(&t));
    }
}

/// `Record::parse` (topology records flooded by members): parse → emit → parse is
/// the identity and the encoding is the input's prefix.
pub fn record(data: &[u8]) {
    if let Ok(r) = Record::parse(data) {
        let mut out = Vec::new();
        r.emit(&mut out);
        assert_eq!(Record::parse(&out).as_ref(), Ok(&r));
        assert_eq!(out[..], data[..out.len()]);
    }
}

/// Control messages inside sessions (`Msg::parse`, through
/// `weft_peers::reencode_message`): encoding is idempotent after one round.
pub fn control(data: &[u8]) {
    if let Some(out) = weft_peers::reencode_message(data) {
        assert_eq!(weft_peers::reencode_message(&out).as_deref(), Some(&out[..]));
    }
}

/// Stream framing (`frame::complete_prefix`, `frame::frames`): the complete prefix
/// re-frames to itself, the rest is one incomplete frame, and a stream that is not
/// our framing is refused by both functions alike.
pub fn stream_frames(data: &[u8]) {
    match frame::complete_prefix(data) {
        Ok(n) => {
            assert!(n <= data.len());
            let mut again = Vec::new();
            for f in frame::frames(&data[..n]) {
                let f = f.unwrap_or_else(|e| panic!("complete prefix holds a bad frame: {e}"));
                assert!(frame::push(&mut again, f));
            }
            assert_eq!(again[..], data[..n]);
            if n < data.len() {
                assert_eq!(frame::frames(&data[n..]).next(), Some(Err(FrameError::Truncated)));
            }
        }
        Err(_) => assert!(frame::frames(data).any(|f| f.is_err())),
    }
}

/// Input of [`quic_reassembly`].
#[derive(Debug, Arbitrary)]
struct QuicInput {
    mtu: u16,
    /// Datagrams as a peer could send them.
    datagrams: Vec<Vec<u8>>,
    /// Frames to fragment at a datagram size and reassemble.
    frames: Vec<(Vec<u8>, u16, u16)>,
}

/// QUIC fragment reassembly (`conn::Reassembly`): arbitrary datagrams never panic
/// and never yield an empty frame or a fragmented one larger than the MTU; frames cut
/// by `conn::fragment` come back whole.
pub fn quic_reassembly(data: &[u8]) {
    let Ok(input) = QuicInput::arbitrary_take_rest(Unstructured::new(data)) else { return };
    let mtu = usize::from(input.mtu.max(576));
    let mut r = Reassembly::default();
    for d in &input.datagrams {
        if let Ok(Some(f)) = r.push(&Bytes::copy_from_slice(d), mtu) {
            assert!(!f.is_empty());
            assert!(f.len() <= mtu || d.first() == Some(&0), "fragmented frame over the MTU");
        }
    }
    for (f, max, id) in &input.frames {
        let max = usize::from(*max).max(64);
        let parts = fragment(f, max, *id);
        if f.is_empty() || f.len() > mtu || parts.is_empty() {
            continue;
        }
        assert!(parts.iter().all(|p| p.len() <= max), "a fragment over the datagram size");
        let mut r = Reassembly::default();
        let mut got = None;
        // Last fragment first: order does not matter.
        for p in parts.iter().rev() {
            got = r.push(p, mtu).unwrap_or_else(|e| panic!("own fragment refused: {e}"));
        }
        assert_eq!(got.as_deref(), Some(&f[..]));
    }
}

/// `Policy::parse` (access policy files, and the text of signed policies a member
/// passes on), `SignedPolicy::from_bytes` (what members pass on) and
/// `firewall::Packet::parse` (every packet the connection table reads): what parses compiles and answers queries without panicking, and the
/// compiled matcher agrees with itself on a second compile.
pub fn policy(data: &[u8]) {
    use std::net::IpAddr;
    use weft_core::policy::{Member, Policy};
    let _ = weft_core::firewall::Packet::parse(data);
    if let Ok(sp) = weft_core::policy::SignedPolicy::from_bytes(data) {
        assert_eq!(sp.to_bytes(), data);
        assert_eq!(weft_core::policy::SignedPolicy::from_text(&sp.to_text()).as_ref(), Ok(&sp));
        let _ = sp.verify(&[sp.authority]);
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(p) = Policy::parse(text) else { return };
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let members = [
        Member {
            node_id: "ab".repeat(8),
            key: "ab".repeat(32),
            name: "db".into(),
            addrs: vec![ip("10.126.0.5"), ip("fd00::5")],
            groups: vec!["servers".into()],
            subnets: vec![(ip("192.168.1.0"), 24)],
        },
        Member {
            node_id: "cd".repeat(8),
            key: "cd".repeat(32),
            name: "alice".into(),
            addrs: vec![ip("10.126.0.6")],
            ..Member::default()
        },
    ];
    let overlay = [(ip("10.126.0.0"), 16), (ip("fd00::"), 64)];
    let c = p.compile(&members, &overlay);
    let again = p.compile(&members, &overlay);
    let _ = p.check_known_tests(&members, &overlay);
    let _ = weft_core::policy::unresolved(&p, &members);
    for (s, d) in [
        ("10.126.0.6", "10.126.0.5"),
        ("10.126.0.5", "1.1.1.1"),
        ("fd00::9", "fd00::5"),
        ("0.0.0.0", "255.255.255.255"),
    ] {
        for (proto, port) in [(6, 22), (17, 53), (1, 0), (47, 0)] {
            assert_eq!(c.allows(ip(s), ip(d), proto, port), again.allows(ip(s), ip(d), proto, port));
        }
    }
}

/// `pcp::Response::parse` (what any host on the LAN may send a node asking its router
/// for a port): an answer that parses encodes back to one that parses the same, and
/// its epoch goes through the restart check.
pub fn pcp_response(data: &[u8]) {
    if let Ok(r) = pcp::Response::parse(data) {
        assert_eq!(pcp::Response::parse(&r.emit()), Ok(r));
        let mut w = EpochWatch::default();
        w.observe(std::time::Duration::ZERO, r.epoch);
        w.observe(std::time::Duration::from_secs(u64::from(r.lifetime)), r.epoch.wrapping_add(r.lifetime));
    }
}

/// `pmp::Response::parse` (NAT-PMP answers, from the LAN): an answer that parses
/// encodes back to one that parses the same.
pub fn pmp_response(data: &[u8]) {
    if let Ok(r) = pmp::Response::parse(data) {
        assert_eq!(pmp::Response::parse(&r.emit()), Ok(r));
    }
}
