//! Exit nodes. A member that offers the internet (`--exit-node`) announces 0.0.0.0/0
//! (and ::/0 with an IPv6 overlay) and forwards and masquerades what members send it,
//! with nftables rules in a table of its own. A member that uses one (`--use-exit-node`) sends its default route into
//! the TUN with policy routing, as wg-quick does: Weft's own sockets carry a firewall
//! mark that keeps them on the main table, a rule sends everything else to a table of
//! ours whose default route is the TUN, and a rule before it lets the main table's
//! more specific routes (the LAN, the overlay) win (`host::exit_route`, which the
//! `ip` thread also drives when the exit comes and goes).

use std::net::IpAddr;

use tracing::info;

use crate::host::exit_route::{route_through, unroute};

/// The nftables table of the exit on `dev`.
pub fn nft_table(dev: &str) -> String {
    format!("weft-exit-{dev}")
}

/// What an exit forwards, for its nftables ruleset.
#[derive(Debug, Clone)]
pub struct Offer {
    /// The overlay network (CIDR).
    pub overlay: String,
    /// The IPv6 overlay network, if any.
    pub overlay6: Option<String>,
    /// Subnets this node proxies (the portal network among them): members reach
    /// them, and their hosts may start connections to members.
    pub served: Vec<(IpAddr, u8)>,
    /// The networks this host is connected to (refused as destinations with the
    /// private ranges unless `allow_lan`: [`weft_core::route::exit_refused`]).
    pub local: Vec<(IpAddr, u8)>,
    /// `--exit-allow-lan`.
    pub allow_lan: bool,
}

/// The nftables ruleset that makes this node an exit on `dev`: connections that start
/// in the overlay go out, masqueraded, and their answers come back; nothing else
/// crosses between the TUN and the host's other interfaces (a neighbour on the
/// upstream that routes the overlay via the exit reaches no member), except to and
/// from the subnets this node serves. Unless `allow_lan`, members reach neither
/// private, link-local or CGNAT addresses nor the host's own networks. One `inet`
/// table serves both families; its chain only ever drops what touches `dev`, so the
/// host's other forwarding (docker, libvirt) is untouched.
pub fn nft_ruleset(dev: &str, offer: &Offer) -> String {
    let t = nft_table(dev);
    let net = |a: &IpAddr, p: &u8| format!("{}/{p}", weft_core::route::network_ip(*a, *p));
    let family = |v6: bool, nets: &[(IpAddr, u8)]| -> Vec<String> {
        nets.iter().filter(|(a, _)| a.is_ipv6() == v6).map(|(a, p)| net(a, p)).collect()
    };
    let set = |name: &str, ty: &str, elems: Vec<String>| {
        let elements =
            if elems.is_empty() { String::new() } else { format!("\t\telements = {{ {} }}\n", elems.join(", ")) };
        format!("\tset {name} {{\n\t\ttype {ty}; flags interval; auto-merge;\n{elements}\t}}\n")
    };
    let refused = weft_core::route::exit_refused(offer.allow_lan, &offer.local);
    let (lan4, lan6) = (family(false, &refused), family(true, &refused));
    let mut masq = format!("\t\tip saddr {} oifname != \"{dev}\" masquerade\n", offer.overlay);
    let mut from_overlay = format!("\t\tiifname \"{dev}\" ip saddr {} accept\n", offer.overlay);
    if let Some(o6) = &offer.overlay6 {
        masq.push_str(&format!("\t\tip6 saddr {o6} oifname != \"{dev}\" masquerade\n"));
        from_overlay.push_str(&format!("\t\tiifname \"{dev}\" ip6 saddr {o6} accept\n"));
    }
    format!(
        "table inet {t} {{\n\
         {served4}{served6}{lan4}{lan6}\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         {masq}\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname \"{dev}\" ct state established,related accept\n\
         \t\toifname \"{dev}\" ct state established,related accept\n\
         \t\tiifname \"{dev}\" ip daddr @served4 accept\n\
         \t\tiifname \"{dev}\" ip6 daddr @served6 accept\n\
         \t\tiifname \"{dev}\" ip daddr @lan4 counter drop\n\
         \t\tiifname \"{dev}\" ip6 daddr @lan6 counter drop\n\
         {from_overlay}\
         \t\tiifname \"{dev}\" counter drop\n\
         \t\toifname \"{dev}\" ip saddr @served4 accept\n\
         \t\toifname \"{dev}\" ip6 saddr @served6 accept\n\
         \t\toifname \"{dev}\" counter drop\n\
         \t}}\n\
         }}\n",
        served4 = set("served4", "ipv4_addr", family(false, &offer.served)),
        served6 = set("served6", "ipv6_addr", family(true, &offer.served)),
        lan4 = set("lan4", "ipv4_addr", lan4),
        lan6 = set("lan6", "ipv6_addr", lan6),
    )
}

/// The exit rules of a running node, removed on drop.
pub struct Guard {
    dev: String,
    offered: bool,
    uses: bool,
}

impl Guard {
    /// Offers this node as an exit (`offer`) and/or prepares to use one: removes what
    /// a crashed run left and, unless `fallback`, routes through the TUN at once so
    /// internet traffic fails closed until the exit is reachable (with `fallback` the
    /// rules come and go with the exit, through [`route_through`] and [`unroute`]).
    pub fn set_up(
        dev: &str,
        offer_exit: Option<&Offer>,
        uses: bool,
        fallback: bool,
        ipv6: bool,
    ) -> Result<Self, String> {
        let g = Self { dev: dev.to_owned(), offered: offer_exit.is_some(), uses };
        if let Some(o) = offer_exit {
            offer(dev, o)?;
        }
        if uses {
            unroute();
            if !fallback {
                route_through(dev, ipv6)?;
            }
        }
        Ok(g)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.uses {
            unroute();
        }
        if self.offered {
            withdraw(&self.dev);
        }
    }
}

/// Installs the exit's rules, replacing any a crashed or earlier run left.
pub fn offer(dev: &str, o: &Offer) -> Result<(), String> {
    // One transaction: the table a crashed or earlier run left goes as the new one
    // comes, so a reload never opens a moment without rules.
    let t = nft_table(dev);
    nft_stdin(&format!("add table inet {t}\ndelete table inet {t}\n{}", nft_ruleset(dev, o)))?;
    let nets = o.overlay6.as_ref().map_or_else(|| o.overlay.clone(), |o6| format!("{} and {o6}", o.overlay));
    let lan = if o.allow_lan {
        "private and local networks allowed (--exit-allow-lan)"
    } else {
        "private, link-local, CGNAT and this host's networks refused"
    };
    info!(table = %nft_table(dev), "exit node: forwarding and masquerading connections from {nets}; {lan}");
    Ok(())
}

/// Removes the exit's rules, if any (an `ip` table is what versions before the IPv6
/// overlay made).
fn withdraw(dev: &str) {
    for family in ["inet", "ip"] {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", family, &nft_table(dev)])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

pub(crate) fn nft_stdin(script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft (is nftables installed?): {e}"))?;
    child.stdin.take().ok_or("nft has no stdin")?.write_all(script.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("nft refused the exit rules: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_rules_are_wg_quick_s_shape_in_tables_of_our_own() {
        let mut o = Offer {
            overlay: "10.126.126.0/24".into(),
            overlay6: None,
            served: vec![("192.168.7.0".parse().unwrap(), 24)],
            local: vec![("198.51.100.0".parse().unwrap(), 24), ("2001:db8:1::".parse().unwrap(), 64)],
            allow_lan: false,
        };
        let r = nft_ruleset("weft0", &o);
        assert!(r.starts_with("table inet weft-exit-weft0 {"), "{r}");
        assert!(r.contains("ip saddr 10.126.126.0/24 oifname != \"weft0\" masquerade"), "{r}");
        assert!(r.contains("type nat hook postrouting priority srcnat"), "{r}");
        assert_eq!(r.matches("masquerade").count(), 1, "IPv4 only: {r}");
        // New connections only from the overlay, never into it; the LAN refused.
        assert!(r.contains("elements = { 192.168.7.0/24 }"), "{r}");
        assert!(r.contains("169.254.0.0/16") && r.contains("100.64.0.0/10") && r.contains("198.51.100.0/24"), "{r}");
        assert!(r.contains("2001:db8:1::/64"), "{r}");
        let at = |rule: &str| r.find(rule).unwrap_or_else(|| panic!("{rule} missing from {r}"));
        assert!(at("iifname \"weft0\" ip daddr @served4 accept") < at("iifname \"weft0\" ip daddr @lan4 counter drop"));
        assert!(
            at("iifname \"weft0\" ip daddr @lan4 counter drop")
                < at("iifname \"weft0\" ip saddr 10.126.126.0/24 accept")
        );
        assert!(at("oifname \"weft0\" ip saddr @served4 accept") < at("oifname \"weft0\" counter drop"));
        o.allow_lan = true;
        o.overlay6 = Some("fd00:1::/64".into());
        let r6 = nft_ruleset("weft0", &o);
        assert!(!r6.contains("169.254.0.0/16") && !r6.contains("198.51.100.0/24"), "{r6}");
        assert!(r6.contains("224.0.0.0/4") && r6.contains("ff00::/8"), "never forwarded, LAN or not: {r6}");
        assert!(r6.contains("ip6 saddr fd00:1::/64 oifname != \"weft0\" masquerade"), "{r6}");
        assert!(r6.contains("iifname \"weft0\" ip6 saddr fd00:1::/64 accept"), "{r6}");
    }
}
