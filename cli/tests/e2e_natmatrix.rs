//! The NAT matrix: pairs of members, each behind its own NAT router, meet through one
//! public member and go direct where their NATs allow it.
//!
//! ```text
//!                         switch (bridge): 203.0.113.0/24, 198.51.100.0/24, 100.200.0.0/24
//!   P 203.0.113.2 (public) ─┤
//!   cone:      A 10.N.0.2 ── R (masquerade)        wan 203.0.113.N ─┤
//!   symmetric: B 10.N.0.2 ── R (masquerade random) wan 198.51.100.N ─┤
//!   CGNAT:     C 10.N.0.2 ── home R (masquerade) 100.64.N.2 ── carrier R (masquerade) wan 203.0.113.N ─┤
//!   mapped:    D 10.N.0.2 ── R (masquerade random, miniupnpd) wan 100.200.0.N ─┤
//! ```
//!
//! Every router drops unsolicited inbound packets (conntrack state new) from its WAN,
//! so a packet passes only as the reply of a flow the inside opened towards exactly
//! that address and port, like Linux conntrack filtering anywhere. The pairs run at
//! once, each member pinging its partner through the overlay; the time until both see
//! each other's path as `direct` in `weft status --json` is printed per pair. Pings go
//! on for 30 s (20 s for the pair that stays relayed): a direct path must stay direct
//! under traffic, every status read after it came up.
//!
//! * cone×cone, CGNAT×cone: punching goes direct;
//! * cone×symmetric: the birthday method (the symmetric side opens 256 mappings
//!   towards the cone side, which probes random ports of its public address) goes
//!   direct;
//! * symmetric×symmetric: stays relayed through P, and the overlay still carries pings;
//!   `weft peers` says both sides are endpoint-dependent;
//! * symmetric+port mapping×symmetric: direct through the router's mapping (miniupnpd).
//!
//! Each member's `nat` status (`weft netcheck`) is checked against its router: P sees
//! a cone member at its own port (endpoint-independent, a guess from one observer),
//! a symmetric one at another port (endpoint-dependent).
//!
//! miniupnpd refuses documentation ranges as its external address, so that one router's
//! WAN uses 100.200.0.0/24, which exists only inside this test's namespaces (on-link
//! routes on each of them), like every other address here.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use netns::{Netns, Node, TempDir, ip, link, ping, require_root, wait_until};

const NET: [&str; 4] = ["--network-name", "natmatrix", "--network-secret", "natmatrix secret"];
const P_ADDR: &str = "203.0.113.2";
/// How long a pair may take to go direct.
const DIRECT_WITHIN: Duration = Duration::from_secs(30);
/// How long a pair that must stay relayed is watched.
const RELAYED_FOR: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Nat {
    /// `masquerade`: port preserving, endpoint-independent mapping.
    Cone,
    /// `masquerade random`: a new random port per destination.
    Symmetric,
    /// A home router (`masquerade`) behind a carrier NAT (`masquerade`, 100.64.0.0/10
    /// inside).
    Cgnat,
    /// `masquerade random` with miniupnpd answering PCP, NAT-PMP and UPnP-IGD.
    SymmetricMapped,
    /// `masquerade`, and whatever arrives for the member's port is let in (a
    /// forwarded port: an endpoint-independent filter, as on a full-cone NAT).
    FullCone,
}

fn nft(ns: &Netns, dir: &Path, rules: &str) {
    let path = dir.join(format!("{}.nft", ns.name));
    std::fs::write(&path, rules).unwrap();
    ns.exec_ok(&["nft", "-f", path.to_str().unwrap()]);
}

/// A NAT out of `wan` that drops unsolicited inbound packets (except what a port
/// mapping forwards); `random` makes its mapping endpoint-dependent.
fn nat(r: &Netns, dir: &Path, random: bool) {
    r.exec_ok(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let masquerade = if random { "masquerade random" } else { "masquerade" };
    nft(
        r,
        dir,
        &format!(
            "table ip nat {{\n chain post {{\n  type nat hook postrouting priority 100;\n  oifname \"wan\" {masquerade}\n }}\n}}\n\
             table inet filter {{\n chain input {{\n  type filter hook input priority 0;\n  iifname \"wan\" ct state new drop\n }}\n\
             chain forward {{\n  type filter hook forward priority 0;\n  iifname \"wan\" ct status dnat accept\n\
             iifname \"wan\" ct state new drop\n }}\n}}\n"
        ),
    );
}

/// Plugs `ns`'s interface `ifname` into the switch with `addr`, with on-link routes to
/// every public range of the test.
fn plug(sw: &Netns, ns: &Netns, ifname: &str, addr: &str, port: &str) {
    ip(&["link", "add", ifname, "netns", &ns.name, "type", "veth", "peer", "name", port, "netns", &sw.name]);
    sw.exec_ok(&["ip", "link", "set", port, "master", "br0"]);
    sw.exec_ok(&["ip", "link", "set", port, "up"]);
    ns.exec_ok(&["ip", "addr", "add", addr, "dev", ifname]);
    ns.exec_ok(&["ip", "link", "set", ifname, "up"]);
    for net in ["203.0.113.0/24", "198.51.100.0/24", "100.200.0.0/24"] {
        // The interface's own /24 already has its route.
        let _ = ns.exec_status(&["ip", "route", "add", net, "dev", ifname]);
    }
}

/// The test's internet: a switch (a bridge in a namespace of its own) and the public
/// member P on it, which every site dials. Dropped node first, then the namespaces.
struct Internet {
    _p: Node,
    _p_ns: Netns,
    switch: Netns,
}

impl Internet {
    fn new(dir: &Path) -> Self {
        let switch = Netns::new();
        switch.exec_ok(&["ip", "link", "add", "br0", "type", "bridge"]);
        switch.exec_ok(&["ip", "link", "set", "br0", "up"]);
        let p_ns = Netns::new();
        plug(&switch, &p_ns, "eth0", &format!("{P_ADDR}/24"), "pp");
        let mut pargs = NET.to_vec();
        pargs.extend(["-i", "10.126.126.1/24", "--threads", "1"]);
        let p = Node::start(&p_ns, dir, "p", &pargs);
        Self { _p: p, _p_ns: p_ns, switch }
    }
}

/// miniupnpd in the foreground in `r` (WAN `wan` at `external`, LAN `lan` = `lan_cidr`),
/// killed (by its PID) on drop.
struct Miniupnpd(Child);

impl Miniupnpd {
    fn start(r: &Netns, dir: &Path, external: &str, lan_cidr: &str) -> Self {
        nft(
            r,
            dir,
            concat!(
                "table inet miniupnpd {\n",
                " chain forward { type filter hook forward priority 0; policy accept; jump miniupnpd; }\n",
                " chain miniupnpd { }\n",
                " chain prerouting { type nat hook prerouting priority -100; policy accept; jump prerouting_miniupnpd; }\n",
                " chain postrouting { type nat hook postrouting priority 100; policy accept; jump postrouting_miniupnpd; }\n",
                " chain prerouting_miniupnpd { }\n",
                " chain postrouting_miniupnpd { }\n",
                "}\n"
            ),
        );
        let conf = dir.join("miniupnpd.conf");
        std::fs::write(
            &conf,
            format!(
                "ext_ifname=wan\next_ip={external}\nlistening_ip=lan\nenable_natpmp=yes\nenable_upnp=yes\n\
                 secure_mode=yes\nupnp_table_name=miniupnpd\nupnp_nat_table_name=miniupnpd\n\
                 upnp_forward_chain=miniupnpd\nupnp_nat_chain=prerouting_miniupnpd\n\
                 upnp_nat_postrouting_chain=postrouting_miniupnpd\n\
                 allow 1024-65535 {lan_cidr} 1024-65535\ndeny 0-65535 0.0.0.0/0 0-65535\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("miniupnpd.log")).unwrap();
        let child = r
            .cmd("/usr/sbin/miniupnpd")
            .args(["-d", "-f", conf.to_str().unwrap(), "-P", dir.join("miniupnpd.pid").to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let m = Self(child);
        wait_until(Duration::from_secs(10), "miniupnpd listens on 5351", || {
            let out = r.exec_ok(&["ss", "-uln"]);
            String::from_utf8_lossy(&out.stdout).contains(":5351")
        });
        m
    }
}

impl Drop for Miniupnpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One member behind its NAT: the namespaces (dropped after the node) and its router.
struct Site {
    node: Option<Node>,
    overlay: String,
    member: Netns,
    _upnpd: Option<Miniupnpd>,
    _routers: Vec<Netns>,
}

impl Drop for Site {
    fn drop(&mut self) {
        // The node goes first, while its namespace still exists.
        self.node.take();
    }
}

impl Site {
    fn node(&self) -> &Node {
        self.node.as_ref().unwrap()
    }
}

/// Builds site number `n` (1..) of kind `kind` on switch `sw` and starts its member.
fn site(sw: &Netns, dir: &Path, n: u8, kind: Nat) -> Site {
    let member = Netns::new();
    let r = Netns::new();
    let lan = format!("10.{n}.0.0/24");
    link(&r, "lan", &format!("10.{n}.0.1/24"), &member, "eth0", &format!("10.{n}.0.2/24"));
    member.exec_ok(&["ip", "route", "add", "default", "via", &format!("10.{n}.0.1")]);
    let port = format!("s{n}");
    let mut routers = Vec::new();
    let mut upnpd = None;
    match kind {
        Nat::Cone => {
            plug(sw, &r, "wan", &format!("203.0.113.{}/24", 10 + n), &port);
            nat(&r, dir, false);
        }
        Nat::Symmetric => {
            plug(sw, &r, "wan", &format!("198.51.100.{}/24", 10 + n), &port);
            nat(&r, dir, true);
        }
        Nat::FullCone => {
            plug(sw, &r, "wan", &format!("203.0.113.{}/24", 10 + n), &port);
            nat(&r, dir, false);
            nft(
                &r,
                dir,
                &format!(
                    "table ip fullcone {{\n chain pre {{\n  type nat hook prerouting priority -100;\n  \
                     iifname \"wan\" udp dport 11010 dnat to 10.{n}.0.2:11010\n }}\n}}\n"
                ),
            );
        }
        Nat::SymmetricMapped => {
            let external = format!("100.200.0.{}", 10 + n);
            plug(sw, &r, "wan", &format!("{external}/24"), &port);
            nat(&r, dir, true);
            assert!(
                Path::new("/usr/sbin/miniupnpd").exists(),
                "this test needs miniupnpd: apt-get install miniupnpd-nftables"
            );
            upnpd = Some(Miniupnpd::start(&r, dir, &external, &lan));
        }
        Nat::Cgnat => {
            // The home router's WAN is the carrier's inside network (100.64.0.0/10).
            let carrier = Netns::new();
            link(&carrier, "lan", &format!("100.64.{n}.1/24"), &r, "wan", &format!("100.64.{n}.2/24"));
            r.exec_ok(&["ip", "route", "add", "default", "via", &format!("100.64.{n}.1")]);
            nat(&r, dir, false);
            carrier.exec_ok(&["ip", "route", "add", &lan, "via", &format!("100.64.{n}.2")]);
            plug(sw, &carrier, "wan", &format!("203.0.113.{}/24", 10 + n), &port);
            nat(&carrier, dir, false);
            routers.push(carrier);
        }
    }
    routers.push(r);
    let overlay = format!("10.126.126.{}", 10 + n);
    let cidr = format!("{overlay}/24");
    let mut args = NET.to_vec();
    args.extend(["-i", &cidr, "--threads", "1", "-p", "udp://203.0.113.2:11010"]);
    let node = Node::start(&member, dir, &format!("m{n}"), &args);
    Site { node: Some(node), overlay, member, _upnpd: upnpd, _routers: routers }
}

fn path_of(from: &Site, to: &Site) -> String {
    from.node().peer(&to.overlay).map(|p| p["path"].as_str().unwrap_or("").to_owned()).unwrap_or_default()
}

/// What one pair did.
#[derive(Debug)]
struct Outcome {
    name: &'static str,
    /// Time from both members knowing each other to both seeing a direct path.
    direct_after: Option<Duration>,
    /// Status reads after `direct_after` that saw another path.
    left_direct: u32,
    /// Whether pings crossed the overlay throughout.
    pinged: bool,
    /// Each side's view of the other at the end (path, reason).
    seen: String,
    /// Birthday probes a sent to b, and mappings b opened for them (and the other way).
    hard_nat: [u64; 4],
    /// Punch packets a sent to b's addresses, and b to a's.
    punches: [u64; 2],
}

/// Pings `a` → `b` over the overlay (5 a second) for `limit`, reading both members'
/// status every 100 ms: when both first see a direct path (from the first ping), and
/// how often one of them saw another path after that (a direct path must not flip).
fn run_pair(name: &'static str, a: &Site, b: &Site, limit: Duration) -> Outcome {
    wait_until(Duration::from_secs(30), &format!("{name}: both members know each other through P"), || {
        a.node().routes_to(&b.overlay) && b.node().routes_to(&a.overlay)
    });
    let count = (limit.as_millis() / 200 + 5).to_string();
    let pings = a
        .member
        .cmd("ping")
        .args(["-q", "-i", "0.2", "-W", "1", "-c", &count, &b.overlay])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut direct_after = None;
    let mut left_direct = 0;
    while start.elapsed() < limit {
        let both = path_of(a, b) == "direct" && path_of(b, a) == "direct";
        match direct_after {
            None if both => direct_after = Some(start.elapsed()),
            Some(_) if !both => left_direct += 1,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The pings stop (by their own PID); every one sent so far must have come back,
    // but the last (in flight when stopped).
    // SAFETY: kill has no memory preconditions; the PID is our own child's.
    unsafe { libc::kill(pings.id() as i32, libc::SIGINT) };
    let out = pings.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    let numbers: Vec<u64> = summary
        .lines()
        .find(|l| l.contains("transmitted"))
        .map(|l| l.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default();
    let mut pinged = matches!(numbers.as_slice(), [sent, received, ..] if *sent > 0 && received + 1 >= *sent);
    if !pinged {
        eprintln!("natmatrix: {name}: pings: {summary}");
    }
    // One more round after the verdict: the overlay works either way.
    pinged &= ping(&a.member, &b.overlay) && ping(&b.member, &a.overlay);
    let view = |x: &Site, y: &Site| {
        x.node().peer(&y.overlay).map(|p| format!("{} ({})", p["path"], p["no_direct"])).unwrap_or_default()
    };
    let seen = format!("{} / {}", view(a, b), view(b, a));
    let count =
        |x: &Site, y: &Site, field: &str| x.node().peer(&y.overlay).and_then(|p| p[field].as_u64()).unwrap_or(0);
    let hard_nat = [
        count(a, b, "hard_nat_probes"),
        count(b, a, "hard_nat_mappings"),
        count(b, a, "hard_nat_probes"),
        count(a, b, "hard_nat_mappings"),
    ];
    let punches = [count(a, b, "punch_packets"), count(b, a, "punch_packets")];
    Outcome { name, direct_after, left_direct, pinged, seen, hard_nat, punches }
}

#[test]
fn nat_matrix_pairs_go_direct_where_the_nats_allow() {
    require_root();
    let dir = TempDir::new();
    let net = Internet::new(&dir.0);
    let sw = &net.switch;

    let kinds = [
        ("cone x cone", Nat::Cone, Nat::Cone),
        ("cgnat x cone", Nat::Cgnat, Nat::Cone),
        ("cone x symmetric", Nat::Cone, Nat::Symmetric),
        ("symmetric x symmetric", Nat::Symmetric, Nat::Symmetric),
        ("symmetric+mapping x symmetric", Nat::SymmetricMapped, Nat::Symmetric),
    ];
    let sites: Vec<(&'static str, Site, Site)> = kinds
        .iter()
        .enumerate()
        .map(|(i, (name, ka, kb))| {
            let n = 2 * i as u8 + 1;
            (*name, site(sw, &dir.0, n, *ka), site(sw, &dir.0, n + 1, *kb))
        })
        .collect();

    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = sites
            .iter()
            .map(|(name, a, b)| {
                let limit = if name.starts_with("symmetric x") { RELAYED_FOR } else { DIRECT_WITHIN };
                s.spawn(move || run_pair(name, a, b, limit))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in &outcomes {
        let t =
            o.direct_after.map_or_else(|| "relayed".to_owned(), |d| format!("direct after {:.1} s", d.as_secs_f64()));
        let [ab, bm, ba, am] = o.hard_nat;
        let [pa, pb] = o.punches;
        eprintln!(
            "natmatrix: {:<30} {t:<22} left direct {}x, pings {}; punches a->b {pa}, b->a {pb}; probes a->b {ab} (b opened {bm} mappings), b->a {ba} (a opened {am}); {}",
            o.name,
            o.left_direct,
            if o.pinged { "ok" } else { "LOST" },
            o.seen
        );
    }
    let get = |name: &str| outcomes.iter().find(|o| o.name == name).unwrap();
    for name in ["cone x cone", "cgnat x cone", "cone x symmetric", "symmetric+mapping x symmetric"] {
        let o = get(name);
        assert!(o.direct_after.is_some(), "{name} did not go direct within {DIRECT_WITHIN:?}: {}", o.seen);
        assert!(o.pinged, "{name}: pings lost");
        assert_eq!(o.left_direct, 0, "{name}: the direct path flipped back");
    }
    // cone x symmetric went direct by the birthday method: the cone side probed, the
    // symmetric side opened mappings, within the bounds; nobody else probed.
    let [probes, mappings, back, _] = get("cone x symmetric").hard_nat;
    assert!(probes > 0 && mappings > 0 && back == 0, "{:?}", get("cone x symmetric").hard_nat);
    assert!(probes <= 8 * 256 && mappings <= 16 * 256, "{probes} probes, {mappings} mappings");
    // Every pair that went direct punched, a bounded number of packets.
    for o in outcomes.iter().filter(|o| o.direct_after.is_some()) {
        let [pa, pb] = o.punches;
        assert!(pa + pb > 0 && pa <= 200 && pb <= 200, "{}: punches {:?}", o.name, o.punches);
    }
    for name in ["cone x cone", "cgnat x cone", "symmetric x symmetric", "symmetric+mapping x symmetric"] {
        assert_eq!(get(name).hard_nat, [0; 4], "{name} took the birthday method");
    }
    let hard = get("symmetric x symmetric");
    assert!(hard.direct_after.is_none(), "two endpoint-dependent NATs went direct: {}", hard.seen);
    assert!(hard.pinged, "symmetric x symmetric: the relayed overlay lost pings");
    assert!(hard.seen.contains("both sides endpoint-dependent"), "{}", hard.seen);

    // What each member's netcheck says of its own NAT.
    for (name, a, b) in &sites {
        for (site, kind) in [(a, name.split(" x ").next().unwrap()), (b, name.split(" x ").nth(1).unwrap())] {
            let nat = &site.node().status()["nat"];
            let want = if kind.starts_with("symmetric") { "endpoint-dependent" } else { "endpoint-independent" };
            assert_eq!(nat["mapping"], want, "{name}: {kind} member: {nat}");
            assert_eq!(nat["port_preserving"], !kind.starts_with("symmetric"), "{name}: {kind}: {nat}");
            assert_eq!(nat["observed"][0]["hostname"].as_str().map(|h| !h.is_empty()), Some(true), "{nat}");
            // Every router here lets in only answers (conntrack state new is dropped);
            // the miniupnpd one forwards the mapped port.
            let filtering = if kind.contains("mapping") { "port mapped" } else { "dependent or untested" };
            assert_eq!(nat["filtering"], filtering, "{name}: {kind}: {nat}");
        }
    }
    let (hard_a, hard_b) = sites.iter().find(|s| s.0 == "symmetric x symmetric").map(|s| (&s.1, &s.2)).unwrap();
    let (ok, text) = netns::weft_out(&["netcheck", "--control", hard_a.node().control.to_str().unwrap()]);
    assert!(ok, "{text}");
    eprintln!("{text}");
    assert!(text.contains("mapping      endpoint-dependent (a guess: seen by one member only)"), "{text}");
    assert!(
        text.contains("filtering    dependent or untested (only answers to this node's own packets got in so far)"),
        "{text}"
    );
    assert!(text.contains(&format!("({}): both sides endpoint-dependent", hard_b.overlay)), "{text}");
    drop(sites);
}

/// Sets a router's conntrack UDP timeouts (both unanswered and answered flows): the
/// time its NAT keeps an idle mapping.
fn forget_udp_after(r: &Netns, secs: u32) {
    for key in ["net.netfilter.nf_conntrack_udp_timeout", "net.netfilter.nf_conntrack_udp_timeout_stream"] {
        r.exec_ok(&["sysctl", "-qw", &format!("{key}={secs}")]);
    }
}

/// A's view of B: its path and the keepalive interval of its idle direct path.
fn keepalive_of(a: &Site, b: &Site) -> (String, Option<f64>) {
    let p = a.node().peer(&b.overlay).unwrap_or_default();
    (p["path"].as_str().unwrap_or("").to_owned(), p["nat_keepalive_secs"].as_f64())
}

/// Two cone members whose routers forget an idle UDP mapping after 15 s, and a pair
/// whose routers keep the Linux defaults (30 s unanswered, 120 s answered), each
/// direct and then quiet for 31 s: the forgetful NAT costs the first pair its direct path
/// once, the member learns (its keepalive goes from 25 s to 12.5 s on that path), and
/// after the next pause the path is still direct and answers at once; the other pair's
/// path survives both pauses with 25 s, which it keeps.
#[test]
fn idle_direct_paths_across_a_forgetful_nat_learn_the_keepalive_it_needs() {
    require_root();
    let dir = TempDir::new();
    let net = Internet::new(&dir.0);
    let sw = &net.switch;
    let (a, b) = (site(sw, &dir.0, 1, Nat::Cone), site(sw, &dir.0, 2, Nat::Cone));
    let (c, d) = (site(sw, &dir.0, 3, Nat::Cone), site(sw, &dir.0, 4, Nat::Cone));
    for s in [&a, &b] {
        forget_udp_after(s._routers.last().unwrap(), 15);
    }
    let direct = |x: &Site, y: &Site| {
        wait_until(Duration::from_secs(30), "the pair knows each other", || {
            x.node().routes_to(&y.overlay) && y.node().routes_to(&x.overlay)
        });
        wait_until(Duration::from_secs(30), "the pair goes direct", || {
            ping(&x.member, &y.overlay);
            path_of(x, y) == "direct" && path_of(y, x) == "direct"
        })
    };
    // Loss probes run for 10 to 12 s after the last data, so each NAT's mapping of
    // the path is idle from then: the forgetful one forgets it 15 s later, and the
    // members' first keepalives (25 s after their last packet) are not due before
    // the pause ends. (A's and B's alike: B's, once due, would punch the path open
    // again by itself, since both NATs keep their ports.) The pair A, B goes direct
    // last, just before the pause.
    let pause = Duration::from_secs(31);
    for (x, y) in [(&c, &d), (&a, &b)] {
        direct(x, y);
        assert_eq!(keepalive_of(x, y), ("direct".to_owned(), Some(25.0)), "a fresh path across a NAT: 25 s");
    }
    // First pause: longer than the forgetful NAT keeps the mapping, and without a
    // keepalive (the path's first is due 25 s after its last packet). The margins are
    // a few seconds each way: on a loaded machine the NAT may not have forgotten yet
    // when the pause ends (the ping then crosses, and the pause is taken again).
    let lost = |x: &Site| x.node().log_text().matches("an idle direct path died across our NAT").count();
    let (lost_a, lost_c) = (lost(&a), lost(&c));
    let mut back = None;
    for _ in 0..3 {
        std::thread::sleep(pause);
        assert!(ping(&c.member, &d.overlay), "the default NATs' pair answers at once");
        assert_eq!(path_of(&c, &d), "direct");
        // A's first packets after it are lost: A finds the path silent, punches it
        // open again (through P), and learns.
        let took = direct(&a, &b);
        if lost(&a) > lost_a {
            back = Some(took);
            break;
        }
        eprintln!("natkeepalive: the forgetful NAT still held the mapping after the pause; pausing again");
    }
    let Some(back) = back else {
        panic!(
            "the forgetful NAT did not cost the direct path in three pauses: {:?}\n{}",
            a.node().peer(&b.overlay),
            a.node().log_text()
        )
    };
    assert_eq!(keepalive_of(&a, &b), ("direct".to_owned(), Some(12.5)), "A learned the keepalive this NAT needs");
    eprintln!("natkeepalive: after the first pause A went direct again in {back:?} with a 12.5 s keepalive");
    // Second pause: A's keepalives hold the mapping open; the path stays direct and the
    // first ping after it is answered.
    let (lost_a, took) = (lost(&a), Instant::now());
    std::thread::sleep(pause);
    assert!(ping(&a.member, &b.overlay), "the first ping after the second pause was lost");
    assert_eq!(path_of(&a, &b), "direct", "the path left direct");
    assert_eq!(lost(&a), lost_a, "the direct path died again");
    assert_eq!(keepalive_of(&a, &b).1, Some(12.5));
    assert!(ping(&c.member, &d.overlay) && path_of(&c, &d) == "direct");
    assert_eq!((keepalive_of(&c, &d).1, lost(&c)), (Some(25.0), lost_c), "the default NATs' pair kept 25 s");
    eprintln!("natkeepalive: second pause of {:?} crossed on the direct path", took.elapsed());
}

/// Two members behind one NAT (on one LAN behind a cone router), and the public
/// member they both dial: they find each other through it and talk over their LAN
/// addresses, not through the router's public address (which needs the router to
/// hairpin, as many do not) and not through the relay.
#[test]
fn two_members_behind_one_nat_talk_over_their_lan_addresses() {
    require_root();
    let dir = TempDir::new();
    let net = Internet::new(&dir.0);
    let sw = &net.switch;
    // The router: its WAN on the switch, its LAN a bridge of its own with both members.
    let r = Netns::new();
    plug(sw, &r, "wan", "203.0.113.21/24", "s21");
    nat(&r, &dir.0, false);
    let lan = Netns::new();
    lan.exec_ok(&["ip", "link", "add", "br0", "type", "bridge"]);
    lan.exec_ok(&["ip", "link", "set", "br0", "up"]);
    let attach = |ns: &Netns, ifname: &str, port: &str, addr: &str| {
        ip(&["link", "add", ifname, "netns", &ns.name, "type", "veth", "peer", "name", port, "netns", &lan.name]);
        lan.exec_ok(&["ip", "link", "set", port, "master", "br0"]);
        lan.exec_ok(&["ip", "link", "set", port, "up"]);
        ns.exec_ok(&["ip", "addr", "add", addr, "dev", ifname]);
        ns.exec_ok(&["ip", "link", "set", ifname, "up"]);
    };
    attach(&r, "lan", "pr", "10.9.0.1/24");
    let (m1, m2) = (Netns::new(), Netns::new());
    let mut nodes = Vec::new();
    for (i, m) in [(2, &m1), (3, &m2)] {
        attach(m, "eth0", &format!("p{i}"), &format!("10.9.0.{i}/24"));
        m.exec_ok(&["ip", "route", "add", "default", "via", "10.9.0.1"]);
        let cidr = format!("10.126.126.{}/24", 30 + i);
        let mut args = NET.to_vec();
        args.extend(["-i", &cidr, "--threads", "1", "-p", "udp://203.0.113.2:11010"]);
        nodes.push(Node::start(m, &dir.0, &format!("h{i}"), &args));
    }
    let (n1, n2) = (&nodes[0], &nodes[1]);
    wait_until(Duration::from_secs(30), "both members know each other through P", || {
        n1.routes_to("10.126.126.33") && n2.routes_to("10.126.126.32")
    });
    let took = wait_until(Duration::from_secs(30), "the two go direct", || {
        ping(&m1, "10.126.126.33");
        let seen = |n: &Node, addr: &str| n.peer(addr).map(|p| (p["path"].clone(), p["endpoint"].clone()));
        seen(n1, "10.126.126.33").is_some_and(|(path, _)| path == "direct")
            && seen(n2, "10.126.126.32").is_some_and(|(path, _)| path == "direct")
    });
    let endpoint = |n: &Node, addr: &str| n.peer(addr).unwrap()["endpoint"].as_str().unwrap_or("").to_owned();
    assert_eq!(endpoint(n1, "10.126.126.33"), "udp://10.9.0.3:11010", "not over the LAN");
    assert_eq!(endpoint(n2, "10.126.126.32"), "udp://10.9.0.2:11010", "not over the LAN");
    assert!(ping(&m2, "10.126.126.32"));
    // Their path leaves no NAT: no keepalive for it.
    assert!(n1.peer("10.126.126.33").unwrap()["nat_keepalive_secs"].is_null());
    eprintln!("natmatrix: two members behind one NAT went direct over their LAN in {took:?}");
}

/// A member dials two members at their routers' public addresses, which they never
/// sent to: behind a router that lets anything in for the member's port (a full-cone
/// NAT), the handshake gets in and the member's netcheck says its filter is
/// endpoint-independent, naming the dialler; behind a router that lets in only
/// answers, nothing gets in and netcheck says "dependent or untested".
#[test]
fn netcheck_tells_a_filter_that_lets_strangers_in_from_one_that_does_not() {
    require_root();
    let dir = TempDir::new();
    let net = Internet::new(&dir.0);
    let sw = &net.switch;
    let (open, closed) = (site(sw, &dir.0, 5, Nat::FullCone), site(sw, &dir.0, 6, Nat::Cone));
    let d = Netns::new();
    plug(sw, &d, "eth0", "203.0.113.40/24", "pd");
    let mut dargs = NET.to_vec();
    dargs.extend(["-i", "10.126.126.40/24", "--threads", "1", "--listen", "udp://0.0.0.0:11010"]);
    dargs.extend(["-p", "udp://203.0.113.15:11010", "-p", "udp://203.0.113.16:11010"]);
    let nd = Node::start(&d, &dir.0, "d", &dargs);
    let filtering = |s: &Site| s.node().status()["nat"].clone();
    wait_until(Duration::from_secs(20), "the full-cone member takes the stranger's handshake", || {
        filtering(&open)["filtering"] == "endpoint-independent"
    });
    assert_eq!(filtering(&open)["unasked_from"], "203.0.113.40:11010", "{}", filtering(&open));
    let (ok, text) = netns::weft_out(&["netcheck", "--control", open.node().control.to_str().unwrap()]);
    assert!(
        ok && text.contains("filtering    endpoint-independent (a packet from 203.0.113.40:11010 got in unasked)"),
        "{text}"
    );
    assert!(open.node().log_text().contains("its NAT's filter lets strangers in"));
    // The other one's router dropped the same dial: nothing got in unasked.
    assert_eq!(filtering(&closed)["filtering"], "dependent or untested", "{}", filtering(&closed));
    assert!(nd.peer(&open.overlay).is_some_and(|p| p["path"] == "direct"), "D reached the full-cone member directly");
}
