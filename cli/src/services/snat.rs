//! Subnet routes that need nothing from the LAN. A subnet router (`--proxy-network`)
//! translates the source of what members send into its proxied subnets to its own
//! address on the way out (masquerade), as Tailscale's subnet routers do: the LAN's
//! hosts answer the router, which they can reach, and need no route back to the
//! overlay. `--no-snat-subnet-routes` keeps members' sources for sites that route the
//! overlay to the router themselves (and want to see who connects).
//!
//! The rules are one nftables table of this node's own (`weft-snat-DEV`), made and
//! replaced in one transaction and removed when the node stops; they match only what
//! comes in from this node's TUN and leaves by another interface towards a proxied
//! subnet, so the host's other NAT (docker, libvirt) is untouched. An exit node
//! masquerades everything members send out already and needs none of this.

use std::net::IpAddr;

use tracing::info;

/// The nftables table of the subnet routes of `dev`.
pub fn nft_table(dev: &str) -> String {
    format!("weft-snat-{dev}")
}

/// The ruleset masquerading what arrives on `dev` for `subnets` (either family).
pub fn nft_ruleset(dev: &str, subnets: &[(IpAddr, u8)]) -> String {
    let t = nft_table(dev);
    let set = |name: &str, ty: &str, v6: bool| {
        let elems: Vec<String> = subnets
            .iter()
            .filter(|(a, _)| a.is_ipv6() == v6)
            .map(|&(a, p)| format!("{}/{p}", weft_core::route::network_ip(a, p)))
            .collect();
        let elements =
            if elems.is_empty() { String::new() } else { format!("\t\telements = {{ {} }}\n", elems.join(", ")) };
        format!("\tset {name} {{\n\t\ttype {ty}; flags interval; auto-merge;\n{elements}\t}}\n")
    };
    format!(
        "table inet {t} {{\n\
         {s4}{s6}\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tiifname \"{dev}\" oifname != \"{dev}\" ip daddr @subnets4 counter masquerade\n\
         \t\tiifname \"{dev}\" oifname != \"{dev}\" ip6 daddr @subnets6 counter masquerade\n\
         \t}}\n\
         }}\n",
        s4 = set("subnets4", "ipv4_addr", false),
        s6 = set("subnets6", "ipv6_addr", true),
    )
}

/// Puts the rules for `subnets` in force on `dev`, replacing what an earlier run or
/// the previous set of subnets left (one transaction: no moment without rules).
pub fn apply(dev: &str, subnets: &[(IpAddr, u8)]) -> Result<(), String> {
    let t = nft_table(dev);
    super::exit::nft_stdin(&format!("add table inet {t}\ndelete table inet {t}\n{}", nft_ruleset(dev, subnets)))
        .map_err(|e| e.replace("the exit rules", "the subnet routes' source translation"))?;
    let list: Vec<String> = subnets.iter().map(|(a, p)| format!("{a}/{p}")).collect();
    info!(table = %t, "subnet routes: members' sources translated to this router's own address into {}", list.join(", "));
    Ok(())
}

/// Removes the rules of `dev`, if any.
pub fn withdraw(dev: &str) {
    let _ = std::process::Command::new("nft")
        .args(["delete", "table", "inet", &nft_table(dev)])
        .stderr(std::process::Stdio::null())
        .status();
}

/// The rules of a running node, removed on drop.
pub struct Guard {
    dev: String,
}

impl Guard {
    /// Sets the rules up for `subnets` on `dev`.
    pub fn set_up(dev: &str, subnets: &[(IpAddr, u8)]) -> Result<Self, String> {
        apply(dev, subnets)?;
        Ok(Self { dev: dev.to_owned() })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        withdraw(&self.dev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_masquerade_only_what_comes_from_the_tun_towards_a_proxied_subnet() {
        let nets = ["192.168.50.0".parse().unwrap(), "fd12::".parse().unwrap()];
        let r = nft_ruleset("weft0", &[(nets[0], 24), (nets[1], 64), ("10.9.1.7".parse().unwrap(), 16)]);
        assert!(r.starts_with("table inet weft-snat-weft0 {"), "{r}");
        assert!(r.contains("elements = { 192.168.50.0/24, 10.9.0.0/16 }"), "{r}");
        assert!(r.contains("elements = { fd12::/64 }"), "{r}");
        assert!(r.contains("iifname \"weft0\" oifname != \"weft0\" ip daddr @subnets4 counter masquerade"), "{r}");
        assert!(r.contains("iifname \"weft0\" oifname != \"weft0\" ip6 daddr @subnets6 counter masquerade"), "{r}");
        assert!(!r.contains("drop") && !r.contains("hook forward"), "it filters nothing: {r}");
        // No IPv6 subnet: the set is there, empty, so the rule still loads.
        let r = nft_ruleset("weft0", &[(nets[0], 24)]);
        assert!(r.contains("set subnets6 {\n\t\ttype ipv6_addr; flags interval; auto-merge;\n\t}"), "{r}");
    }
}
