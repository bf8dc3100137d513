//! A network with an authority, in the config: the trusted authorities, this node's
//! certificate, the defaults it gives (addresses, host name) and the settings it does
//! not grant (refused at start).

use super::{FileConfig, IpNet, Ipv4Net, Ipv6Overlay, usage};
use crate::config::args::UpArgs;
use crate::config::values::UsageError;

/// What a node trusts and is trusted with: the next network secret, the authorities,
/// its certificate, the issuer's key and the access policy.
pub(super) struct Trust {
    pub network_secret_next: Option<super::Secret>,
    pub authorities: Vec<weft_core::cert::AuthorityId>,
    pub certificate: Option<weft_core::cert::Certificate>,
    pub authority_key: Option<std::path::PathBuf>,
    pub policy: Option<super::policy::Loaded>,
}

/// [`Trust`] from the flags over the file, with what its parts need of each other.
pub(super) fn trust(args: &UpArgs, file: &mut FileConfig, secret: &super::Secret) -> Result<Trust, UsageError> {
    let network_secret_next = match args.network_secret_next.clone().or_else(|| file.network_secret_next.take()) {
        Some(n) if n.0.is_empty() => return usage("invalid network-secret-next: it is empty"),
        Some(n) if n == *secret => None,
        n => n,
    };
    let (authorities, certificate) = authority(args, file)?;
    let authority_key = args.authority_key.clone().or_else(|| file.authority_key.take());
    let policy = match args.policy.clone().or_else(|| file.policy.take()) {
        Some(p) => Some(super::policy::Loaded::read(&p)?),
        None => None,
    };
    if authority_key.is_some() && certificate.is_none() {
        return usage(
            "--authority-key (issuing certificates for invites) needs --authority and this node's own --certificate",
        );
    }
    Ok(Trust { network_secret_next, authorities, certificate, authority_key, policy })
}

/// The authorities and this node's certificate. A certificate's addresses and host
/// name become the defaults of `--ipv4`, `--ipv6` and `--hostname` (and without an
/// IPv6 address granted, IPv6 is off).
pub(super) fn authority(
    args: &UpArgs,
    file: &mut FileConfig,
) -> Result<(Vec<weft_core::cert::AuthorityId>, Option<weft_core::cert::Certificate>), UsageError> {
    let given = if args.authorities.is_empty() { file.authority.take() } else { args.authorities.clone() };
    let mut authorities = Vec::new();
    for a in &given {
        let id = a.parse().map_err(|e| {
            UsageError(format!(
                "invalid --authority {a:?}: {e} (expected weft-authority:..., as `weft authority init` prints it)"
            ))
        })?;
        if !authorities.contains(&id) {
            authorities.push(id);
        }
    }
    let Some(c) = args.certificate.clone().or_else(|| file.certificate.take()) else {
        if authorities.is_empty() {
            return Ok((authorities, None));
        }
        return usage(
            "a network with an authority needs this node's --certificate (`weft id` prints the node id to have it signed with `weft authority sign`)",
        );
    };
    if authorities.is_empty() {
        return usage("--certificate needs --authority: the public key of the authority that signed it");
    }
    let cert = read_cert(&c).map_err(|e| UsageError(format!("--certificate: {e:#}")))?;
    let b = cert.body();
    if !authorities.contains(&b.authority) {
        return usage(format!("--certificate was signed by {}, which is not among --authority", b.authority));
    }
    if args.ipv4.is_none() && file.ipv4.is_none() && !args.dhcp && file.dhcp != Some(true) {
        file.ipv4 = Some(format!("{}/{}", b.ipv4.0, b.ipv4.1));
    }
    if args.hostname.is_none() && file.hostname.is_none() {
        file.hostname = Some(b.name.clone());
    }
    if args.ipv6.is_none() && file.ipv6.is_none() && !args.no_ipv6 && file.no_ipv6 != Some(true) {
        match b.ipv6 {
            Some((a, p)) => file.ipv6 = Some(format!("{a}/{p}")),
            None => file.no_ipv6 = Some(true),
        }
    }
    Ok((authorities, Some(cert)))
}

/// Refuses settings the certificate does not grant: a member claims only what its
/// certificate says (its peers would refuse anything else).
pub(super) fn within_certificate(
    b: &weft_core::cert::CertBody,
    ipv4: Ipv4Net,
    dhcp: bool,
    ipv6: &Ipv6Overlay,
    hostname: &str,
) -> Result<(), UsageError> {
    let granted = format!("{}/{}", b.ipv4.0, b.ipv4.1);
    if dhcp {
        return usage(format!("--dhcp and --certificate exclude each other: the certificate grants {granted}"));
    }
    if (ipv4.addr, ipv4.prefix) != b.ipv4 {
        return usage(format!("--ipv4 {ipv4} is not what the certificate grants ({granted})"));
    }
    if hostname != b.name {
        return usage(format!("--hostname {hostname:?} is not the name the certificate grants ({:?})", b.name));
    }
    match (ipv6, b.ipv6) {
        (Ipv6Overlay::Off, _) => Ok(()),
        (Ipv6Overlay::Given(a, p), Some(g)) if (*a, *p) == g => Ok(()),
        (Ipv6Overlay::Given(a, p), _) => usage(format!(
            "--ipv6 {a}/{p} is not what the certificate grants ({})",
            b.ipv6.map_or_else(|| "no IPv6 address".to_owned(), |(a, p)| format!("{a}/{p}"))
        )),
        (Ipv6Overlay::Derived, _) => usage("with a certificate, the IPv6 address is the one it grants, or none"),
    }
}

/// Refuses offers the certificate does not grant: proxied subnets outside its
/// subnets, an exit without its exit grant, a WireGuard portal without its portal grant.
pub(super) fn offers_within_certificate(
    b: &weft_core::cert::CertBody,
    proxy_networks: &[IpNet],
    exit_node: bool,
    portal: bool,
) -> Result<(), UsageError> {
    for n in proxy_networks {
        let want = weft_core::cert::Prefix { addr: n.addr, len: n.prefix };
        if !b.subnets.iter().any(|g| g.covers(&want)) {
            return usage(format!(
                "--proxy-network {}/{} is not among the subnets the certificate grants ({})",
                n.addr,
                n.prefix,
                if b.subnets.is_empty() {
                    "none".to_owned()
                } else {
                    b.subnets.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                }
            ));
        }
    }
    if exit_node && !b.exit {
        return usage("--exit-node: the certificate does not let this node be an exit (weft authority sign --exit)");
    }
    if portal && !b.portal {
        return usage(
            "--wg-portal: the certificate does not let this node run a WireGuard portal (weft authority sign --portal)",
        );
    }
    Ok(())
}

/// A certificate given as text or as a file holding it.
pub(crate) fn read_cert(arg: &str) -> anyhow::Result<weft_core::cert::Certificate> {
    let text = if arg.trim_start().starts_with(weft_core::cert::CERT_PREFIX) {
        arg.to_owned()
    } else {
        std::fs::read_to_string(arg).map_err(|e| {
            UsageError(format!("{arg:?} is neither a certificate (weft-cert:...) nor a file that can be read: {e}"))
        })?
    };
    weft_core::cert::Certificate::from_text(&text).map_err(|e| UsageError(format!("invalid certificate: {e}")).into())
}
