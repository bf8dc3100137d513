//! Unit tests for turning flags and the config file into a `NodeConfig`.

use super::*;
use crate::config::values::*;

fn args() -> UpArgs {
    UpArgs {
        network_name: Some("office".into()),
        network_secret: Some("s3cret".into()),
        ipv4: Some("10.126.126.2/24".into()),
        ..UpArgs::default()
    }
}

/// A config file in a directory of its own (`tag` keeps tests running at once
/// apart), private (0600) as one holding a secret must be; removed on drop.
struct ConfigFile {
    dir: PathBuf,
    path: PathBuf,
}

impl ConfigFile {
    fn new(tag: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("weft-cfg-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = Self { path: dir.join("weft.toml"), dir };
        f.write(text);
        std::fs::set_permissions(&f.path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        f
    }

    /// Replaces its text (its mode stays).
    fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }

    /// [`args`] with this file.
    fn args(&self) -> UpArgs {
        UpArgs { config: Some(self.path.clone()), ..args() }
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn defaults() {
    let c = NodeConfig::resolve(&args()).unwrap();
    let listeners: Vec<String> = c.listeners.iter().map(ToString::to_string).collect();
    assert_eq!(listeners, default_listeners());
    assert!(listeners[0] == "udp://[::]:11010" || listeners[0] == "udp://0.0.0.0:11010", "{listeners:?}");
    assert_eq!(c.cipher, Cipher::Aes128Gcm);
    assert_eq!(c.dev_name, "weft0");
    assert_eq!(c.mtu, 1420);
    assert_eq!(c.ipv4, Ipv4Net { addr: [10, 126, 126, 2].into(), prefix: 24 });
    assert_eq!(c.offload, OffloadWanted { tun: true, udp_gso: true, udp_gro: true });
    assert!(!c.pin);
}

#[test]
fn bad_values_name_themselves() {
    for (field, value, needle) in [
        ("ipv4", "10.0.0.300/24", "10.0.0.300/24"),
        ("ipv4", "10.0.0.1", "10.0.0.1"),
        ("ipv4", "10.0.0.1/33", "10.0.0.1/33"),
        ("peer", "udp://1.2.3.4", "missing :PORT"),
        ("peer", "tcp://1.2.3.4:1/x", "only ws:// and wss://"),
        ("peer", "ws://1.2.3.4/x", "missing :PORT"),
        ("listen", "udp://0.0.0.0:1", "one listener per transport"),
        ("peer", "gopher://x:1", "gopher"),
        ("peer", "1.2.3.4:11010", "1.2.3.4:11010"),
        ("cipher", "xor", "xor"),
        ("proxy", "192.168.1.0", "192.168.1.0"),
        ("proxy", "192.168.1.0/40", "192.168.1.0/40"),
        ("proxy", "0.0.0.0/0", "every destination"),
    ] {
        let mut a = args();
        match field {
            "ipv4" => a.ipv4 = Some(value.into()),
            "peer" => a.peer = vec![value.into()],
            "listen" => a.listen = vec!["udp://0.0.0.0:2".into(), value.into()],
            "proxy" => a.proxy_network = vec![value.into()],
            _ => a.cipher = Some(value.into()),
        }
        let e = NodeConfig::resolve(&a).unwrap_err().to_string();
        assert!(e.contains(needle), "{field}={value}: {e}");
    }
}

#[test]
fn wide_subnets_are_refused_unless_opted_in() {
    assert!(!NodeConfig::resolve(&args()).unwrap().accept_wide_subnets);
    let a = UpArgs { accept_wide_subnets: true, ..args() };
    assert!(NodeConfig::resolve(&a).unwrap().accept_wide_subnets);
    let f = ConfigFile::new(
        "wide",
        "network-name = \"lab\"\nnetwork-secret = \"x\"\nipv4 = \"10.1.1.1/16\"\naccept-wide-subnets = true\n",
    );
    let a = UpArgs { config: Some(f.path.clone()), ..UpArgs::default() };
    assert!(NodeConfig::resolve(&a).unwrap().accept_wide_subnets);
}

#[test]
fn file_values_apply_and_flags_win() {
    let f = ConfigFile::new(
        "file",
        "network-name = \"lab\"\nnetwork-secret = \"x\"\nipv4 = \"10.1.1.1/16\"\nmtu = 1380\npeer = [\"udp://127.0.0.1:5\"]\n",
    );
    let a = UpArgs { config: Some(f.path.clone()), mtu: Some(1400), ..UpArgs::default() };
    let c = NodeConfig::resolve(&a).unwrap();
    assert_eq!(c.network_name, "lab");
    assert_eq!(c.mtu, 1400);
    assert_eq!(c.peers.len(), 1);
    f.write("network-name = \"lab\"\nbogus-key = 1\n");
    let e = NodeConfig::resolve(&a).unwrap_err().to_string();
    assert!(e.contains("bogus-key"), "{e}");
}

#[test]
fn every_transport_parses() {
    for (uri, shown, path) in [
        ("udp://127.0.0.1:1", "udp://127.0.0.1:1", "/"),
        ("tcp://127.0.0.1:2", "tcp://127.0.0.1:2", "/"),
        ("quic://127.0.0.1:3", "quic://127.0.0.1:3", "/"),
        ("ws://127.0.0.1:4", "ws://127.0.0.1:4/", "/"),
        ("wss://127.0.0.1:5/mesh/join", "wss://127.0.0.1:5/mesh/join", "/mesh/join"),
        ("ws://[::1]:6/x", "ws://[::1]:6/x", "/x"),
    ] {
        let u: PeerUri = uri.parse().unwrap();
        assert_eq!(u.to_string(), shown);
        assert_eq!(u.path, path);
        assert_eq!(u.resolve().unwrap().proto, u.proto);
    }
    let mut a = args();
    a.tls_cert = Some("/x.pem".into());
    let e = NodeConfig::resolve(&a).unwrap_err().to_string();
    assert!(e.contains("--tls-key"), "{e}");
    a.tls_key = Some("/k.pem".into());
    a.listen = vec!["tcp://0.0.0.0:11010".into()];
    let e = NodeConfig::resolve(&a).unwrap_err().to_string();
    assert!(e.contains("none is configured"), "{e}");
}

#[test]
fn log_settings_parse_or_name_the_value() {
    assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
    assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
    let e = "xml".parse::<LogFormat>().unwrap_err().to_string();
    assert!(e.contains("\"xml\"") && e.contains("text or json"), "{e}");
    assert!(log_filter("weft=debug,warn").is_ok());
    let e = log_filter("weft=loud").unwrap_err().to_string();
    assert!(e.contains("weft=loud"), "{e}");
    let f = ConfigFile::new("log", "log-level = \"debug\"\nlog-format = \"json\"\n");
    let c = NodeConfig::resolve(&f.args()).unwrap();
    assert_eq!((c.log_level.as_deref(), c.log_format.as_deref()), (Some("debug"), Some("json")));
}

#[test]
fn magic_dns_settings_come_from_flags_and_file() {
    let c = NodeConfig::resolve(&args()).unwrap();
    assert_eq!((c.dns_domain.as_deref(), c.accept_dns), (Some("office.internal"), false));
    let c = NodeConfig::resolve(&UpArgs { no_magic_dns: true, ..args() }).unwrap();
    assert_eq!(c.dns_domain, None);
    for a in [
        UpArgs { no_magic_dns: true, accept_dns: true, ..args() },
        UpArgs { no_magic_dns: true, dns_domain: Some("x.y".into()), ..args() },
    ] {
        let e = NodeConfig::resolve(&a).unwrap_err().to_string();
        assert!(e.contains("needs Magic DNS"), "{e}");
    }
    let e = NodeConfig::resolve(&UpArgs { dns_domain: Some("a..b".into()), ..args() }).unwrap_err().to_string();
    assert!(e.contains("--dns-domain") && e.contains("a..b"), "{e}");
    let f = ConfigFile::new("dns", "dns-domain = \"Mesh.Example\"\naccept-dns = true\n");
    let c = NodeConfig::resolve(&f.args()).unwrap();
    assert_eq!((c.dns_domain.as_deref(), c.accept_dns), (Some("mesh.example"), true));
    f.write("magic-dns = false\n");
    let c = NodeConfig::resolve(&f.args()).unwrap();
    assert_eq!(c.dns_domain, None);
    // --exit-fallback on the command line, the exit it falls back from in the file.
    f.write("use-exit-node = \"gw\"\n");
    let c = NodeConfig::resolve(&UpArgs { exit_fallback: true, ..f.args() }).unwrap();
    assert_eq!((c.use_exit.as_deref(), c.exit_fallback), (Some("gw"), true));
}

#[test]
fn no_tun_settings_come_from_flags_and_file() {
    let f = ConfigFile::new(
        "notun",
        "no-tun = true\nsocks5 = \"127.0.0.1:1080\"\nsocks5-auth = \"u:p\"\nthreads = 4\n\
         forward = [\"tcp://6000=alpha.office.internal:80\", \"udp://[::1]:5353=[fd00::1]:53\"]\n\
         expose = [\"udp://53=127.0.0.1:5353\"]\n",
    );
    let c = NodeConfig::resolve(&f.args()).unwrap();
    assert!(c.no_tun);
    assert_eq!(c.threads, 1, "one pipeline feeds the userspace stack");
    assert_eq!(c.socks5, Some("127.0.0.1:1080".parse().unwrap()));
    assert_eq!(c.socks5_auth.as_ref().map(|(u, p)| (u.as_str(), p.0.as_str())), Some(("u", "p")));
    assert_eq!(
        c.forwards,
        [
            Forward {
                proto: L4::Tcp,
                local: "127.0.0.1:6000".parse().unwrap(),
                host: "alpha.office.internal".into(),
                port: 80
            },
            Forward { proto: L4::Udp, local: "[::1]:5353".parse().unwrap(), host: "fd00::1".into(), port: 53 },
        ]
    );
    assert_eq!(c.forwards[1].to_string(), "udp://[::1]:5353=[fd00::1]:53");
    assert_eq!(c.exposes, [Expose { proto: L4::Udp, port: 53, local: "127.0.0.1:5353".parse().unwrap() }]);
    assert_eq!(c.exposes[0].to_string(), "udp://53=127.0.0.1:5353");
}

#[test]
fn port_mapping_is_on_unless_a_flag_or_the_file_turns_it_off() {
    assert!(NodeConfig::resolve(&args()).unwrap().port_mapping);
    assert!(!NodeConfig::resolve(&UpArgs { no_port_mapping: true, ..args() }).unwrap().port_mapping);
    let f = ConfigFile::new("portmap", "no-port-mapping = true\n");
    assert!(!NodeConfig::resolve(&f.args()).unwrap().port_mapping);
    f.write("no-port-mapping = false\n");
    assert!(NodeConfig::resolve(&f.args()).unwrap().port_mapping);
}

#[test]
fn secret_is_redacted() {
    let c = NodeConfig::resolve(&args()).unwrap();
    assert!(!format!("{c:?}").contains("s3cret"));
    assert!(!format!("{:?}", args()).contains("s3cret"));
    // The whole parsed command line, flag or environment.
    use clap::Parser;
    let cli = args::Cli::try_parse_from(["weft", "up", "--network-secret", "s3cret-flag"]).unwrap();
    assert!(!format!("{cli:?}").contains("s3cret-flag"), "{cli:?}");
    // The parsed file.
    let file = ConfigFile::new("dbg", "network-secret = \"s3cret-file\"\n");
    let f = FileConfig::load(&file.path).unwrap();
    assert!(!format!("{f:?}").contains("s3cret-file"), "{f:?}");
}

#[test]
fn config_with_secret_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let f = ConfigFile::new("mode", "network-name = \"lab\"\nnetwork-secret = \"x\"\nipv4 = \"10.1.1.1/16\"\n");
    let path = &f.path;
    let a = UpArgs { config: Some(path.clone()), ..UpArgs::default() };
    for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = NodeConfig::resolve(&a).unwrap_err().to_string();
        assert!(e.contains(&format!("chmod 600 {}", path.display())), "{mode:o}: {e}");
        assert!(e.contains(&format!("{mode:03o}")), "{mode:o}: {e}");
    }
    for mode in [0o600, 0o400] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        assert!(NodeConfig::resolve(&a).is_ok(), "{mode:o}");
    }
    // Without a secret in it the file may be public.
    f.write("network-name = \"lab\"\nipv4 = \"10.1.1.1/16\"\n");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let a = UpArgs { network_secret: Some("y".into()), ..a };
    assert!(NodeConfig::resolve(&a).is_ok());
}
