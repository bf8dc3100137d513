//! Bad input: each mistake exits non-zero with a one-line message naming the value.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::process::{Command, Output};

use netns::{TempDir, require_root, weft_bin};

fn weft(args: &[&str]) -> Output {
    Command::new(weft_bin()).args(args).env_remove("WEFT_NETWORK_SECRET").output().expect("run weft")
}

fn up(extra: &[&str]) -> Output {
    let mut a = vec!["up", "--network-name", "t", "--network-secret", "s", "-i", "10.126.126.9/24"];
    a.extend(extra);
    weft(&a)
}

fn assert_fails(out: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "exit status for {needle:?}; stderr: {err}");
    assert!(err.contains(needle), "stderr should name {needle:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn malformed_values_exit_2_naming_the_value() {
    assert_fails(&up(&["-p", "udp//10.0.0.1:11010"]), 2, "udp//10.0.0.1:11010");
    assert_fails(&up(&["-p", "udp://10.0.0.1"]), 2, "udp://10.0.0.1");
    assert_fails(&up(&["-p", "tcp://10.0.0.1:11010/join"]), 2, "only ws:// and wss:// URIs take a path");
    assert_fails(&up(&["-p", "sctp://10.0.0.1:11010"]), 2, "unknown scheme");
    assert_fails(&up(&["-l", "tcp://0.0.0.0:1", "-l", "tcp://0.0.0.0:2"]), 2, "one listener per transport");
    assert_fails(&up(&["--tls-cert", "/nonexistent.pem"]), 2, "--tls-key");
    assert_fails(&up(&["--max-connections", "0"]), 2, "--max-connections 0");
    assert_fails(&up(&["-l", "udp://0.0.0.0:99999"]), 2, "udp://0.0.0.0:99999");
    assert_fails(&up(&["--cipher", "xor"]), 2, "xor");
    assert_fails(&up(&["--mtu", "100"]), 2, "100");
    assert_fails(&up(&["--threads", "0"]), 2, "--threads 0");
    // A rekey interval the key lifetime (180 s) cannot honour, or one that overflows.
    assert_fails(&up(&["--rekey-after", "170"]), 2, "--rekey-after 170");
    assert_fails(&up(&["--rekey-after", "18446744073709551615"]), 2, "--rekey-after 18446744073709551615");
    assert_fails(
        &weft(&["up", "--network-name", "t", "--network-secret", "s", "-i", "10.126.126.300/24"]),
        2,
        "10.126.126.300/24",
    );
    assert_fails(&weft(&["up", "--network-name", "t", "--network-secret", "s", "-i", "10.1.1.1"]), 2, "10.1.1.1");
    assert_fails(&weft(&["up", "--network-name", "t", "-i", "10.1.1.1/24"]), 2, "network secret");
    assert_fails(&weft(&["up", "--bogus-flag"]), 2, "--bogus-flag");
    assert_fails(&up(&["--log-format", "xml"]), 2, "invalid log format \"xml\"");
    assert_fails(&up(&["--metrics", "localhost"]), 2, "invalid --metrics \"localhost\"");
    assert_fails(&up(&["--log-level", "weft=loud"]), 2, "weft=loud");
    // WireGuard portal options.
    let net = ["--wg-portal-net", "10.127.0.0/24"];
    assert_fails(&up(&[&["--wg-portal", "tcp://0.0.0.0:51820"][..], &net].concat()), 2, "UDP only");
    assert_fails(&up(&["--wg-portal", "udp://0.0.0.0:51820"]), 2, "--wg-portal-net");
    assert_fails(&up(&["--wg-portal-net", "10.127.0.0/24"]), 2, "need --wg-portal");
    let portal = ["--wg-portal", "udp://0.0.0.0:51820", "--wg-portal-net"];
    assert_fails(&up(&[&portal[..], &["10.127.0.0/33"]].concat()), 2, "10.127.0.0/33");
    assert_fails(
        &up(&["--wg-portal", "udp://127.0.0.1:11010", "--wg-portal-net", "10.127.0.0/24"]),
        2,
        "would share the port of the listener udp://",
    );
    assert_fails(&up(&[&portal[..], &["10.126.0.0/16"]].concat()), 2, "overlaps the overlay network");
    assert_fails(
        &up(&[&portal[..], &["192.168.9.0/24", "--proxy-network", "192.168.0.0/16"]].concat()),
        2,
        "overlaps --proxy-network 192.168.0.0/16",
    );
    // IPv6 overlay and subnets.
    assert_fails(&up(&["--ipv6", "fd7a::1"]), 2, "invalid --ipv6 \"fd7a::1\": no prefix length");
    assert_fails(&up(&["--ipv6", "fd7a::1/129"]), 2, "prefix length outside 8 to 128");
    assert_fails(&up(&["--ipv6", "fd7a::zz/64"]), 2, "not an IPv6 address");
    assert_fails(&up(&["--ipv6", "fe80::1/64"]), 2, "link-local");
    assert_fails(&up(&["--ipv6", "ff02::1/64"]), 2, "not a unicast address");
    assert_fails(&up(&["--ipv6", "::ffff:10.0.0.1/120"]), 2, "IPv4-mapped");
    assert_fails(&up(&["--ipv6", "fd7a::1/64", "--no-ipv6"]), 2, "--no-ipv6");
    assert_fails(
        &up(&["--ipv6", "fd7a::1/64", "--proxy-network", "fd7a::/48"]),
        2,
        "overlaps the overlay network fd7a::/64",
    );
    assert_fails(
        &up(&["--proxy-network", "fd77::/64", "--proxy-network", "fd77::/48"]),
        2,
        "overlaps --proxy-network fd77::/64",
    );
    assert_fails(&up(&["--proxy-network", "fd77::/129"]), 2, "invalid --proxy-network \"fd77::/129\"");
    assert_fails(&up(&["--proxy-network", "::/0"]), 2, "--exit-node");
    assert_fails(&up(&["--proxy-network", "ff05::/16"]), 2, "multicast");
}

#[test]
fn config_file_errors_exit_2() {
    let dir = TempDir::new();
    let cfg = dir.0.join("weft.toml");
    std::fs::write(&cfg, "network-name = \"t\"\nnetwork-secret = \"s\"\nipv4 = \"10.1.1.1/24\"\nlisten-port = 5\n")
        .unwrap();
    assert_fails(&weft(&["up", "--config", cfg.to_str().unwrap()]), 2, "listen-port");
    std::fs::write(&cfg, "network-name = \"t\"\nnetwork-secret = \"s\"\nipv4 = \"nope\"\n").unwrap();
    // A file holding the secret that others can read is refused first, with the fix.
    let fix = format!("chmod 600 {}", cfg.display());
    assert_fails(&weft(&["up", "--config", cfg.to_str().unwrap()]), 2, &fix);
    std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    assert_fails(&weft(&["up", "--config", cfg.to_str().unwrap()]), 2, "nope");
    assert_fails(&weft(&["up", "--config", "/nonexistent/weft.toml"]), 2, "/nonexistent/weft.toml");
}

#[test]
fn status_without_a_node_says_so() {
    let dir = TempDir::new();
    let sock = dir.0.join("none.sock");
    assert_fails(&weft(&["status", "--control", sock.to_str().unwrap()]), 1, "is `weft up` running?");
}

#[test]
fn missing_privileges_is_a_clear_error() {
    require_root();
    let dir = TempDir::new();
    // Drop to nobody: no CAP_NET_ADMIN, so the TUN device cannot be created.
    let state = dir.0.join("state");
    std::fs::create_dir_all(&state).unwrap();
    run_ok(Command::new("chown").args(["nobody", state.to_str().unwrap(), dir.0.to_str().unwrap()]));
    let out = Command::new("setpriv")
        .args(["--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--inh-caps=-all", weft_bin()])
        .args(["up", "--network-name", "t", "--network-secret", "s", "-i", "10.126.126.9/24", "--dev-name", "wtperm0"])
        .args(["--state-dir", state.to_str().unwrap(), "--control", dir.0.join("c.sock").to_str().unwrap()])
        .output()
        .expect("setpriv");
    assert_fails(&out, 1, "CAP_NET_ADMIN");
}

#[test]
fn missing_tun_device_is_a_clear_error() {
    require_root();
    let dir = TempDir::new();
    // A private mount namespace with an empty /dev/net: the host's device stays put.
    let script = format!(
        "mount -t tmpfs none /dev/net && exec {} up --network-name t --network-secret s -i 10.126.126.9/24 --dev-name wtnotun0 --state-dir {}/s --control {}/c.sock",
        weft_bin(),
        dir.0.display(),
        dir.0.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    assert_fails(&out, 1, "/dev/net/tun");
}

fn run_ok(c: &mut Command) {
    assert!(c.status().expect("run").success(), "{c:?}");
}

/// `weft policy check` runs the README's example, which has no `[hosts]`: its tests
/// go by name; a test that fails by name and a bad `id:` selector are named.
#[test]
fn policy_check_runs_tests_by_name_and_names_bad_selectors() {
    let dir = TempDir::new();
    let example = "[groups]\nadmins = [\"alice\", \"10.126.126.0/28\"]\nservers = [\"db\", \"web\"]\n\n\
                   [[allow]]\nfrom = [\"group:admins\"]\nto = [\"group:servers\"]\nproto = \"tcp\"\nports = [\"22\", \"8000-8099\"]\n\n\
                   [[allow]]\nfrom = [\"*\"]\nto = [\"web\"]\nproto = \"tcp\"\nports = [\"443\"]\n\n\
                   [[test]]\nfrom = \"alice\"\nto = \"db:22\"\nallow = true\n\n\
                   [[test]]\nfrom = \"web\"\nto = \"db:5432\"\nallow = false\n";
    let path = dir.0.join("policy.toml");
    std::fs::write(&path, example).unwrap();
    let out = weft(&["policy", "check", path.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("2 rule(s), 2 test(s) passed"), "{said}");
    std::fs::write(&path, format!("{example}\n[[test]]\nfrom = \"web\"\nto = \"db:22\"\nallow = true\n")).unwrap();
    assert_fails(&weft(&["policy", "check", path.to_str().unwrap()]), 2, "test 3 fails: web -> db:22 is denied");
    std::fs::write(&path, "[[allow]]\nfrom = [\"id:12ab\"]\nto = [\"*\"]\n").unwrap();
    assert_fails(&weft(&["policy", "check", path.to_str().unwrap()]), 2, "\"id:12ab\" is not");
}
