//! The topology database: every node's self-description, flooded through the mesh,
//! and the shortest paths computed from it.
//!
//! Each node publishes a [`Record`] with a sequence number: who it is, its overlay
//! address, where it can be reached, and its direct neighbours with measured latency.
//! A record replaces an older one from the same node. Records are not refreshed
//! periodically: neighbours compare digests instead ([`Topology::summary`],
//! [`Topology::digest`]). A record whose node has been unreachable for
//! [`RECORD_TTL`] is dropped. Links count only when both ends list each other.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use std::time::{Duration, Instant};
use weft_core::endpoint::{Endpoint, Proto};

use thiserror::Error;

use crate::identity::NodeId;

/// A record whose node has been unreachable (no path in the graph of links) for this
/// long is dropped.
pub const RECORD_TTL: Duration = Duration::from_secs(60);
/// Longest usable path: a relayed frame crosses at most `MAX_HOPS` relays.
pub const MAX_LINKS: u32 = weft_core::wire::MAX_HOPS as u32 + 1;
/// Most neighbours a record may carry.
pub const MAX_NEIGHBOURS: usize = 255;
/// Most endpoints a record may carry.
pub const MAX_ENDPOINTS: usize = 32;
/// Most proxied subnets a record may carry.
pub const MAX_SUBNETS: usize = 32;
/// Most records a node holds (its own always fits).
pub const MAX_RECORDS: usize = 4096;
/// Highest sequence number accepted. A node bumps its own once per change, so it never
/// gets near; a record above it (which would leave its origin no newer number to
/// publish) is refused.
pub const MAX_SEQ: u64 = 1 << 62;
const RECORD_VERSION: u8 = 4;
/// A record with the origin's member certificate after its subnets (written only by
/// nodes that have one: in networks without an authority records stay version 4,
/// which 0.2.0 reads).
const RECORD_VERSION_CERT: u8 = 5;
/// A record with extensions: version 5's layout with the certificate's length always
/// present (0: none), then a block of tagged extensions (`tag`, `len`, bytes) in
/// strictly ascending tag order. Unknown tags are kept verbatim, so a record from a
/// later release re-encodes to the bytes its origin signed. Written only when an
/// extension differs from its default, so records of nodes that use none stay
/// readable by older releases; the encoding is canonical (no default written out, no
/// empty block), since the signature covers the re-encoded body.
const RECORD_VERSION_EXT: u8 = 6;
/// Extension tag: the router priority ([`Record::priority`], one byte).
const EXT_PRIORITY: u8 = 1;
/// The router priority of a record that does not say one.
pub const DEFAULT_PRIORITY: u8 = 100;
/// Domain separation of record signatures.
const SIGN_CONTEXT: &[u8] = b"weft/v1/record\0";

/// A direct neighbour in a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// Its id.
    pub node: NodeId,
    /// Smoothed round-trip time in milliseconds (0 if not measured yet).
    pub rtt_ms: u32,
    /// Recent probe loss on the link, in percent (0–100).
    pub loss_pct: u8,
    /// The address we see it at (its public side, behind NAT).
    pub observed: Endpoint,
}

/// One node's self-description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The node's static public key (its id derives from it).
    pub key: [u8; 32],
    /// The node's Ed25519 public key; its Montgomery form must be `key`.
    pub signer: [u8; 32],
    /// Increases with every change; the highest wins.
    pub seq: u64,
    /// Host name.
    pub hostname: String,
    /// Overlay address.
    pub overlay: Ipv4Addr,
    /// IPv6 overlay address, when the node has one.
    pub overlay6: Option<Ipv6Addr>,
    /// Addresses the node listens on (as it knows them).
    pub endpoints: Vec<Endpoint>,
    /// Direct neighbours.
    pub neighbours: Vec<Neighbour>,
    /// Subnets behind the node that it forwards for the mesh (`--proxy-network`),
    /// either family.
    pub proxied: Vec<(IpAddr, u8)>,
    /// The overlay address was picked by `--dhcp` and moves on a conflict.
    pub dynamic: bool,
    /// The origin's member certificate (encoded), in a network with an authority:
    /// what its record may claim.
    pub cert: Option<Vec<u8>>,
    /// Its preference as a router of its proxied subnets (`--router-priority`):
    /// among members proxying one subnet the highest is primary, then the lowest node
    /// id. [`DEFAULT_PRIORITY`] unless set.
    pub priority: u8,
    /// Extensions this release does not know (tag, bytes), in ascending tag order:
    /// carried so the signature over a later release's record still verifies.
    pub unknown_ext: Vec<(u8, Vec<u8>)>,
    /// The origin's Ed25519 signature of [`Record::signed_message`].
    pub sig: [u8; 64],
}

/// A record that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("malformed topology record")]
pub struct BadRecord;

impl Record {
    /// An unsigned record of `key` at `overlay` with nothing else in it (sequence 1,
    /// no endpoints, links or subnets, the default priority): tests build theirs on it.
    #[cfg(test)]
    pub(crate) fn blank(key: [u8; 32], hostname: &str, overlay: Ipv4Addr) -> Self {
        Self {
            key,
            signer: [0; 32],
            seq: 1,
            hostname: hostname.into(),
            overlay,
            overlay6: None,
            endpoints: Vec::new(),
            neighbours: Vec::new(),
            proxied: Vec::new(),
            dynamic: false,
            cert: None,
            priority: DEFAULT_PRIORITY,
            unknown_ext: Vec::new(),
            sig: [0; 64],
        }
    }

    /// The node's id.
    pub fn node(&self) -> NodeId {
        NodeId::from_public(&self.key)
    }

    /// Appends the encoding (the signed body, then the signature) to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        self.emit_body(out);
        out.extend_from_slice(&self.sig);
    }

    /// What the origin signs: a context naming the network, then the canonical body
    /// (everything but the signature, as [`Record::emit`] writes it).
    pub fn signed_message(&self, network: &str) -> Vec<u8> {
        let mut m = SIGN_CONTEXT.to_vec();
        let net = &network.as_bytes()[..network.len().min(255)];
        m.push(net.len() as u8);
        m.extend_from_slice(net);
        self.emit_body(&mut m);
        m
    }

    /// Signs the record with the origin's key (whose public halves it must carry).
    pub fn sign(&mut self, key: &weft_core::handshake::StaticKey, network: &str) {
        self.key = key.public;
        self.signer = key.signing_public;
        self.sig = key.sign(&self.signed_message(network));
    }

    /// Whether the record is signed by the node it describes (its Ed25519 key is the
    /// one its X25519 key, and so its id, derives from) within `network`.
    pub fn verify(&self, network: &str) -> bool {
        weft_core::handshake::verify_signed(&self.signer, &self.key, &self.signed_message(network), &self.sig)
    }

    fn emit_body(&self, out: &mut Vec<u8>) {
        let cert = self.cert.as_deref().filter(|c| c.len() <= weft_core::handshake::MAX_HELLO_CERT);
        let mut ext = Vec::new();
        let mut known = Vec::new();
        if self.priority != DEFAULT_PRIORITY {
            known.push((EXT_PRIORITY, std::slice::from_ref(&self.priority)));
        }
        let mut all: Vec<(u8, &[u8])> = known;
        all.extend(self.unknown_ext.iter().filter(|(t, _)| *t != EXT_PRIORITY).map(|(t, b)| (*t, &b[..])));
        all.sort_by_key(|(t, _)| *t);
        all.dedup_by_key(|(t, _)| *t);
        for (tag, body) in all {
            let body = &body[..body.len().min(255)];
            if ext.len() + 2 + body.len() > 255 {
                break;
            }
            ext.push(tag);
            ext.push(body.len() as u8);
            ext.extend_from_slice(body);
        }
        let version = match (ext.is_empty(), cert.is_some()) {
            (false, _) => RECORD_VERSION_EXT,
            (true, true) => RECORD_VERSION_CERT,
            (true, false) => RECORD_VERSION,
        };
        out.push(version);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.signer);
        out.extend_from_slice(&self.seq.to_le_bytes());
        let name = &self.hostname.as_bytes()[..self.hostname.len().min(255)];
        let name = match std::str::from_utf8(name) {
            Ok(s) => s.as_bytes(),
            Err(e) => &name[..e.valid_up_to()],
        };
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&self.overlay.octets());
        match self.overlay6 {
            Some(a) => {
                out.push(6);
                out.extend_from_slice(&a.octets());
            }
            None => out.push(0),
        }
        let eps = &self.endpoints[..self.endpoints.len().min(MAX_ENDPOINTS)];
        out.push(eps.len() as u8);
        for e in eps {
            emit_addr(e, out);
        }
        let ns = &self.neighbours[..self.neighbours.len().min(MAX_NEIGHBOURS)];
        out.push(ns.len() as u8);
        for n in ns {
            out.extend_from_slice(&n.node.to_bytes());
            out.extend_from_slice(&n.rtt_ms.to_le_bytes());
            out.push(n.loss_pct.min(100));
            emit_addr(&n.observed, out);
        }
        out.push(u8::from(self.dynamic));
        let ps = &self.proxied[..self.proxied.len().min(MAX_SUBNETS)];
        out.push(ps.len() as u8);
        for (a, p) in ps {
            match a {
                IpAddr::V4(a) => {
                    out.push(4);
                    out.extend_from_slice(&a.octets());
                }
                IpAddr::V6(a) => {
                    out.push(6);
                    out.extend_from_slice(&a.octets());
                }
            }
            out.push(*p);
        }
        if let Some(c) = cert {
            out.extend_from_slice(&(c.len() as u16).to_le_bytes());
            out.extend_from_slice(c);
        } else if version == RECORD_VERSION_EXT {
            out.extend_from_slice(&0u16.to_le_bytes());
        }
        if version == RECORD_VERSION_EXT {
            out.push(ext.len() as u8);
            out.extend_from_slice(&ext);
        }
    }

    /// Parses a record.
    pub fn parse(b: &[u8]) -> Result<Self, BadRecord> {
        let mut r = Reader(b);
        let version = r.u8()?;
        if !matches!(version, RECORD_VERSION | RECORD_VERSION_CERT | RECORD_VERSION_EXT) {
            return Err(BadRecord);
        }
        let key: [u8; 32] = r.take(32)?.try_into().map_err(|_| BadRecord)?;
        let signer: [u8; 32] = r.take(32)?.try_into().map_err(|_| BadRecord)?;
        let seq = u64::from_le_bytes(r.take(8)?.try_into().map_err(|_| BadRecord)?);
        if seq > MAX_SEQ {
            return Err(BadRecord);
        }
        let n = usize::from(r.u8()?);
        let hostname = std::str::from_utf8(r.take(n)?).map_err(|_| BadRecord)?.to_owned();
        let o = r.take(4)?;
        let overlay = Ipv4Addr::new(o[0], o[1], o[2], o[3]);
        let overlay6 = match r.u8()? {
            0 => None,
            6 => Some(Ipv6Addr::from(<[u8; 16]>::try_from(r.take(16)?).map_err(|_| BadRecord)?)),
            _ => return Err(BadRecord),
        };
        let n = r.u8()?;
        if usize::from(n) > MAX_ENDPOINTS {
            return Err(BadRecord);
        }
        let endpoints = (0..n).map(|_| r.addr()).collect::<Result<_, _>>()?;
        let neighbours = (0..r.u8()?)
            .map(|_| {
                let node = NodeId::from_bytes(r.take(8)?.try_into().map_err(|_| BadRecord)?);
                let rtt_ms = u32::from_le_bytes(r.take(4)?.try_into().map_err(|_| BadRecord)?);
                let loss_pct = r.u8()?;
                if loss_pct > 100 {
                    return Err(BadRecord);
                }
                Ok(Neighbour { node, rtt_ms, loss_pct, observed: r.addr()? })
            })
            .collect::<Result<_, _>>()?;
        let dynamic = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(BadRecord),
        };
        let n = r.u8()?;
        if usize::from(n) > MAX_SUBNETS {
            return Err(BadRecord);
        }
        let proxied = (0..n)
            .map(|_| {
                let (a, max): (IpAddr, u8) = match r.u8()? {
                    4 => (<[u8; 4]>::try_from(r.take(4)?).map_err(|_| BadRecord)?.into(), 32),
                    6 => (<[u8; 16]>::try_from(r.take(16)?).map_err(|_| BadRecord)?.into(), 128),
                    _ => return Err(BadRecord),
                };
                let prefix = r.u8()?;
                if prefix > max {
                    return Err(BadRecord);
                }
                Ok((a, prefix))
            })
            .collect::<Result<_, _>>()?;
        let cert = if version != RECORD_VERSION {
            let n = usize::from(u16::from_le_bytes(r.take(2)?.try_into().map_err(|_| BadRecord)?));
            if n > weft_core::handshake::MAX_HELLO_CERT {
                return Err(BadRecord);
            }
            // Version 6 says "no certificate" with a length of 0.
            (version == RECORD_VERSION_CERT || n > 0).then(|| r.take(n).map(<[u8]>::to_vec)).transpose()?
        } else {
            None
        };
        let mut priority = DEFAULT_PRIORITY;
        let mut unknown_ext = Vec::new();
        if version == RECORD_VERSION_EXT {
            let n = usize::from(r.u8()?);
            if n == 0 {
                // Non-canonical: a record without extensions is version 4 or 5.
                return Err(BadRecord);
            }
            let mut ext = Reader(r.take(n)?);
            let mut last = None;
            while !ext.0.is_empty() {
                let tag = ext.u8()?;
                if last.is_some_and(|l| tag <= l) {
                    return Err(BadRecord);
                }
                last = Some(tag);
                let n = usize::from(ext.u8()?);
                let body = ext.take(n)?;
                match (tag, body) {
                    // The default is never written out.
                    (EXT_PRIORITY, [p]) if *p != DEFAULT_PRIORITY => priority = *p,
                    (EXT_PRIORITY, _) => return Err(BadRecord),
                    // A later release's extension: kept, since it is signed.
                    _ => unknown_ext.push((tag, body.to_vec())),
                }
            }
        }
        let sig: [u8; 64] = r.take(64)?.try_into().map_err(|_| BadRecord)?;
        if !r.0.is_empty() {
            return Err(BadRecord);
        }
        Ok(Self {
            key,
            signer,
            seq,
            hostname,
            overlay,
            overlay6,
            endpoints,
            neighbours,
            proxied,
            dynamic,
            cert,
            priority,
            unknown_ext,
            sig,
        })
    }
}

/// An endpoint on the wire: one byte with the transport code in the high nibble and
/// the address family (4 or 6) in the low one, the address, the port (LE).
pub(crate) fn emit_addr(e: &Endpoint, out: &mut Vec<u8>) {
    let code = e.proto.code() << 4;
    match e.addr {
        SocketAddr::V4(v4) => {
            out.push(code | 4);
            out.extend_from_slice(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            out.push(code | 6);
            out.extend_from_slice(&v6.ip().octets());
        }
    }
    out.extend_from_slice(&e.addr.port().to_le_bytes());
}

pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BadRecord> {
        if self.0.len() < n {
            return Err(BadRecord);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, BadRecord> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn addr(&mut self) -> Result<Endpoint, BadRecord> {
        let tag = self.u8()?;
        let proto = Proto::from_code(tag >> 4).ok_or(BadRecord)?;
        let ip: IpAddr = match tag & 0x0f {
            4 => <[u8; 4]>::try_from(self.take(4)?).map_err(|_| BadRecord)?.into(),
            6 => <[u8; 16]>::try_from(self.take(16)?).map_err(|_| BadRecord)?.into(),
            _ => return Err(BadRecord),
        };
        let port = u16::from_le_bytes(self.take(2)?.try_into().map_err(|_| BadRecord)?);
        Ok(Endpoint::new(proto, SocketAddr::new(ip, port)))
    }
}

/// A 64-bit finaliser (splitmix64): spreads a (node, sequence) pair over the hash.
/// The overlay addresses a record claims.
fn claimed(r: &Record) -> impl Iterator<Item = IpAddr> + use<> {
    std::iter::once(IpAddr::V4(r.overlay)).chain(r.overlay6.map(IpAddr::V6))
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// How to reach one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// The first hop (the destination itself when direct).
    pub next_hop: NodeId,
    /// Number of links.
    pub hops: u32,
    /// Sum of the links' round-trip times in milliseconds.
    pub latency_ms: u32,
    /// Every link on the path is a reliable stream (TCP, WebSocket) by the records of
    /// the nodes it leaves from: whole GSO records can cross its relays.
    pub streams: bool,
}

/// All records a node knows, each with the time its node became unreachable (if it
/// is), and an index of the overlay addresses they claim.
#[derive(Debug, Default)]
pub struct Topology {
    records: BTreeMap<NodeId, (Record, Option<Instant>)>,
    /// Every overlay address (IPv4 and IPv6) a record claims, with its node.
    addresses: BTreeSet<(IpAddr, NodeId)>,
    /// Records of nodes we did not know that found the table full of reachable ones.
    refused_full: u64,
    /// Records of unreachable nodes dropped to make room for a new node's.
    evicted: u64,
}

impl Topology {
    /// Stores `rec` if it is newer than what we have. Returns true if it was. A node
    /// we do not know finds room in a full table by taking the place of the node
    /// unreachable for longest; when every node is reachable it is refused (counted).
    /// The caller checks the signature.
    pub fn apply(&mut self, rec: Record) -> bool {
        if !self.is_newer(&rec) || rec.seq > MAX_SEQ {
            return false;
        }
        let id = rec.node();
        if !self.records.contains_key(&id) && self.records.len() >= MAX_RECORDS {
            let stalest = self.records.iter().filter_map(|(id, (_, u))| u.map(|t| (t, *id))).min();
            let Some((_, gone)) = stalest else {
                self.refused_full += 1;
                return false;
            };
            self.remove(&gone);
            self.evicted += 1;
        }
        let unreachable = match self.records.remove(&id) {
            Some((old, u)) => {
                self.unindex(&old);
                u
            }
            None => None,
        };
        self.index(&rec);
        self.records.insert(id, (rec, unreachable));
        true
    }

    fn index(&mut self, r: &Record) {
        let id = r.node();
        self.addresses.extend(claimed(r).map(|a| (a, id)));
    }

    fn unindex(&mut self, r: &Record) {
        let id = r.node();
        for a in claimed(r) {
            self.addresses.remove(&(a, id));
        }
    }

    /// The overlay addresses records claim within `lo..=hi`, with the node claiming
    /// each (an index: no scan).
    pub fn addresses_within(&self, lo: IpAddr, hi: IpAddr) -> impl Iterator<Item = (IpAddr, NodeId)> + '_ {
        let (first, last) = (NodeId::from_bytes([0; 8]), NodeId::from_bytes([0xff; 8]));
        self.addresses.range((lo, first)..=(hi, last)).copied()
    }

    /// Records refused because the table was full of reachable nodes' records, and
    /// unreachable nodes' records dropped to make room.
    pub fn full_counts(&self) -> (u64, u64) {
        (self.refused_full, self.evicted)
    }

    /// Whether `rec` would replace what we hold about its node (a cheap test before
    /// checking a signature).
    pub fn is_newer(&self, rec: &Record) -> bool {
        self.records.get(&rec.node()).is_none_or(|(old, _)| old.seq < rec.seq)
    }

    /// Whether the table holds [`MAX_RECORDS`] records.
    pub fn is_full(&self) -> bool {
        self.records.len() >= MAX_RECORDS
    }

    /// Forgets a node's record (its key was replaced).
    pub fn remove(&mut self, id: &NodeId) {
        if let Some((old, _)) = self.records.remove(id) {
            self.unindex(&old);
        }
    }

    /// Notes which nodes are reachable (`reachable`, plus `keep`: ourselves) and drops
    /// the records of nodes unreachable for [`RECORD_TTL`]; returns the ids dropped.
    pub fn expire(&mut self, now: Instant, keep: NodeId, reachable: impl Fn(&NodeId) -> bool) -> Vec<NodeId> {
        let mut old = Vec::new();
        for (id, (_, since)) in self.records.iter_mut() {
            if *id == keep || reachable(id) {
                *since = None;
                continue;
            }
            let t = *since.get_or_insert(now);
            if now.saturating_duration_since(t) >= RECORD_TTL {
                old.push(*id);
            }
        }
        for id in &old {
            self.remove(id);
        }
        old
    }

    /// How long `id`'s node has been unreachable, as of the last [`Topology::expire`]
    /// (`None`: reachable, or not looked at since its record arrived).
    pub fn unreachable_for(&self, id: &NodeId, now: Instant) -> Option<Duration> {
        self.records.get(id).and_then(|(_, u)| *u).map(|t| now.saturating_duration_since(t))
    }

    /// Whether some record's node is unreachable (its record will age out).
    pub fn has_unreachable(&self) -> bool {
        self.records.values().any(|(_, u)| u.is_some())
    }

    /// A summary of the records of the nodes for which `synced` holds: their count and
    /// a hash of every (node, sequence) pair. Neighbours whose summaries differ
    /// exchange digests.
    pub fn summary(&self, synced: impl Fn(&NodeId) -> bool) -> (u32, u64) {
        let mut count = 0u32;
        let mut hash = 0u64;
        for (id, (r, _)) in self.records.iter().filter(|(id, _)| synced(id)) {
            count += 1;
            hash ^= mix(u64::from_le_bytes(id.to_bytes()) ^ r.seq.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        (count, hash)
    }

    /// (node, sequence) of the records for which `synced` holds, by node id.
    pub fn digest(&self, synced: impl Fn(&NodeId) -> bool) -> Vec<(NodeId, u64)> {
        self.records.iter().filter(|(id, _)| synced(id)).map(|(id, (r, _))| (*id, r.seq)).collect()
    }

    /// The records for which `synced` holds, with ids in `lo..=hi`, that `theirs` (a
    /// neighbour's digest of that range) lacks or holds an older sequence of.
    pub fn newer_than<'a>(
        &'a self,
        lo: NodeId,
        hi: NodeId,
        theirs: &'a [(NodeId, u64)],
        synced: impl Fn(&NodeId) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Record> + 'a {
        let theirs: BTreeMap<NodeId, u64> = theirs.iter().copied().collect();
        self.records
            .range(lo..=hi)
            .filter(move |(id, _)| synced(id))
            .filter(move |(id, (r, _))| theirs.get(id).is_none_or(|s| *s < r.seq))
            .map(|(_, (r, _))| r)
    }

    /// The record of `id`.
    pub fn get(&self, id: &NodeId) -> Option<&Record> {
        self.records.get(id).map(|(r, _)| r)
    }

    /// Every record.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        self.records.values().map(|(r, _)| r)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is known.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Shortest paths from `from` to every reachable node: fewest hops (ties broken by
    /// latency), or lowest latency with `latency_first` (ties broken by hops). A link
    /// counts only if both ends list each other.
    pub fn paths(&self, from: NodeId, latency_first: bool) -> BTreeMap<NodeId, Path> {
        // Nodes by index, so that the search runs over arrays (it runs on every
        // topology change, on every node).
        let ids: Vec<NodeId> = self.records.keys().copied().collect();
        let index: std::collections::HashMap<NodeId, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let Some(&start) = index.get(&from) else { return BTreeMap::new() };
        let cost = |hops: u32, lat: u32| -> u64 {
            if latency_first {
                (u64::from(lat) << 16) + u64::from(hops)
            } else {
                (u64::from(hops) << 32) + u64::from(lat)
            }
        };
        let mut best: Vec<Option<(u64, Path)>> = vec![None; ids.len()];
        let mut done = vec![false; ids.len()];
        let mut heap = BinaryHeap::new();
        // Entries: (cost, latency, node, first hop); ties resolve by node id.
        heap.push(std::cmp::Reverse((0u64, 0u32, from, from)));
        while let Some(std::cmp::Reverse((_, lat, node, first))) = heap.pop() {
            let Some(&u) = index.get(&node) else { continue };
            if std::mem::replace(&mut done[u], true) {
                continue;
            }
            let (hops, streams) =
                if u == start { (0, true) } else { best[u].map_or((0, false), |(_, p)| (p.hops, p.streams)) };
            let Some((rec, _)) = self.records.get(&node) else { continue };
            for n in &rec.neighbours {
                let Some(&v) = index.get(&n.node) else { continue };
                if done[v] || !self.lists(n.node, node) {
                    continue;
                }
                let nh = hops + 1;
                // Relayed frames die after MAX_LINKS links: longer paths are useless.
                if nh > MAX_LINKS {
                    continue;
                }
                let nlat = lat.saturating_add(n.rtt_ms.max(1));
                let nc = cost(nh, nlat);
                let first_hop = if u == start { n.node } else { first };
                if best[v].is_none_or(|(bc, _)| nc < bc) {
                    let streams = streams && n.observed.proto.is_stream();
                    best[v] = Some((nc, Path { next_hop: first_hop, hops: nh, latency_ms: nlat, streams }));
                    heap.push(std::cmp::Reverse((nc, nlat, n.node, first_hop)));
                }
            }
        }
        ids.into_iter().zip(best).filter(|(id, _)| *id != from).filter_map(|(id, b)| Some((id, b?.1))).collect()
    }

    fn lists(&self, who: NodeId, whom: NodeId) -> bool {
        self.records.get(&who).is_some_and(|(r, _)| r.neighbours.iter().any(|n| n.node == whom))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests make their own epoch
mod tests {
    use super::*;

    fn static_key(i: u8) -> weft_core::handshake::StaticKey {
        weft_core::handshake::StaticKey::from_seed([i; 32])
    }

    fn key(i: u8) -> [u8; 32] {
        static_key(i).public
    }

    fn rec(i: u8, seq: u64, ns: &[(u8, u32)]) -> Record {
        let mut r = Record {
            key: key(i),
            signer: [0; 32],
            sig: [0; 64],
            seq,
            hostname: format!("n{i}"),
            overlay: Ipv4Addr::new(10, 0, 0, i),
            overlay6: i.is_multiple_of(2).then(|| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(i))),
            endpoints: vec![Endpoint::from(SocketAddr::from(([192, 0, 2, i], 11010)))],
            neighbours: ns
                .iter()
                .map(|(j, rtt)| Neighbour {
                    node: NodeId::from_public(&key(*j)),
                    rtt_ms: *rtt,
                    loss_pct: 0,
                    observed: Endpoint::from(SocketAddr::from(([198, 51, 100, *j], 11010))),
                })
                .collect(),
            proxied: vec![
                (Ipv4Addr::new(172, 16, i, 0).into(), 24),
                (Ipv6Addr::new(0xfd77, u16::from(i), 0, 0, 0, 0, 0, 0).into(), 64),
            ],
            dynamic: i.is_multiple_of(2),
            cert: (i == 3).then(|| vec![i; 40]),
            priority: DEFAULT_PRIORITY,
            unknown_ext: Vec::new(),
        };
        r.sign(&static_key(i), "net");
        r
    }

    fn id(i: u8) -> NodeId {
        NodeId::from_public(&key(i))
    }

    #[test]
    fn record_round_trip_and_truncation() {
        let mut r = rec(2, 7, &[(1, 5), (3, 9)]);
        r.endpoints.push("[2001:db8::1]:11010".parse().unwrap());
        r.sign(&static_key(2), "net");
        assert!(r.overlay6.is_some(), "both families on the wire");
        let mut b = Vec::new();
        r.emit(&mut b);
        let back = Record::parse(&b).unwrap();
        assert_eq!(back, r);
        assert!(back.verify("net"));
        for cut in 0..b.len() {
            assert!(Record::parse(&b[..cut]).is_err(), "cut at {cut}");
        }
        b.push(0);
        assert!(Record::parse(&b).is_err(), "trailing bytes");
    }

    #[test]
    fn a_router_priority_travels_in_an_extension_only_when_set() {
        // Default: the version-4 layout older releases read.
        let mut b = Vec::new();
        rec(2, 7, &[]).emit(&mut b);
        assert_eq!(b[0], RECORD_VERSION);
        // Set, with and without a certificate: version 6, signed, read back.
        for i in [4, 3] {
            let mut r = rec(i, 7, &[(1, 5)]);
            r.priority = 7;
            r.sign(&static_key(i), "net");
            let mut b = Vec::new();
            r.emit(&mut b);
            assert_eq!(b[0], RECORD_VERSION_EXT);
            let back = Record::parse(&b).unwrap();
            assert_eq!((back.priority, &back.cert), (7, &r.cert));
            assert!(back.verify("net"));
            for cut in 0..b.len() {
                assert!(Record::parse(&b[..cut]).is_err(), "cut at {cut}");
            }
            let mut forged = back.clone();
            forged.priority = 200;
            assert!(!forged.verify("net"), "the priority is signed");
        }
        // An unknown extension is skipped; a priority of the wrong length is refused.
        let mut r = rec(4, 7, &[]);
        r.priority = 9;
        let mut b = Vec::new();
        r.emit_body(&mut b);
        let ext_at = b.len() - 4;
        assert_eq!(&b[ext_at..], &[3, EXT_PRIORITY, 1, 9]);
        let with_ext = |ext: &[u8]| {
            let mut b = b[..ext_at].to_vec();
            b.push(ext.len() as u8);
            b.extend_from_slice(ext);
            b.extend_from_slice(&[0; 64]);
            b
        };
        // A later release's extension after ours: kept, and the record re-encodes to
        // the bytes it came as, so its origin's signature still verifies.
        let later = with_ext(&[EXT_PRIORITY, 1, 9, 77, 2, 1, 2]);
        let back = Record::parse(&later).unwrap();
        assert_eq!((back.priority, &back.unknown_ext[..]), (9, &[(77, vec![1, 2])][..]));
        let mut again = Vec::new();
        back.emit(&mut again);
        assert_eq!(again, later);
        let mut signed = rec(4, 7, &[]);
        signed.unknown_ext = vec![(77, vec![1, 2])];
        signed.sign(&static_key(4), "net");
        let mut b2 = Vec::new();
        signed.emit(&mut b2);
        assert!(Record::parse(&b2).unwrap().verify("net"), "without a priority, version 6 for the unknown tag");
        // Non-canonical or malformed blocks are refused: a priority of the wrong
        // length, the default written out, tags out of order or repeated, no block.
        for bad in [
            &[EXT_PRIORITY, 2, 9, 9][..],
            &[EXT_PRIORITY, 1, DEFAULT_PRIORITY],
            &[77, 2, 1, 2, EXT_PRIORITY, 1, 9],
            &[EXT_PRIORITY, 1, 9, EXT_PRIORITY, 1, 9],
            &[],
        ] {
            assert!(Record::parse(&with_ext(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn signatures_bind_the_record_to_its_origin_and_network() {
        let r = rec(1, 7, &[(2, 5)]);
        assert!(r.verify("net"));
        assert!(!r.verify("other-net"), "a record signed for one network is not valid in another");
        // Any change by someone else breaks the signature.
        let mut forged = r.clone();
        forged.endpoints = vec![Endpoint::from(SocketAddr::from(([203, 0, 113, 66], 11010)))];
        assert!(!forged.verify("net"));
        let mut forged = r.clone();
        forged.seq += 1;
        assert!(!forged.verify("net"));
        let mut forged = r.clone();
        forged.proxied.push((Ipv4Addr::new(10, 99, 0, 0).into(), 16));
        assert!(!forged.verify("net"));
        let mut forged = rec(2, 7, &[]);
        forged.overlay6 = Some(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 99));
        assert!(!forged.verify("net"), "the IPv6 address is signed too");
        // Re-signing with another member's key does not help: that key's Montgomery
        // form is not the record's X25519 key (so not its node id).
        let mut forged = r;
        forged.seq += 1;
        let mut msg_key = static_key(3);
        forged.signer = msg_key.signing_public;
        forged.sig = msg_key.sign(&forged.signed_message("net"));
        assert!(!forged.verify("net"));
        // And re-signing it as a whole makes it the forger's record, not node 1's.
        msg_key = static_key(3);
        forged.sign(&msg_key, "net");
        assert!(forged.verify("net"));
        assert_eq!(forged.node(), id(3));
    }

    #[test]
    fn caps_on_counts_sequence_and_table_size() {
        // Too many endpoints or subnets on the wire are refused.
        let mut r = rec(1, 1, &[]);
        r.endpoints =
            (0..MAX_ENDPOINTS as u16 + 1).map(|p| Endpoint::from(SocketAddr::from(([192, 0, 2, 1], p)))).collect();
        let mut b = Vec::new();
        r.emit(&mut b);
        // emit itself caps, so forge the count byte: find it after the fixed prefix
        // (node 1 has no IPv6 address: one byte says so).
        assert!(r.overlay6.is_none());
        let at = 1 + 32 + 32 + 8 + 1 + r.hostname.len() + 4 + 1;
        assert_eq!(usize::from(b[at]), MAX_ENDPOINTS);
        b[at] = MAX_ENDPOINTS as u8 + 1;
        assert!(Record::parse(&b).is_err());
        // A sequence number above the bound is refused, whoever signed it.
        let mut top = rec(1, MAX_SEQ + 1, &[]);
        top.sign(&static_key(1), "net");
        let mut b = Vec::new();
        top.emit(&mut b);
        assert!(Record::parse(&b).is_err());
        let mut t = Topology::default();
        assert!(!t.apply(top));
        let max = rec(1, u64::MAX, &[]);
        assert!(!t.apply(max));
        // The table holds at most MAX_RECORDS nodes; known nodes still update.
        let mut t = Topology::default();
        let mut base = rec(1, 1, &[]);
        for i in 0..MAX_RECORDS as u32 {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            base.key = k;
            assert!(t.apply(base.clone()));
        }
        assert!(t.is_full());
        assert!(!t.apply(rec(2, 1, &[])), "a new node does not fit a full table of reachable nodes");
        assert_eq!(t.full_counts(), (1, 0));
        base.seq = 2;
        assert!(t.apply(base.clone()), "a known node still updates");
        assert_eq!(t.len(), MAX_RECORDS);
        // Unreachable nodes' records make room for new ones, the longest unreachable
        // first; reachable ones are never pushed out.
        let now = Instant::now();
        let (first, second) = (base.node(), t.records().next().map(Record::node).unwrap());
        t.expire(now, NodeId::from_bytes([0; 8]), |id| *id != first);
        t.expire(now + Duration::from_secs(1), NodeId::from_bytes([0; 8]), |id| *id != first && *id != second);
        assert!(t.apply(rec(2, 1, &[])));
        assert!(t.get(&first).is_none() && t.get(&second).is_some(), "the longest unreachable went first");
        assert!(t.apply(rec(3, 1, &[])));
        assert!(t.get(&second).is_none());
        assert!(!t.apply(rec(4, 1, &[])), "then only reachable nodes are left");
        assert_eq!(t.full_counts(), (2, 2));
        assert_eq!(t.len(), MAX_RECORDS);
    }

    #[test]
    fn the_address_index_follows_every_change() {
        let mut t = Topology::default();
        let v4 = |a: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, a));
        let all = |t: &Topology| -> Vec<(IpAddr, NodeId)> {
            t.addresses_within(IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(Ipv6Addr::from(u128::MAX))).collect()
        };
        assert!(t.apply(rec(2, 1, &[])));
        assert!(t.apply(rec(3, 1, &[])));
        // Node 2 has an IPv6 address too (even ids do).
        let six = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2));
        assert_eq!(all(&t), vec![(v4(2), id(2)), (v4(3), id(3)), (six, id(2))]);
        assert_eq!(t.addresses_within(v4(3), v4(255)).collect::<Vec<_>>(), vec![(v4(3), id(3))]);
        // A move (a newer record with another address) re-indexes; a removal unindexes.
        let mut moved = rec(3, 2, &[]);
        moved.overlay = Ipv4Addr::new(10, 0, 0, 9);
        moved.sign(&static_key(3), "net");
        assert!(t.apply(moved));
        assert_eq!(t.addresses_within(v4(3), v4(8)).count(), 0);
        assert_eq!(t.addresses_within(v4(9), v4(9)).collect::<Vec<_>>(), vec![(v4(9), id(3))]);
        t.remove(&id(2));
        assert_eq!(all(&t), vec![(v4(9), id(3))]);
        // Records that age out leave the index too.
        let now = Instant::now();
        t.expire(now, id(2), |_| false);
        assert_eq!(t.expire(now + RECORD_TTL, id(2), |_| false), vec![id(3)]);
        assert!(all(&t).is_empty());
    }

    #[test]
    fn newer_sequence_wins() {
        let mut t = Topology::default();
        assert!(t.apply(rec(1, 2, &[])));
        assert!(!t.apply(rec(1, 1, &[(2, 1)])));
        assert!(!t.apply(rec(1, 2, &[(2, 1)])));
        assert!(t.apply(rec(1, 3, &[(2, 1)])));
        assert_eq!(t.get(&id(1)).unwrap().neighbours.len(), 1);
    }

    #[test]
    fn chain_routes_through_the_middle_and_links_need_both_ends() {
        let mut t = Topology::default();
        t.apply(rec(1, 1, &[(2, 1)]));
        t.apply(rec(2, 1, &[(1, 1), (3, 1)]));
        t.apply(rec(3, 1, &[(2, 1), (4, 1)])); // 4 does not list 3
        t.apply(rec(4, 1, &[]));
        let p = t.paths(id(1), false);
        assert_eq!(p[&id(2)], Path { next_hop: id(2), hops: 1, latency_ms: 1, streams: false });
        assert_eq!(p[&id(3)], Path { next_hop: id(2), hops: 2, latency_ms: 2, streams: false });
        assert!(!p.contains_key(&id(4)), "one-sided link must not count");
    }

    #[test]
    fn a_path_is_streams_only_when_every_link_is() {
        // 1 -tcp- 2 -ws- 3 -udp- 4, by the records of the nodes each link leaves from.
        let over = |i: u8, ns: &[(u8, u32)], proto: Proto| {
            let mut r = rec(i, 1, ns);
            for n in &mut r.neighbours {
                n.observed = Endpoint::new(proto, n.observed.addr);
            }
            r.sign(&static_key(i), "net");
            r
        };
        let mut t = Topology::default();
        t.apply(over(1, &[(2, 1)], Proto::Tcp));
        t.apply(over(2, &[(1, 1), (3, 1)], Proto::Ws));
        t.apply(over(3, &[(2, 1), (4, 1)], Proto::Udp));
        t.apply(rec(4, 1, &[(3, 1)]));
        let p = t.paths(id(1), false);
        assert!(p[&id(2)].streams && p[&id(3)].streams);
        assert!(!p[&id(4)].streams, "the last link is UDP");
    }

    #[test]
    fn hops_versus_latency_first() {
        // 1-2 direct but slow (100 ms); 1-3-2 fast (2 + 2 ms).
        let mut t = Topology::default();
        t.apply(rec(1, 1, &[(2, 100), (3, 2)]));
        t.apply(rec(2, 1, &[(1, 100), (3, 2)]));
        t.apply(rec(3, 1, &[(1, 2), (2, 2)]));
        assert_eq!(t.paths(id(1), false)[&id(2)].next_hop, id(2));
        let lf = t.paths(id(1), true)[&id(2)];
        assert_eq!((lf.next_hop, lf.hops, lf.latency_ms), (id(3), 2, 4));
    }

    #[test]
    fn unreachable_records_age_out_and_reachable_ones_stay() {
        let mut t = Topology::default();
        let now = Instant::now();
        t.apply(rec(1, 1, &[]));
        t.apply(rec(2, 1, &[]));
        t.apply(rec(3, 1, &[]));
        let reach = |n: &NodeId| *n == id(3);
        assert!(t.expire(now, id(1), reach).is_empty());
        assert!(t.has_unreachable());
        assert!(t.expire(now + RECORD_TTL / 2, id(1), reach).is_empty());
        assert_eq!(t.expire(now + RECORD_TTL, id(1), reach), vec![id(2)]);
        assert_eq!(t.len(), 2);
        // Reachable again: the clock starts over.
        t.apply(rec(2, 2, &[]));
        assert!(t.expire(now + RECORD_TTL * 2, id(1), |_| true).is_empty());
        assert!(!t.has_unreachable());
    }

    #[test]
    fn digests_find_exactly_what_a_neighbour_lacks() {
        let mut a = Topology::default();
        let mut b = Topology::default();
        for i in 1..=6 {
            a.apply(rec(i, 1, &[]));
            b.apply(rec(i, 1, &[]));
        }
        let all = |_: &NodeId| true;
        assert_eq!(a.summary(all), b.summary(all));
        a.apply(rec(2, 5, &[]));
        a.apply(rec(7, 1, &[]));
        b.apply(rec(4, 3, &[]));
        assert_ne!(a.summary(all), b.summary(all));
        let (lo, hi) = (NodeId::from_bytes([0; 8]), NodeId::from_bytes([0xff; 8]));
        let bd = b.digest(all);
        let mut push: Vec<NodeId> = a.newer_than(lo, hi, &bd, all).map(Record::node).collect();
        push.sort();
        let mut want = vec![id(2), id(7)];
        want.sort();
        assert_eq!(push, want);
        let ad = a.digest(all);
        let back: Vec<NodeId> = b.newer_than(lo, hi, &ad, all).map(Record::node).collect();
        assert_eq!(back, vec![id(4)]);
        for r in a.newer_than(lo, hi, &bd, all).cloned().collect::<Vec<_>>() {
            b.apply(r);
        }
        a.apply(rec(4, 3, &[]));
        assert_eq!(a.summary(all), b.summary(all));
        // Only nodes the filter keeps are summarised.
        assert_eq!(a.summary(|n| *n == id(1)).0, 1);
    }
}
