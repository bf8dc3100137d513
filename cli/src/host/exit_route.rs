//! The policy routing of a node that uses an exit (`--use-exit-node`), as wg-quick
//! does: Weft's own sockets carry a firewall mark that keeps them on the main table, a
//! rule sends everything else to a table of ours whose default route is the TUN, and a
//! rule before it lets the main table's more specific routes (the LAN, the overlay)
//! win. `services::exit` decides when; the `ip` thread (`host::net`) and the exit's
//! guard run these.

use tracing::{info, warn};

/// Routing table of the exit route, and the firewall mark of Weft's own sockets.
pub const TABLE: u32 = 30566;
/// Priority of the rule that lets the main table's specific routes win.
const PRIO_SUPPRESS: u32 = 30565;
/// Priority of the rule that sends unmarked traffic to [`TABLE`].
const PRIO_TABLE: u32 = 30566;

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
        super::ip::ip(&refs).map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
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
                match super::ip::ip(&c) {
                    Ok(()) => {}
                    Err(e) if absent(&e) => break,
                    Err(e) => {
                        warn!(error = %e, "cannot remove an exit rule");
                        break;
                    }
                }
            }
        }
        if let Err(e) = super::ip::ip(&[family, "route", "flush", "table", &TABLE.to_string()])
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
    fn the_exit_route_is_wg_quick_s_shape_in_a_table_of_our_own() {
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
