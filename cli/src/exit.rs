//! Exit nodes. A member that offers the internet (`--exit-node`) announces 0.0.0.0/0
//! (and ::/0 with an IPv6 overlay) and forwards and masquerades what members send it,
//! with nftables rules in a table of its own. A member that uses one (`--use-exit-node`) sends its default route into
//! the TUN with policy routing, as wg-quick does: Weft's own sockets carry a firewall
//! mark that keeps them on the main table, a rule sends everything else to a table of
//! ours whose default route is the TUN, and a rule before it lets the main table's
//! more specific routes (the LAN, the overlay) win.

use tracing::{info, warn};

/// Routing table of the exit route, and the firewall mark of Weft's own sockets.
pub const TABLE: u32 = 30566;
/// Priority of the rule that lets the main table's specific routes win.
const PRIO_SUPPRESS: u32 = 30565;
/// Priority of the rule that sends unmarked traffic to [`TABLE`].
const PRIO_TABLE: u32 = 30566;

/// The nftables table of the exit on `dev`.
pub fn nft_table(dev: &str) -> String {
    format!("weft-exit-{dev}")
}

/// The nftables ruleset that makes this node an exit for `overlay` (the overlay
/// network, CIDR) and `overlay6` (the IPv6 overlay network, if any) on `dev`: forward
/// what members send, masquerade it on the way out, let the answers back in. One
/// `inet` table serves both families.
pub fn nft_ruleset(dev: &str, overlay: &str, overlay6: Option<&str>) -> String {
    let t = nft_table(dev);
    let mut masq = format!("\t\tip saddr {overlay} oifname != \"{dev}\" masquerade\n");
    let mut fwd = format!("\t\tiifname \"{dev}\" ip saddr {overlay} accept\n");
    if let Some(o6) = overlay6 {
        masq.push_str(&format!("\t\tip6 saddr {o6} oifname != \"{dev}\" masquerade\n"));
        fwd.push_str(&format!("\t\tiifname \"{dev}\" ip6 saddr {o6} accept\n"));
    }
    format!(
        "table inet {t} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         {masq}\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         {fwd}\
         \t\toifname \"{dev}\" ct state established,related accept\n\
         \t}}\n\
         }}\n"
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
        offer_exit: bool,
        uses: bool,
        fallback: bool,
        overlay: &str,
        overlay6: Option<&str>,
    ) -> Result<Self, String> {
        let g = Self { dev: dev.to_owned(), offered: offer_exit, uses };
        if offer_exit {
            offer(dev, overlay, overlay6)?;
        }
        if uses {
            unroute();
            if !fallback {
                route_through(dev, overlay6.is_some())?;
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

/// Installs the exit's rules (after removing any a crashed run left).
fn offer(dev: &str, overlay: &str, overlay6: Option<&str>) -> Result<(), String> {
    withdraw(dev);
    nft_stdin(&nft_ruleset(dev, overlay, overlay6))?;
    let nets = overlay6.map_or_else(|| overlay.to_owned(), |o6| format!("{overlay} and {o6}"));
    info!(table = %nft_table(dev), "exit node: forwarding and masquerading for {nets}");
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

fn nft_stdin(script: &str) -> Result<(), String> {
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

/// The rules, as `ip` arguments after `rule add|del`, for one family.
fn rules() -> [Vec<String>; 2] {
    let (table, suppress, prio) = (TABLE.to_string(), PRIO_SUPPRESS.to_string(), PRIO_TABLE.to_string());
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<String>>();
    [
        s(&["table", "main", "suppress_prefixlength", "0", "priority", &suppress]),
        s(&["not", "fwmark", &table, "table", &table, "priority", &prio]),
    ]
}

/// The `ip` commands that send the default route into `dev`. IPv4 goes through the
/// exit, and IPv6 too with an IPv6 overlay (`ipv6`); without one IPv6 is
/// blackholed, so it cannot leave by the host's own route either.
fn route_commands(dev: &str, ipv6: bool) -> Vec<Vec<String>> {
    let table = TABLE.to_string();
    let v6: &[&str] = if ipv6 {
        &["-6", "route", "replace", "default", "dev", dev, "table", &table]
    } else {
        &["-6", "route", "replace", "blackhole", "default", "table", &table]
    };
    let mut v = vec![
        ["-4", "route", "replace", "default", "dev", dev, "table", &table].map(str::to_owned).to_vec(),
        v6.iter().map(|x| (*x).to_owned()).collect(),
    ];
    for family in ["-4", "-6"] {
        for r in rules() {
            let mut c = vec![family.to_owned(), "rule".into(), "add".into()];
            c.extend(r);
            v.push(c);
        }
    }
    v
}

/// Sends the default route into `dev`; what a crashed run left must be gone first
/// ([`unroute`]).
pub fn route_through(dev: &str, ipv6: bool) -> Result<(), String> {
    for args in route_commands(dev, ipv6) {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::node::ip(&refs).map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    }
    let v6 = if ipv6 { "IPv6 too" } else { "IPv6 blocked: no IPv6 overlay" };
    info!(%dev, "default route through the exit node (table {TABLE}, rules {PRIO_SUPPRESS} and {PRIO_TABLE}; {v6})");
    Ok(())
}

/// Removes our rules (by their whole selector, every copy a crashed run may have
/// left) and empties our table, both families.
pub fn unroute() {
    let absent = |e: &str| e.contains("No such") || e.contains("does not exist") || e.contains("not found");
    for family in ["-4", "-6"] {
        for r in rules() {
            for _ in 0..16 {
                let mut c = vec![family, "rule", "del"];
                c.extend(r.iter().map(String::as_str));
                match crate::node::ip(&c) {
                    Ok(()) => {}
                    Err(e) if absent(&e) => break,
                    Err(e) => {
                        warn!(error = %e, "cannot remove an exit rule");
                        break;
                    }
                }
            }
        }
        if let Err(e) = crate::node::ip(&[family, "route", "flush", "table", &TABLE.to_string()])
            && !absent(&e)
        {
            warn!(error = %e, "cannot flush the exit route table");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_rules_are_wg_quick_s_shape_in_tables_of_our_own() {
        let r = nft_ruleset("weft0", "10.126.126.0/24", None);
        assert!(r.starts_with("table inet weft-exit-weft0 {"), "{r}");
        assert!(r.contains("ip saddr 10.126.126.0/24 oifname != \"weft0\" masquerade"), "{r}");
        assert!(r.contains("type nat hook postrouting priority srcnat"), "{r}");
        assert!(!r.contains("ip6"), "{r}");
        let r6 = nft_ruleset("weft0", "10.126.126.0/24", Some("fd00:1::/64"));
        assert!(r6.contains("ip6 saddr fd00:1::/64 oifname != \"weft0\" masquerade"), "{r6}");
        assert!(r6.contains("iifname \"weft0\" ip6 saddr fd00:1::/64 accept"), "{r6}");
        let v6: Vec<String> = route_commands("weft0", true).iter().map(|c| c.join(" ")).collect();
        assert_eq!(v6[1], "-6 route replace default dev weft0 table 30566");
        let cmds: Vec<String> = route_commands("weft0", false).iter().map(|c| c.join(" ")).collect();
        assert_eq!(
            cmds,
            [
                "-4 route replace default dev weft0 table 30566",
                "-6 route replace blackhole default table 30566",
                "-4 rule add table main suppress_prefixlength 0 priority 30565",
                "-4 rule add not fwmark 30566 table 30566 priority 30566",
                "-6 rule add table main suppress_prefixlength 0 priority 30565",
                "-6 rule add not fwmark 30566 table 30566 priority 30566",
            ]
        );
    }
}
