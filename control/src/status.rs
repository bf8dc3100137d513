//! `weft status --json`: the node's report of itself, also the control socket's
//! status reply. Field names and values are the JSON contract scripts read; the
//! states, paths and kinds they match are enums ([`crate::kinds`]) that serialize as
//! the same `snake_case` strings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::kinds::{ExitState, FailureKind, PathKind, PeerState, PortMapProtocol};

/// What this node's certificate grants (`weft status --json`'s `certificate`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CertificateJson {
    /// The node id it is issued to (the static public key, 64 hex digits).
    pub node_id: String,
    /// Host name.
    pub name: String,
    /// IPv4 overlay address with prefix.
    pub ipv4: String,
    /// IPv6 overlay address with prefix, when granted.
    pub ipv6: Option<String>,
    /// Groups (tags).
    pub groups: Vec<String>,
    /// Subnets it may proxy.
    pub subnets: Vec<String>,
    /// Whether it may be an exit node.
    pub exit: bool,
    /// Whether it may run a WireGuard portal.
    pub portal: bool,
    /// End of validity, unix seconds.
    pub not_after: u64,
    /// Seconds until it expires (0 once expired).
    pub expires_in_s: u64,
}

/// `weft status --json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatusJson {
    /// Our node id.
    pub node_id: String,
    /// This node's release (`0.2.0`).
    #[serde(default)]
    pub version: String,
    /// The protocol version this node speaks, and the oldest it talks to.
    #[serde(default)]
    pub protocol: u16,
    /// The oldest protocol version this node talks to.
    #[serde(default)]
    pub min_protocol: u16,
    /// Network name.
    pub network_name: String,
    /// The network's authority (`weft-authority:...`), or null in a network without
    /// one.
    #[serde(default)]
    pub authority: Option<String>,
    /// Every authority this node trusts (two during a rollover).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorities: Vec<String>,
    /// This node's member certificate, in a network with an authority.
    #[serde(default)]
    pub certificate: Option<CertificateJson>,
    /// Node ids (64 hex digits) the network's authority revoked, as this node knows.
    #[serde(default)]
    pub revocations: Vec<String>,
    /// The access policy in force (absent: none, every member reaches everything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyJson>,
    /// Host name.
    pub hostname: String,
    /// Overlay address with prefix.
    pub overlay: String,
    /// IPv6 overlay address with prefix, when the overlay has IPv6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay6: Option<String>,
    /// Data cipher.
    pub cipher: String,
    /// Listener URIs.
    pub listeners: Vec<String>,
    /// Live TCP, WebSocket and QUIC connections.
    #[serde(default)]
    pub connections: usize,
    /// Counters of the connection transports (accepted, dialled, refused_full,
    /// handshake_failures, protocol_errors, timeouts, ...).
    #[serde(default)]
    pub transport_counters: BTreeMap<String, u64>,
    /// TUN device name.
    pub dev_name: String,
    /// Which offloads are in use.
    pub offloads: OffloadJson,
    /// Counters of each forwarding pipeline; the last one opens what the TCP,
    /// WebSocket and QUIC connections receive (its TX counters stay zero).
    pub pipelines: Vec<PipelineJson>,
    /// Forwarding pipelines.
    pub threads: usize,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Drops by reason: the node's own plus every peer's.
    pub drops: BTreeMap<String, u64>,
    /// Known peers.
    pub peers: Vec<PeerJson>,
    /// Routes to every member of the mesh.
    pub routes: Vec<RouteJson>,
    /// Members that claim this node's overlay address.
    pub address_conflicts: Vec<String>,
    /// Claims of other members this node refuses, with the reason (an overlay address
    /// another member holds, a proxied subnet it will not route).
    #[serde(default)]
    pub refused: Vec<String>,
    /// Topology records dropped because their origin did not sign them (forged or
    /// altered by a member).
    #[serde(default)]
    pub rejected_records: u64,
    /// Control messages dropped because their member sent more than its rate (2,000 a
    /// second after a burst of 8,000).
    #[serde(default)]
    pub control_limited: u64,
    /// Sessions closed because their member's signed messages (records, revocations,
    /// policies) kept failing their signature check.
    #[serde(default)]
    pub signature_cutoffs: u64,
    /// Topology records dropped by the table's limits: `over_budget` (a link brought
    /// more than its budget), `table_full` (a new node's record found the table full
    /// of reachable nodes'), `evicted` (an unreachable node's record dropped to make
    /// room), `uncertified` (in a network with an authority: no valid certificate, a
    /// revoked origin, or claims it does not grant).
    #[serde(default)]
    pub records_dropped: BTreeMap<String, u64>,
    /// Packets for members without a session dropped while their sessions were
    /// being made (too many held, or the handshake failed).
    #[serde(default)]
    pub queued_dropped: u64,
    /// Subnets this node proxies.
    pub proxy_networks: Vec<String>,
    /// Configured peers that have not answered yet.
    pub pending_peers: Vec<PendingJson>,
    /// Handshakes we refused, by source.
    pub refused_handshakes: Vec<RefusedJson>,
    /// What handshake admission control dropped or answered with a cookie.
    #[serde(default)]
    pub admission: AdmissionJson,
    /// The WireGuard portal, when this node runs one (`--wg-portal`).
    #[serde(default)]
    pub wg_portal: Option<PortalJson>,
    /// Magic DNS, when this node serves it.
    #[serde(default)]
    pub magic_dns: Option<MagicDnsJson>,
    /// Whether this node offers the internet to members (`--exit-node`).
    #[serde(default)]
    pub exit_node: bool,
    /// The exit node this node uses (`--use-exit-node`).
    #[serde(default)]
    pub exit: Option<ExitJson>,
    /// Members that offer themselves as exit nodes.
    #[serde(default)]
    pub exit_offers: Vec<ExitOfferJson>,
    /// Subnets other members proxy, each with its routers in order of preference.
    #[serde(default)]
    pub subnets: Vec<SubnetJson>,
    /// Moves to another router or exit because the one in use was lost.
    #[serde(default)]
    pub failovers: u64,
    /// Moves back to a preferred router or exit that returned.
    #[serde(default)]
    pub failbacks: u64,
    /// Why this node withdrew the subnets it proxies (`--proxy-health` fails).
    #[serde(default)]
    pub withdrawn: Option<String>,
    /// Handshakes that made a session (either side) since start.
    #[serde(default)]
    pub handshakes_completed: u64,
    /// Handshakes this node started because a member sent data on a session it had
    /// dropped (declared dead, or retired) since start.
    #[serde(default)]
    pub stale_renewed: u64,
    /// Handshakes that failed since start, by kind (bad_response, rejected, refused,
    /// address_taken, no_response, not_confirmed, unreachable, no_path).
    #[serde(default)]
    pub handshake_failures: BTreeMap<FailureKind, u64>,
    /// What the control plane itself sent and received (handshakes, keepalives,
    /// probes, records, summaries; not the data the pipelines carry).
    #[serde(default)]
    pub control_traffic: ControlTrafficJson,
    /// Live TCP, WebSocket and QUIC connections by transport.
    #[serde(default)]
    pub connections_by_transport: BTreeMap<String, usize>,
    /// The userspace stack and its services, on a node without a TUN (`--no-tun`).
    #[serde(default)]
    pub userspace: Option<UserspaceJson>,
    /// The mapping of this node's UDP port on its router (null with
    /// `--no-port-mapping`).
    #[serde(default)]
    pub port_mapping: Option<PortMapJson>,
    /// This node's NAT as the members it links to see it (`weft netcheck`).
    #[serde(default)]
    pub nat: NatJson,
}

/// A node's NAT, judged from the addresses at which the members it links to see it
/// (in their signed records).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NatJson {
    /// `endpoint-independent` (one outside port whatever the destination: punching
    /// works), `endpoint-dependent` (a new port per destination), `no NAT` (seen at
    /// its own address) or `unknown` (no link reported it yet).
    pub mapping: String,
    /// Two or more members agree or disagree; false: a guess from one member's view
    /// (its port preserved: independent; changed: dependent).
    pub certain: bool,
    /// Whether the outside port is the node's own UDP port (null: nobody saw it).
    pub port_preserving: Option<bool>,
    /// It announces a port its router maps (see `port_mapping`).
    pub mapped: bool,
    /// Where each member that links to it sees it.
    pub observed: Vec<NatObservationJson>,
    /// The endpoints other members try for it, observed first.
    pub candidates: Vec<String>,
    /// What its NAT lets in unasked: `endpoint-independent` (a packet from an address
    /// it never sent to got in), `dependent or untested` (only answers so far),
    /// `port mapped` (its router forwards its port) or `no NAT`.
    #[serde(default)]
    pub filtering: String,
    /// The first packet that got in unasked: its source (`ADDR:PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unasked_from: Option<String>,
}

/// One member's view of this node's address.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NatObservationJson {
    /// The member's node id.
    pub by: String,
    /// Its host name.
    pub hostname: String,
    /// The UDP address it sees this node at (`ADDR:PORT`).
    pub address: String,
}

/// The port mapping of a node's UDP port on its router (PCP, NAT-PMP or UPnP-IGD).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PortMapJson {
    /// The router asked (the default gateway), when there is one.
    pub gateway: Option<String>,
    /// The UDP port mapped (the node's).
    pub internal_port: u16,
    /// The protocol the router answered, while a mapping is held.
    pub protocol: Option<PortMapProtocol>,
    /// The mapped external endpoint (`ADDR:PORT`), while a mapping is held.
    pub external: Option<String>,
    /// Whether members are told of `external` as a candidate endpoint of this node
    /// (not when the router's external address is a private one: another NAT is in
    /// front of it, and the mapping leads nowhere from outside).
    pub advertised: bool,
    /// Seconds until the router drops the mapping unless renewed (renewed before).
    pub expires_in_s: Option<u64>,
    /// Why the last attempt failed (every protocol's answer), if it did.
    pub last_error: Option<String>,
    /// Times the mapping was made again after the router lost it (its epoch showed
    /// a restart, or the lease lapsed).
    pub remaps: u64,
}

/// Datagrams and bytes of the control plane.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ControlTrafficJson {
    /// Datagrams sent.
    pub sent_packets: u64,
    /// Bytes sent.
    pub sent_bytes: u64,
    /// Datagrams and messages received.
    pub received_packets: u64,
    /// Bytes received.
    pub received_bytes: u64,
}

/// The WireGuard portal of a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortalJson {
    /// Listen URI (`udp://ADDR:PORT`).
    pub listen: String,
    /// The portal network: the portal has its first host, clients the others.
    pub net: String,
    /// The portal's TUN device.
    pub dev_name: String,
    /// The portal's WireGuard public key (base64).
    pub public_key: String,
    /// Its clients.
    pub clients: Vec<PortalClientJson>,
    /// Datagrams and packets the portal dropped, by reason.
    pub drops: BTreeMap<String, u64>,
}

/// One WireGuard client of the portal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortalClientJson {
    /// Its name.
    pub name: String,
    /// The address it was given (its only allowed source).
    pub address: String,
    /// Its public key (base64).
    pub public_key: String,
    /// Where it last sent an authenticated message from.
    pub endpoint: Option<String>,
    /// Seconds since its last handshake.
    pub last_handshake_secs: Option<u64>,
    /// Plaintext bytes received from it.
    pub rx_bytes: u64,
    /// Plaintext bytes sent to it.
    pub tx_bytes: u64,
    /// Packets from it delivered to the mesh.
    pub rx_packets: u64,
    /// Datagrams sent to it.
    pub tx_packets: u64,
}

/// What `weft wg add` prints: a new client and its wg-quick config.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WgConfigJson {
    /// Its name.
    pub name: String,
    /// Its address.
    pub address: String,
    /// Its public key (base64).
    pub public_key: String,
    /// The Endpoint written into the config.
    pub endpoint: String,
    /// The wg-quick config, private key included (shown once, not kept by the node).
    pub config: String,
}

/// Handshake admission counters (datagrams the pipelines dropped for a bad mac1 are
/// in `drops` as `handshake_mac`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AdmissionJson {
    /// Handshake datagrams that reached the engine with a bad mac1.
    pub bad_mac: u64,
    /// Inits over their source's rate.
    pub rate_limited: u64,
    /// Inits answered with a cookie instead of a Diffie-Hellman (under load, or an
    /// init smaller than its answer would be).
    pub cookies_sent: u64,
    /// Cookies we received and used.
    pub cookies_received: u64,
    /// Inits refused because the pending or held table was full: always 0 from 0.2.0
    /// on (a full table drops its oldest unproven entry instead, `evicted`). Kept
    /// because 0.1.0's clients require the field to read a status at all.
    #[serde(default)]
    pub state_full: u64,
    /// Unproven handshakes dropped, oldest first, to make room for new ones.
    #[serde(default)]
    pub evicted: u64,
    /// IK inits dropped as replays (their stamp no later than the key's last one).
    #[serde(default)]
    pub replayed: u64,
    /// Whether the node is under load now.
    pub under_load: bool,
}

/// The exit node in use.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitJson {
    /// What `--use-exit-node` names.
    pub wanted: String,
    /// The member that matches, if one offers itself as an exit.
    pub node_id: Option<String>,
    /// Its host name.
    pub hostname: Option<String>,
    /// routing (the default route goes to it), unreachable (it offers, no route to it
    /// now), not_offered (a member by that name exists but offers no exit), or
    /// unknown_member (no member of the mesh has that name or id), or changed (the
    /// member it was pinned to is gone and another one matches: `changed_to`; traffic
    /// fails closed until `weft exit accept`).
    pub state: ExitState,
    /// Whether traffic leaves by this host's own route while it is unreachable.
    pub fallback: bool,
    /// The member it is pinned to (the one it first matched).
    #[serde(default)]
    pub pinned: Option<String>,
    /// The member it matches instead, when the pinned one does not.
    #[serde(default)]
    pub changed_to: Option<ExitOfferJson>,
    /// With several exits (a list or `auto`): those it may use, preferred first.
    #[serde(default)]
    pub candidates: Vec<ExitOfferJson>,
}

/// A subnet other members proxy, with its routers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubnetJson {
    /// The subnet (CIDR).
    pub subnet: String,
    /// Its routers, preferred first.
    pub routers: Vec<RouterJson>,
}

/// One router of a subnet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouterJson {
    /// Its node id.
    pub node_id: String,
    /// Its host name.
    pub hostname: String,
    /// Its `--router-priority` (higher is preferred).
    pub priority: u8,
    /// primary (traffic goes to it), standby or down.
    pub state: String,
    /// Why.
    pub why: String,
}

/// A member offering itself as an exit node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitOfferJson {
    /// Its node id.
    pub node_id: String,
    /// Its host name.
    pub hostname: String,
}

/// The Magic DNS server of a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MagicDnsJson {
    /// The domain it answers for.
    pub domain: String,
    /// Where it listens (the overlay address, port 53).
    pub server: String,
    /// This node's own name.
    pub name: Option<String>,
    /// Names in the zone (members).
    pub names: usize,
    /// Queries answered.
    pub answered: u64,
    /// Datagrams dropped unanswered: from outside the mesh, or no query.
    pub dropped: u64,
}

/// Offloads in use.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OffloadJson {
    /// TUN virtio-net offload.
    pub tun: bool,
    /// Coalesced (GRO) writes to the TUN (turns off if the kernel refuses one).
    pub tun_gro: bool,
    /// UDP GSO on send (may turn off at run time if the kernel refuses it).
    pub udp_gso: bool,
    /// UDP GRO on receive.
    pub udp_gro: bool,
    /// Why the TUN offload was turned off at run time (a member received this node's
    /// packets with bad checksums), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tun_off: Option<String>,
    /// Times this node told a member that its packets arrive with bad checksums.
    #[serde(default)]
    pub checksum_reports_sent: u64,
    /// Times a member told this node so.
    #[serde(default)]
    pub checksum_reports_received: u64,
}

/// Counters of one pipeline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineJson {
    /// Packets sent.
    pub tx_packets: u64,
    /// Plaintext bytes sent.
    pub tx_bytes: u64,
    /// TUN read batches.
    pub tx_batches: u64,
    /// Packets delivered.
    pub rx_packets: u64,
    /// Plaintext bytes delivered.
    pub rx_bytes: u64,
    /// recvmmsg batches.
    pub rx_batches: u64,
    /// GSO super-packets sent whole as one record (reliable connections).
    #[serde(default)]
    pub tx_gso_records: u64,
    /// GSO records received.
    #[serde(default)]
    pub rx_gso_records: u64,
    /// Packets the receive thread sent itself: what the kernel answered at once to
    /// the sparse packets it had just written (counted in `tx_packets` too).
    #[serde(default)]
    pub tx_answers: u64,
    /// Relayed frames for other nodes taken to pass on (this node's work as a relay;
    /// what could then not be sent is counted in `drops` too).
    #[serde(default)]
    pub forwarded: u64,
    /// Drops by reason that belong to no peer.
    pub drops: BTreeMap<String, u64>,
    /// A links RX thread (what connections receive), not a TUN/UDP pipeline.
    #[serde(default)]
    pub links: bool,
}

/// One peer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerJson {
    /// Its node id.
    pub node_id: String,
    /// Its host name.
    pub hostname: String,
    /// Its overlay address.
    pub overlay: String,
    /// Its IPv6 overlay address, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay6: Option<String>,
    /// Its direct endpoint (transport and address), if known.
    pub endpoint: Option<String>,
    /// direct, relay or none.
    pub path: PathKind,
    /// The first relay's node id, when relayed.
    pub via: Option<String>,
    /// The first relay's host name, when relayed.
    pub via_hostname: Option<String>,
    /// Links on the path.
    pub hops: u32,
    /// Transport of the path's first link: udp, quic, tcp, ws, wss (none without a path).
    pub transport: String,
    /// Smoothed round-trip time of the end-to-end session, in milliseconds.
    pub rtt_ms: Option<f64>,
    /// Fraction of recent probes lost, 0.0 to 1.0.
    pub loss: Option<f32>,
    /// connecting, established, idle (a member reachable without a session: one is
    /// made when traffic wants it) or down.
    pub state: PeerState,
    /// Whether it is a link of the mesh (a direct neighbour one end dials).
    #[serde(default)]
    pub link: bool,
    /// Seconds since the last handshake.
    pub last_handshake_secs: Option<u64>,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Drops of this peer's packets by reason.
    pub drops: BTreeMap<String, u64>,
    /// Why it is not established.
    pub error: Option<String>,
    /// The protocol version it speaks, from its hello (absent: a release before
    /// versioning, or a member met only through the mesh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u16>,
    /// The network secret its last handshake used: current, or next while the
    /// secret rotates (`network-secret-next`); absent before a handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretUse>,
    /// The largest inner packet its UDP path carries, as measured by probes (absent
    /// until measured, and on stream transports, which carry any size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_mtu: Option<u16>,
    /// UDP segmentation offload is off for its path: the path lost offloaded batches
    /// while single datagrams passed.
    #[serde(default)]
    pub gso_off: bool,
    /// Why its direct path is left for now (it lost data while keepalives passed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// Seconds between keepalives on its direct path while it is idle, when that path
    /// crosses this node's NAT (shortened each time the NAT forgot the path in a pause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat_keepalive_secs: Option<f64>,
    /// Why it has no direct path, while it is relayed: both NATs endpoint-dependent,
    /// one of them (its port towards the other is unknown), punches unanswered, or
    /// not punched yet (punching starts with traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_direct: Option<String>,
    /// The birthday method with it since start (its NAT or ours endpoint-dependent):
    /// probes this node sent to its public address's ports, each a keepalive.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hard_nat_probes: u64,
    /// Fresh UDP sockets (so NAT mappings) this node opened towards it for its probes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hard_nat_mappings: u64,
    /// Punch packets this node sent straight to its addresses since start (the
    /// ordinary method: both sides send at once while relayed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub punch_packets: u64,
    /// Its static public key, 64 hex digits (what `weft id` prints, certificates and
    /// revocations name; absent from nodes before 0.4).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// The groups its certificate grants (absent without an authority).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The end of its certificate's validity, unix seconds (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_not_after: Option<u64>,
    /// Its own links, as its signed record lists them (absent before its record
    /// arrived): the mesh map.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<NeighbourJson>,
}

/// A link of a member, from its signed record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NeighbourJson {
    /// The neighbour's node id.
    pub node_id: String,
    /// The link's latency as the member measured it, in milliseconds.
    pub rtt_ms: u32,
}

/// The access policy a node enforces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyJson {
    /// Where it came from: the file it was read from.
    pub source: String,
    /// A short hash of its text (what changes when the policy does).
    pub version: String,
    /// Its rules.
    pub rules: usize,
    /// Its tests, passed when it was put in force.
    pub tests_passed: usize,
    /// Tests skipped then: they name members this node did not know.
    pub tests_skipped: usize,
    /// Flows in the connection table.
    pub flows: usize,
    /// Packets dropped: no rule allows them and they answer no flow of ours.
    pub denied: u64,
    /// New flows dropped because the connection table was full of established flows.
    pub table_full: u64,
    /// New flows dropped because their source address had started its share of the
    /// connection table already (a sixteenth).
    #[serde(default)]
    pub source_full: u64,
    /// New flows each rule admitted, in rule order.
    pub hits: Vec<u64>,
    /// Each rule in words, in rule order (absent from nodes before 0.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_text: Vec<String>,
    /// Why the policy the authority signed for this network cannot be applied here:
    /// the node denies every flow but its own until one that can arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The last flows denied, newest first (at most 32; absent from nodes before 0.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_denials: Vec<DenialJson>,
}

/// A flow the access policy denied (`PolicyJson::recent_denials`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenialJson {
    /// Source address.
    pub src: String,
    /// Destination address.
    pub dst: String,
    /// Protocol: `tcp`, `udp`, `icmp`, `icmpv6`, or its number.
    pub proto: String,
    /// Destination port (an ICMP echo: its identifier).
    pub port: u16,
    /// Seconds since it was last denied.
    pub last_secs_ago: u64,
    /// Seconds since it was first denied (while on the list).
    pub first_secs_ago: u64,
    /// How often it was noted (at most once a millisecond for the whole node, so a
    /// floor of its packets denied; `denied` counts them all).
    pub count: u64,
}

/// Which network secret a peer's session uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretUse {
    /// The node's `network-secret`.
    Current,
    /// The node's `network-secret-next`.
    Next,
}

/// One route.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteJson {
    /// Destination node id.
    pub node_id: String,
    /// Destination host name.
    pub hostname: String,
    /// Destination overlay address.
    pub overlay: String,
    /// Destination IPv6 overlay address, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay6: Option<String>,
    /// First hop's node id (the destination itself when direct).
    pub next_hop: String,
    /// First hop's host name.
    pub next_hop_hostname: Option<String>,
    /// Links on the path.
    pub hops: u32,
    /// Sum of link latencies, in milliseconds.
    pub latency_ms: u32,
    /// Whether an end-to-end session with the destination is up.
    pub session: bool,
    /// Subnets the destination proxies.
    pub proxied: Vec<String>,
}

/// A configured peer not yet connected.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingJson {
    /// Endpoint.
    pub endpoint: String,
    /// Failed attempts.
    pub attempts: u32,
    /// Last error.
    pub error: Option<String>,
}

/// Refused inbound handshakes from one source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefusedJson {
    /// Source.
    pub from: String,
    /// Why we refused, in words.
    pub reason: String,
    /// Why we refused, as a kind (the metrics label; `other` from a node too old to
    /// say).
    #[serde(default)]
    pub kind: FailureKind,
    /// How many.
    pub count: u64,
    /// Seconds since the last.
    pub last_secs: u64,
}

/// What status shows of the userspace services.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UserspaceJson {
    /// The SOCKS5 address.
    pub socks5: Option<String>,
    /// Whether SOCKS5 asks for a user name and password.
    pub socks5_auth: bool,
    /// `--forward` specs.
    pub forwards: Vec<String>,
    /// `--expose` specs.
    pub exposes: Vec<String>,
    /// Open TCP connections in the stack.
    pub tcp_connections: usize,
    /// Open UDP sockets in the stack.
    pub udp_sockets: usize,
    /// Packets into and out of the stack, and dropped each way.
    pub packets_in: u64,
    /// Packets out of the stack.
    pub packets_out: u64,
    /// Packets dropped on the way in (stack behind).
    pub dropped_in: u64,
    /// Packets dropped on the way out (pipeline behind).
    pub dropped_out: u64,
    /// SOCKS5 CONNECTs relayed.
    pub socks5_connects: u64,
    /// SOCKS5 UDP associations.
    pub socks5_associations: u64,
    /// SOCKS5 requests refused.
    pub socks5_refused: u64,
    /// Connections and UDP flows relayed by forwards and exposes.
    pub relayed: u64,
    /// What could not be relayed.
    pub failed: u64,
    /// Connections and UDP flows refused by an `--expose` at its cap.
    #[serde(default)]
    pub expose_refused: u64,
}

/// Whether a counter is zero (left out of the JSON then).
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &u64) -> bool {
    *n == 0
}
