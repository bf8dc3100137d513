//! The pure model behind the window: the history of status snapshots, the rates
//! computed from their counters, peer rows with their health, and sorting. No egui,
//! no sockets, no clock reads: every function takes the instant it is about.

use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use weft_control::{PathKind, PeerJson, PeerState, PortalClientJson, RouteJson, StatusJson};

/// How far back the throughput plot reaches.
pub const HISTORY: Duration = Duration::from_secs(300);

/// Receive and send rates, in bytes per second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rate {
    /// Bytes received per second.
    pub rx: f64,
    /// Bytes sent per second.
    pub tx: f64,
}

/// Byte counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    rx: u64,
    tx: u64,
}

/// One status snapshot reduced to what the plot needs.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    total: Counters,
    peers: BTreeMap<String, Counters>,
}

/// Rates between two consecutive samples, stamped with the later one's time.
#[derive(Debug, Clone)]
struct RatePoint {
    at: Instant,
    total: Rate,
    peers: BTreeMap<String, Rate>,
}

/// Snapshots of one node over the last [`HISTORY`], turned into rates.
///
/// Counters only grow while a node runs; a new node id or a shorter uptime means the
/// node restarted, and the history starts over rather than showing a negative rate.
#[derive(Debug, Default)]
pub struct History {
    node: Option<(String, u64)>,
    last: Option<Sample>,
    points: VecDeque<RatePoint>,
}

impl History {
    /// Records a snapshot taken at `at`.
    pub fn push(&mut self, at: Instant, status: &StatusJson) {
        let restarted =
            self.node.as_ref().is_some_and(|(id, uptime)| *id != status.node_id || status.uptime_secs < *uptime);
        if restarted {
            self.clear();
        }
        self.node = Some((status.node_id.clone(), status.uptime_secs));
        let sample = Sample {
            at,
            total: Counters {
                rx: status.pipelines.iter().map(|p| p.rx_bytes).sum(),
                tx: status.pipelines.iter().map(|p| p.tx_bytes).sum(),
            },
            peers: status
                .peers
                .iter()
                .map(|p| (p.node_id.clone(), Counters { rx: p.rx_bytes, tx: p.tx_bytes }))
                .collect(),
        };
        if let Some(prev) = &self.last {
            let secs = at.saturating_duration_since(prev.at).as_secs_f64();
            if secs > 0.0 {
                let peers = sample
                    .peers
                    .iter()
                    .filter_map(|(id, now)| prev.peers.get(id).map(|before| (id.clone(), rate(*before, *now, secs))))
                    .collect();
                self.points.push_back(RatePoint { at, total: rate(prev.total, sample.total, secs), peers });
            }
        }
        self.last = Some(sample);
        while self.points.front().is_some_and(|p| at.saturating_duration_since(p.at) > HISTORY) {
            self.points.pop_front();
        }
    }

    /// Forgets everything (the node went away or restarted).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// The latest total rate, once two snapshots exist.
    pub fn total_rate(&self) -> Option<Rate> {
        self.points.back().map(|p| p.total)
    }

    /// The latest rate of one peer, once two snapshots list it.
    pub fn peer_rate(&self, node_id: &str) -> Option<Rate> {
        self.points.back().and_then(|p| p.peers.get(node_id).copied())
    }

    /// The total rate over time, as `(seconds relative to now, rate)` points.
    pub fn total_series(&self, now: Instant) -> Series {
        self.series(now, |p| Some(p.total))
    }

    /// One peer's rate over time; empty while the history never saw it.
    pub fn peer_series(&self, now: Instant, node_id: &str) -> Series {
        self.series(now, |p| p.peers.get(node_id).copied())
    }

    fn series(&self, now: Instant, pick: impl Fn(&RatePoint) -> Option<Rate>) -> Series {
        let mut s = Series::default();
        for p in &self.points {
            if let Some(r) = pick(p) {
                let x = -(now.saturating_duration_since(p.at).as_secs_f64());
                s.rx.push([x, r.rx]);
                s.tx.push([x, r.tx]);
            }
        }
        s
    }
}

/// Points of a throughput plot: x in seconds relative to now (negative), y in bytes/s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Receive rate.
    pub rx: Vec<[f64; 2]>,
    /// Send rate.
    pub tx: Vec<[f64; 2]>,
}

fn rate(before: Counters, now: Counters, secs: f64) -> Rate {
    // A counter that went backwards (peer entry recreated) has no rate this time.
    let per_sec = |b: u64, n: u64| n.checked_sub(b).map_or(0.0, |d| d as f64 / secs);
    Rate { rx: per_sec(before.rx, now.rx), tx: per_sec(before.tx, now.tx) }
}

/// Whether a peer carries traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// Session established with a path.
    Up,
    /// Handshaking; no traffic yet.
    Connecting,
    /// A reachable member without a session (one is made when traffic wants it).
    Idle,
    /// No session or no path.
    Down,
}

impl Health {
    /// Classifies a peer from its status.
    pub fn of(p: &PeerJson) -> Self {
        match (p.state, p.path) {
            (_, PathKind::None) | (PeerState::Down, _) => Self::Down,
            (PeerState::Established, _) => Self::Up,
            (PeerState::Connecting, _) => Self::Connecting,
            (PeerState::Idle, _) => Self::Idle,
            (PeerState::Unknown, _) => Self::Down,
        }
    }

    /// The word shown in the window.
    pub fn label(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Connecting => "connecting",
            Self::Idle => "idle",
            Self::Down => "DOWN",
        }
    }
}

/// A peer as the table shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerRow {
    /// Node id (what remove-peer takes).
    pub node_id: String,
    /// Overlay address.
    pub overlay: String,
    /// IPv6 overlay address, if the member has one.
    pub overlay6: Option<String>,
    /// Host name.
    pub hostname: String,
    /// `direct`, `relay via NAME` or `none`.
    pub path: String,
    /// Transport of the path.
    pub transport: String,
    /// Direct endpoint, if known.
    pub endpoint: Option<String>,
    /// Round-trip time in milliseconds.
    pub rtt_ms: Option<f64>,
    /// Fraction of probes lost.
    pub loss: Option<f32>,
    /// Current rates, once two snapshots exist.
    pub rate: Option<Rate>,
    /// Seconds since the last handshake.
    pub session_age_secs: Option<u64>,
    /// Up, connecting or down.
    pub health: Health,
    /// Why it is not established.
    pub error: Option<String>,
}

impl PeerRow {
    /// Builds the row of `p` with its rate from `history`.
    pub fn new(p: &PeerJson, history: &History) -> Self {
        let path = match p.path {
            PathKind::Relay => {
                let via = p.via_hostname.as_deref().or(p.via.as_deref()).unwrap_or("?");
                format!("relay via {via}")
            }
            other => other.as_str().to_owned(),
        };
        Self {
            node_id: p.node_id.clone(),
            overlay: p.overlay.clone(),
            overlay6: p.overlay6.clone(),
            hostname: p.hostname.clone(),
            path,
            transport: p.transport.clone(),
            endpoint: p.endpoint.clone(),
            rtt_ms: p.rtt_ms,
            loss: p.loss,
            rate: history.peer_rate(&p.node_id),
            session_age_secs: p.last_handshake_secs,
            health: Health::of(p),
            error: p.error.clone(),
        }
    }
}

/// A column of the peers table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerColumn {
    /// Overlay address (numeric order).
    Overlay,
    /// Host name.
    Hostname,
    /// Path.
    Path,
    /// Transport.
    Transport,
    /// Endpoint.
    Endpoint,
    /// Latency.
    Latency,
    /// Loss.
    Loss,
    /// Receive rate.
    Rx,
    /// Send rate.
    Tx,
    /// Session age.
    Age,
    /// Health.
    State,
}

impl PeerColumn {
    /// Every column, in table order.
    pub const ALL: [Self; 11] = [
        Self::Overlay,
        Self::Hostname,
        Self::State,
        Self::Path,
        Self::Transport,
        Self::Endpoint,
        Self::Latency,
        Self::Loss,
        Self::Rx,
        Self::Tx,
        Self::Age,
    ];

    /// Header text.
    pub fn title(self) -> &'static str {
        match self {
            Self::Overlay => "Overlay",
            Self::Hostname => "Host",
            Self::State => "State",
            Self::Path => "Path",
            Self::Transport => "Transport",
            Self::Endpoint => "Endpoint",
            Self::Latency => "Latency",
            Self::Loss => "Loss",
            Self::Rx => "Rx",
            Self::Tx => "Tx",
            Self::Age => "Session",
        }
    }
}

/// How the peers table is sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sort {
    /// By which column.
    pub column: PeerColumn,
    /// Largest first.
    pub descending: bool,
}

impl Default for Sort {
    fn default() -> Self {
        Self { column: PeerColumn::Overlay, descending: false }
    }
}

impl Sort {
    /// The sort after a click on `column`'s header: the same column flips direction,
    /// another one sorts ascending.
    pub fn clicked(self, column: PeerColumn) -> Self {
        if self.column == column {
            Self { column, descending: !self.descending }
        } else {
            Self { column, descending: false }
        }
    }

    /// Sorts rows; ties and missing values keep overlay order, missing values last.
    pub fn apply(self, rows: &mut [PeerRow]) {
        rows.sort_by(|a, b| {
            let ord = compare(self.column, a, b);
            let ord = if self.descending { ord.map(Ordering::reverse) } else { ord };
            ord.unwrap_or_else(|| b_missing_last(self.column, a, b)).then_with(|| overlay_key(a).cmp(&overlay_key(b)))
        });
    }
}

/// Compares two rows by a column; None when either lacks a value.
fn compare(column: PeerColumn, a: &PeerRow, b: &PeerRow) -> Option<Ordering> {
    fn opt<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<Ordering> {
        a?.partial_cmp(&b?)
    }
    match column {
        PeerColumn::Overlay => Some(overlay_key(a).cmp(&overlay_key(b))),
        PeerColumn::Hostname => Some(a.hostname.cmp(&b.hostname)),
        PeerColumn::State => Some(a.health.cmp(&b.health)),
        PeerColumn::Path => Some(a.path.cmp(&b.path)),
        PeerColumn::Transport => Some(a.transport.cmp(&b.transport)),
        PeerColumn::Endpoint => opt(a.endpoint.as_ref(), b.endpoint.as_ref()),
        PeerColumn::Latency => opt(a.rtt_ms, b.rtt_ms),
        PeerColumn::Loss => opt(a.loss, b.loss),
        PeerColumn::Rx => opt(a.rate.map(|r| r.rx), b.rate.map(|r| r.rx)),
        PeerColumn::Tx => opt(a.rate.map(|r| r.tx), b.rate.map(|r| r.tx)),
        PeerColumn::Age => opt(a.session_age_secs, b.session_age_secs),
    }
}

/// Order when a value is missing: rows without one go last, whatever the direction.
fn b_missing_last(column: PeerColumn, a: &PeerRow, b: &PeerRow) -> Ordering {
    let has = |r: &PeerRow| compare(column, r, r).is_some();
    has(b).cmp(&has(a))
}

/// Overlay addresses sort numerically (10.0.0.9 before 10.0.0.10); unparsable last.
fn overlay_key(r: &PeerRow) -> (bool, Option<Ipv4Addr>, &str) {
    let ip = r.overlay.split('/').next().and_then(|s| s.parse().ok());
    (ip.is_none(), ip, &r.overlay)
}

/// A route as the table shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRow {
    /// `host (overlay)`.
    pub destination: String,
    /// `direct` or the first relay's name.
    pub next_hop: String,
    /// Links on the path.
    pub hops: u32,
    /// Sum of link latencies in milliseconds.
    pub latency_ms: u32,
    /// Whether the end-to-end session is up.
    pub session: bool,
    /// Proxied subnets, comma separated.
    pub proxied: String,
}

impl RouteRow {
    /// Builds the row of `r`.
    pub fn new(r: &RouteJson) -> Self {
        let next_hop = if r.next_hop == r.node_id {
            "direct".to_owned()
        } else {
            r.next_hop_hostname.clone().unwrap_or_else(|| r.next_hop.clone())
        };
        Self {
            destination: format!("{} ({})", r.hostname, r.overlay),
            next_hop,
            hops: r.hops,
            latency_ms: r.latency_ms,
            session: r.session,
            proxied: r.proxied.join(", "),
        }
    }
}

/// `1.5 MB/s`-style text for a rate in bytes per second (decimal units, as iperf).
pub fn format_rate(bytes_per_sec: f64) -> String {
    format!("{}/s", format_bytes(bytes_per_sec))
}

/// How a member is reached, on the mesh map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// A direct path between the two ends.
    Direct,
    /// The last part of a relayed path: from the first relay to the member.
    Relayed,
}

/// A line on the mesh map between two of its nodes (indexes into `MeshMap::nodes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEdge {
    /// One end.
    pub from: usize,
    /// The other end.
    pub to: usize,
    /// Direct or relayed.
    pub kind: EdgeKind,
}

/// One member on the mesh map.
#[derive(Debug, Clone, PartialEq)]
pub struct MapNode {
    /// Node id.
    pub node_id: String,
    /// Host name, or the overlay address when it has none.
    pub label: String,
    /// Whether this is the node the window shows.
    pub me: bool,
    /// Session health (this node is always up).
    pub health: Health,
    /// What hovering shows: overlay, path, transport, latency, loss.
    pub detail: String,
}

/// The mesh as this node sees it: itself, every member it knows, a line for each
/// direct path and a dashed one from the first relay to each relayed member.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MeshMap {
    /// This node first, then the members by overlay address.
    pub nodes: Vec<MapNode>,
    /// The lines.
    pub edges: Vec<MapEdge>,
}

impl MeshMap {
    /// The map of `s`.
    pub fn new(s: &StatusJson) -> Self {
        let mut peers: Vec<&PeerJson> = s.peers.iter().collect();
        peers.sort_by_key(|p| p.overlay.parse::<Ipv4Addr>().ok());
        let mut nodes = vec![MapNode {
            node_id: s.node_id.clone(),
            label: if s.hostname.is_empty() { s.overlay.clone() } else { s.hostname.clone() },
            me: true,
            health: Health::Up,
            detail: format!("this node · {} · {}", s.overlay, s.cipher),
        }];
        for p in &peers {
            let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |r| format!("{r:.1} ms"));
            let via = p.via_hostname.as_deref().filter(|h| !h.is_empty()).or(p.via.as_deref());
            let path = match (p.path.as_str(), via) {
                ("relay", Some(v)) => format!("relayed via {v} ({} hops)", p.hops),
                (other, _) => other.to_owned(),
            };
            nodes.push(MapNode {
                node_id: p.node_id.clone(),
                label: if p.hostname.is_empty() { p.overlay.clone() } else { p.hostname.clone() },
                me: false,
                health: Health::of(p),
                detail: format!(
                    "{}{} · {} · {} · rtt {} · loss {} · {}",
                    p.overlay,
                    p.overlay6.as_deref().map_or_else(String::new, |a| format!(" {a}")),
                    path,
                    p.transport,
                    ms(p.rtt_ms),
                    p.loss.map_or_else(|| "-".to_owned(), |l| format!("{:.0}%", l * 100.0)),
                    Health::of(p).label()
                ),
            });
        }
        let index = |id: &str| nodes.iter().position(|n| n.node_id == id);
        let mut edges = Vec::new();
        for p in &peers {
            let Some(to) = index(&p.node_id) else { continue };
            match (p.path, p.via.as_deref().and_then(index)) {
                (PathKind::Direct, _) => edges.push(MapEdge { from: 0, to, kind: EdgeKind::Direct }),
                (PathKind::Relay, Some(via)) => edges.push(MapEdge { from: via, to, kind: EdgeKind::Relayed }),
                _ => {}
            }
        }
        Self { nodes, edges }
    }

    /// One line on what the map shows (also the accessible name of the drawing).
    pub fn summary(&self) -> String {
        let count = |k: EdgeKind| self.edges.iter().filter(|e| e.kind == k).count();
        let down = self.nodes.iter().filter(|n| n.health == Health::Down).count();
        format!(
            "Mesh map: {} members, {} direct paths, {} relayed, {} down",
            self.nodes.len(),
            count(EdgeKind::Direct),
            count(EdgeKind::Relayed),
            down
        )
    }
}

/// Whether a portal client has a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientState {
    /// A handshake in the last 3 minutes (WireGuard rekeys every 2 while traffic flows).
    Active,
    /// Connected once, quiet since.
    Idle,
    /// Never connected.
    Never,
}

impl ClientState {
    /// In words, as the table shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Idle => "idle",
            Self::Never => "never connected",
        }
    }
}

/// One client of the node's WireGuard portal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalRow {
    /// Client name.
    pub name: String,
    /// The address it was given.
    pub address: String,
    /// Where it last sent from, or `-`.
    pub endpoint: String,
    /// Whether it has a session now.
    pub state: ClientState,
    /// `12s ago`, or `never`.
    pub handshake: String,
    /// `received / sent`, in the window's byte units.
    pub traffic: String,
}

impl PortalRow {
    /// WireGuard keys are refused after 180 s: a client quieter than that has no session.
    const ACTIVE_SECS: u64 = 180;

    /// The row of `c`.
    pub fn new(c: &PortalClientJson) -> Self {
        let state = match c.last_handshake_secs {
            None => ClientState::Never,
            Some(s) if s <= Self::ACTIVE_SECS => ClientState::Active,
            Some(_) => ClientState::Idle,
        };
        Self {
            name: c.name.clone(),
            address: c.address.clone(),
            endpoint: c.endpoint.clone().unwrap_or_else(|| "-".into()),
            state,
            handshake: c.last_handshake_secs.map_or_else(|| "never".into(), |s| format!("{} ago", format_duration(s))),
            traffic: format!("{} / {}", format_bytes(c.rx_bytes as f64), format_bytes(c.tx_bytes as f64)),
        }
    }

    /// The rows of the node's portal clients, by name; empty without a portal.
    pub fn rows(s: &StatusJson) -> Vec<Self> {
        let mut v: Vec<Self> = s.wg_portal.iter().flat_map(|p| p.clients.iter().map(Self::new)).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

/// Decimal byte units: everything the window and `weft peers` show uses them.
const BYTE_UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];

/// The unit (index into B, kB, MB, GB, TB) `bytes` reads best in; the one a column or an
/// axis of values up to `bytes` uses for all of them, so rows compare at a glance
/// (never "8.2 MB/s" over "300.0 kB/s").
pub fn unit_for(bytes: f64) -> usize {
    let mut v = bytes.max(0.0);
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < BYTE_UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    unit
}

/// `bytes_per_sec` in `unit` (see [`unit_for`]): `0.3 MB/s`.
pub fn format_rate_in(bytes_per_sec: f64, unit: usize) -> String {
    let unit = unit.min(BYTE_UNITS.len() - 1);
    let v = bytes_per_sec.max(0.0) / 1000f64.powi(unit as i32);
    if unit == 0 { format!("{v:.0} B/s") } else { format!("{v:.1} {}/s", BYTE_UNITS[unit]) }
}

/// `1.5 MB`-style text (decimal units).
pub fn format_bytes(bytes: f64) -> String {
    let unit = unit_for(bytes);
    let v = bytes.max(0.0) / 1000f64.powi(unit as i32);
    if unit == 0 { format!("{v:.0} {}", BYTE_UNITS[unit]) } else { format!("{v:.1} {}", BYTE_UNITS[unit]) }
}

/// `3d 4h`, `2h 5m`, `4m 10s` or `9s`.
pub fn format_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests;
