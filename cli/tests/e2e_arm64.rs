//! End-to-end: an arm64 build of weft (cross-built by `scripts/build-arm64.sh`, whose
//! path `scripts/test.sh` passes in `WEFT_ARM64`) runs under qemu-user
//! (`qemu-aarch64-static`) in one namespace and meshes with this x86-64 build in
//! another: both directions of handshake, ping and a checksummed transfer each way,
//! over UDP and TCP, with the TUN offloads on (qemu-user passes the TUN ioctls and the
//! virtio-net header through) and then with `--no-offload`.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::time::Duration;

use netns::{Lan, Node, TempDir, ping, require_root, transfer, wait_until};

const NET: [&str; 4] = ["--network-name", "e2e-arm64", "--network-secret", "correct horse battery"];
const IPS: [&str; 2] = ["10.126.129.1", "10.126.129.2"];
const QEMU: &str = "qemu-aarch64-static";
/// Where Debian's libc6-arm64-cross keeps the arm64 loader and libraries.
const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// The arm64 binary.
fn arm64() -> String {
    match std::env::var("WEFT_ARM64") {
        Ok(p) if !p.is_empty() => p,
        _ => panic!(
            "WEFT_ARM64 is not set: it names an aarch64 weft (scripts/build-arm64.sh builds it and prints its path; scripts/test.sh sets it)"
        ),
    }
}

fn start(lan: &Lan, dir: &TempDir, i: usize, extra: &[String]) -> Node {
    let mut args: Vec<String> = NET.iter().map(|s| (*s).to_owned()).collect();
    args.extend(["-i".into(), format!("{}/24", IPS[i]), "--threads".into(), "1".into()]);
    args.extend(extra.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let name = format!("n{i}");
    if i == 1 {
        let bin = arm64();
        Node::start_command(&lan.hosts[i], &dir.0, &name, &[QEMU, "-L", SYSROOT, &bin], &refs)
    } else {
        Node::start(&lan.hosts[i], &dir.0, &name, &refs)
    }
}

#[test]
fn the_binary_is_arm64_and_runs_under_qemu() {
    let bin = arm64();
    let head = std::fs::read(&bin).unwrap_or_else(|e| panic!("{bin}: {e}"));
    // ELF, 64-bit, little-endian, e_machine EM_AARCH64 (183).
    assert_eq!(&head[..6], b"\x7fELF\x02\x01", "{bin} is not a 64-bit little-endian ELF");
    assert_eq!(u16::from_le_bytes([head[18], head[19]]), 183, "{bin} is not an aarch64 binary");
    let out = std::process::Command::new(QEMU).args(["-L", SYSROOT, &bin, "version", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
}

#[test]
fn an_arm64_node_under_qemu_meshes_with_an_x86_64_node() {
    require_root();
    let _ = arm64();
    for (scheme, offload) in [("udp", true), ("tcp", true), ("udp", false)] {
        // Both roles: the arm64 node dials, then the x86-64 one does.
        for arm_dials in [true, false] {
            let lan = Lan::new(2);
            let dir = TempDir::new();
            let listen = |i: usize| format!("{scheme}://{}:11010", lan.addrs[i]);
            let (dialler, listener) = if arm_dials { (1, 0) } else { (0, 1) };
            let mut common = Vec::new();
            if !offload {
                common.push("--no-offload".to_owned());
            }
            let mut l_args = common.clone();
            l_args.extend(["--listen".into(), listen(listener)]);
            let l = start(&lan, &dir, listener, &l_args);
            let mut d_args = common;
            d_args.extend(["--listen".into(), listen(dialler), "--peer".into(), listen(listener)]);
            let d = start(&lan, &dir, dialler, &d_args);
            let what = format!("{scheme} offload {offload}, arm64 dials {arm_dials}");
            wait_until(Duration::from_secs(30), &format!("{what}: the pair is up"), || {
                l.peer_established(IPS[dialler]) && d.peer_established(IPS[listener])
            });
            assert!(ping(&lan.hosts[0], IPS[1]), "{what}: ping x86-64 -> arm64");
            assert!(ping(&lan.hosts[1], IPS[0]), "{what}: ping arm64 -> x86-64");
            for (from, to) in [(0, 1), (1, 0)] {
                let (sent, got, took) = transfer(&lan.hosts[from], &lan.hosts[to], IPS[to], 2 << 20);
                assert_eq!(sent, got, "{what}: transfer {from} -> {to} arrived corrupt");
                // Correctness only: the speed is qemu's (bench/RESULTS.md quotes these).
                eprintln!(
                    "{what}: {} -> {}: 2 MiB intact in {took:?}",
                    ["x86-64", "arm64"][from],
                    ["x86-64", "arm64"][to]
                );
            }
            let arm = if arm_dials { &d } else { &l };
            let s = arm.status();
            assert_eq!(s["version"], env!("CARGO_PKG_VERSION"), "{what}: {s}");
        }
    }
}
