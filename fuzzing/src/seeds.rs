//! Seed inputs made by the code's own emitters: real headers, a real handshake, a
//! real record. `weft-fuzz-seeds` writes them under `fuzz/corpus/`; the corpus test
//! also replays them straight from here, so the seeds follow the emitters.

use std::net::{Ipv4Addr, SocketAddr};

use weft_core::crypto::Cipher;
use weft_core::handshake::Hello;
use weft_core::wire::{DataHeader, RejectReason, RejectRepr, RelayHeader};
use weft_datapath::transport::{Endpoint, Proto, frame};
use weft_peers::topology::{Neighbour, Record};
use weft_peers::{NodeId, reencode_message};

use crate::node::{handshake_transcript, keys};

/// A seed: target, file name, bytes.
pub type Seed = (&'static str, String, Vec<u8>);

fn record() -> Record {
    let key = keys()[1].public;
    let ep = |p, port| Endpoint::new(p, SocketAddr::from(([198, 51, 100, 7], port)));
    signed(Record {
        key,
        seq: 42,
        hostname: "gateway-1".into(),
        overlay: Ipv4Addr::new(10, 9, 0, 2),
        overlay6: Some(std::net::Ipv6Addr::new(0xfd12, 0x3456, 0x789a, 0, 7, 7, 7, 7)),
        endpoints: vec![
            ep(Proto::Udp, 11010),
            ep(Proto::Quic, 443),
            "[2001:db8::1]:8443".parse().map_or_else(
                |_: std::net::AddrParseError| ep(Proto::Tcp, 1),
                |a: SocketAddr| Endpoint::new(Proto::Wss, a),
            ),
        ],
        neighbours: vec![Neighbour {
            node: NodeId::from_bytes([7; 8]),
            rtt_ms: 12,
            loss_pct: 3,
            observed: ep(Proto::Udp, 40001),
        }],
        proxied: vec![
            (Ipv4Addr::new(192, 168, 50, 0).into(), 24),
            (std::net::Ipv6Addr::new(0xfd77, 1, 0, 0, 0, 0, 0, 0).into(), 64),
        ],
        dynamic: true,
        cert: None,
        priority: weft_peers::topology::DEFAULT_PRIORITY,
        unknown_ext: Vec::new(),
        signer: [0; 32],
        sig: [0; 64],
    })
}

/// Signs a record as its origin (B's key) within the fuzzed network.
fn signed(mut r: Record) -> Record {
    r.sign(&keys()[1], crate::node::NET);
    r
}

/// Every seed.
pub fn seeds() -> Vec<Seed> {
    let mut s: Vec<Seed> = Vec::new();
    let mut data = [0u8; 16];
    DataHeader { flags: 1, lane: 0, receiver_index: 0x1234_5678, counter: 99 }.emit(&mut data);
    s.push(("data_header", "seed-data".into(), data.to_vec()));
    s.push(("data_header", "seed-data-tail".into(), [&data[..], &[0xaa; 20]].concat()));
    let hs = handshake_transcript();
    for (i, m) in hs.iter().enumerate() {
        // The proving side's first keepalive follows the handshake: a real data packet.
        let target = if m.first() == Some(&4) { "data_header" } else { "handshake_header" };
        s.push((target, format!("seed-handshake-{i}"), m.clone()));
        let relayed = RelayHeader { hop_limit: 16, dst: [1; 8], src: [2; 8] }.wrap(m);
        s.push(("relay_header", format!("seed-relay-{i}"), relayed));
    }
    for reason in [RejectReason::AuthFailed, RejectReason::BadPayload] {
        s.push((
            "reject",
            format!("seed-reject-{}", reason as u8),
            RejectRepr { reason, receiver_index: 7 }.emit().to_vec(),
        ));
    }
    seed_port_mapping(&mut s);
    for (i, cipher) in Cipher::ALL.into_iter().enumerate() {
        let mut h = Vec::new();
        Hello::new(cipher, Ipv4Addr::new(10, 9, 0, 1), 16, format!("host-é-{i}")).emit(&mut h);
        s.push(("hello", format!("seed-hello-{i}"), h));
    }
    let mut h = Vec::new();
    let v6 = Some((std::net::Ipv6Addr::new(0xfd12, 0x3456, 0x789a, 0, 1, 2, 3, 4), 64));
    Hello {
        ipv6: v6,
        gso: true,
        gso_quic: true,
        ..Hello::new(Cipher::Aes128Gcm, Ipv4Addr::new(10, 9, 0, 1), 16, "six")
    }
    .emit(&mut h);
    s.push(("hello", "seed-hello-ipv6".into(), h));
    let mut rec = Vec::new();
    record().emit(&mut rec);
    s.push(("record", "seed-record".into(), rec.clone()));
    let mut empty = Vec::new();
    signed(Record { endpoints: Vec::new(), neighbours: Vec::new(), proxied: Vec::new(), dynamic: false, ..record() })
        .emit(&mut empty);
    s.push(("record", "seed-record-bare".into(), empty));
    // Control messages: tag 1 record, 2 ping, 3 pong, 4 punch (count, addresses as in
    // records). Each is checked to parse by the test below.
    let ping = [&[2u8][..], &7u64.to_le_bytes()].concat();
    let pong = [&[3u8][..], &7u64.to_le_bytes()].concat();
    s.push(("control", "seed-record".into(), [&[1u8][..], &rec].concat()));
    s.push(("control", "seed-ping".into(), ping));
    s.push(("control", "seed-pong".into(), pong));
    let addr = |tag: u8, ip: &[u8], port: u16| [&[tag][..], ip, &port.to_le_bytes()].concat();
    let mut punch = vec![4u8, 2];
    punch.extend(addr(0x04, &[198, 51, 100, 7], 11010));
    punch.extend(addr(0x16, &[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 443));
    s.push(("control", "seed-punch".into(), punch));
    // A member certificate with every field, a bare one, and a revocation.
    let authority = weft_core::cert::AuthorityKey::from_seed([3; 32]);
    let full = weft_core::cert::CertBody {
        authority: authority.id(),
        node: keys()[1].public,
        network: "fuzz".into(),
        name: "gateway-1".into(),
        ipv4: (Ipv4Addr::new(10, 9, 0, 2), 16),
        ipv6: Some((std::net::Ipv6Addr::new(0xfd12, 0x3456, 0x789a, 0, 7, 7, 7, 7), 64)),
        groups: vec!["dev".into(), "ops".into()],
        subnets: vec![weft_core::cert::Prefix { addr: [192, 168, 50, 0].into(), len: 24 }],
        exit: true,
        portal: true,
        not_before: 1_800_000_000,
        not_after: 1_900_000_000,
        issued: Some(1_800_000_000),
        issuer: true,
    };
    // Format 1: no issue time, no issuer mark.
    let bare = weft_core::cert::CertBody {
        network: String::new(),
        ipv6: None,
        groups: Vec::new(),
        subnets: Vec::new(),
        exit: false,
        portal: false,
        issued: None,
        issuer: false,
        ..full.clone()
    };
    for (name, body) in [("seed-cert", full), ("seed-cert-bare", bare)] {
        s.push(("cert", name.into(), body.sign(&authority).unwrap().to_bytes()));
    }
    let revocation = weft_core::cert::Revocation::issue(&authority, keys()[2].public, 1_800_000_000);
    s.push(("cert", "seed-revocation".into(), revocation.to_bytes()));
    // An access policy with every kind of selector, and a packet the table reads.
    let policy = "[hosts]\nweb = \"10.126.0.7\"\n[groups]\nadmins = [\"alice\", \"10.126.0.0/28\", \"group:ops\"]\nops = [\"fd00::/64\"]\n\
                  [[allow]]\nfrom = [\"group:admins\"]\nto = [\"group:servers\", \"db\", \"internet\"]\nproto = \"tcp\"\nports = [\"22\", \"8000-8099\"]\n\
                  [[allow]]\nfrom = [\"*\"]\nto = [\"web\"]\nproto = \"icmp\"\n\
                  [[test]]\nfrom = \"alice\"\nto = \"db:22\"\nallow = true\n";
    s.push(("policy", "seed-policy".into(), policy.as_bytes().to_vec()));
    let signed = weft_core::policy::SignedPolicy::sign(&authority, "office", 7, policy).unwrap().to_bytes();
    s.push(("policy", "seed-signed-policy".into(), signed.clone()));
    // Control message 9: a piece of a signed policy (version, part, parts, bytes).
    let part = [&[9u8][..], &7u64.to_le_bytes(), &0u16.to_le_bytes(), &1u16.to_le_bytes(), &signed[..200]].concat();
    s.push(("control", "seed-policy-part".into(), part));
    let invite = weft_core::invite::InviteBody {
        authority: authority.id(),
        id: [5; 32],
        expires: 1_800_000_000,
        uses: 3,
        lifetime: 86_400,
        network: "fuzz".into(),
        groups: vec!["dev".into()],
    }
    .sign(&authority)
    .unwrap();
    s.push(("cert", "seed-invite".into(), invite.to_bytes()));
    let token = weft_core::invite::Token {
        secret: "a secret".into(),
        entry_points: vec!["udp://198.51.100.7:11010".into()],
        invite: invite.clone(),
    };
    s.push(("cert", "seed-token".into(), token.to_bytes().unwrap()));
    // A join's hello (with the invite) and an issuer's two answers.
    for (name, join, issued, refused) in [
        ("seed-hello-join", Some(invite.to_bytes()), None, None),
        ("seed-hello-issued", None, Some(revocation.to_bytes()), None),
        ("seed-hello-join-refused", None, None, Some("the invite is used up".to_owned())),
    ] {
        let mut h = Vec::new();
        Hello {
            cipher: Cipher::Aes128Gcm,
            ipv4: Ipv4Addr::UNSPECIFIED,
            prefix: 0,
            hostname: "new".into(),
            ipv6: None,
            gso: false,
            gso_quic: false,
            protocol: Some(weft_core::handshake::Protocol::ours(0)),
            stamp: None,
            cert: None,
            join,
            issued,
            join_refused: refused,
            secrets: vec![[7; 8]],
        }
        .emit(&mut h);
        s.push(("hello", name.into(), h));
    }
    // Control message 8: a revocation passed on by a member.
    s.push(("control", "seed-revocation".into(), [&[8u8][..], &revocation.to_bytes()].concat()));
    let mut batch = Vec::new();
    for m in &hs {
        frame::push(&mut batch, m);
    }
    s.push(("stream_frames", "seed-handshake-batch".into(), batch.clone()));
    s.push(("stream_frames", "seed-cut".into(), batch[..batch.len() - 3].to_vec()));
    assert!(
        s.iter().filter(|x| x.0 == "control").all(|x| reencode_message(&x.2).is_some()),
        "a control seed does not parse"
    );
    s
}

/// Router answers to port-mapping requests: a PCP mapping and refusal, NAT-PMP's
/// external address, mapping and refusal, miniupnpd's recorded UPnP answers.
fn seed_port_mapping(s: &mut Vec<Seed>) {
    use weft_core::portmap::{Protocol, pcp, pmp};
    let mapping = pcp::Mapping {
        nonce: [7; 12],
        protocol: Protocol::Udp,
        internal_port: 11010,
        external_port: 11010,
        external_ip: Ipv4Addr::new(100, 200, 0, 2).into(),
    };
    let ok = pcp::Response { result: pcp::ResultCode::Success, lifetime: 7200, epoch: 1, mapping: Some(mapping) };
    s.push(("pcp_response", "seed-pcp-map".into(), ok.emit()));
    let refused = pcp::Response { result: pcp::ResultCode::NotAuthorized, lifetime: 30, epoch: 9, mapping: None };
    s.push(("pcp_response", "seed-pcp-refused".into(), refused.emit()));
    let answers = [
        ("seed-pmp-external", pmp::ResultCode::Success, pmp::Answer::ExternalAddress(Ipv4Addr::new(100, 200, 0, 2))),
        (
            "seed-pmp-map",
            pmp::ResultCode::Success,
            pmp::Answer::Mapped { protocol: Protocol::Udp, internal_port: 11010, external_port: 11010, lifetime: 7200 },
        ),
        ("seed-pmp-refused", pmp::ResultCode::OutOfResources, pmp::Answer::Refused { op: 1 }),
    ];
    for (name, result, answer) in answers {
        s.push(("pmp_response", name.into(), pmp::Response { result, epoch: 1, answer }.emit()));
    }
    for (name, bytes) in crate::upnp::seeds() {
        s.push(("upnp_gateway", name, bytes));
    }
}
