//! End-to-end: the real `weft-gui` window under Xvfb against a real node in a network
//! namespace while traffic flows through the tunnel, saved as a screenshot.
//!
//! Three nodes (alpha, bravo, charlie) on a LAN in namespaces this test makes and
//! removes; bravo sends alpha a rate-limited iperf3 stream and charlie floods pings at
//! it, both through the tunnel; weft-gui talks to alpha's control socket
//! (a Unix socket path, reachable from the root namespace without any network) and
//! draws on a private Xvfb display. The test checks that the window ran, saved a
//! 1280×800 picture with content, and exited; set WEFT_GUI_SCREENSHOT=PATH to keep the
//! picture (docs/gui.png is made that way). Skips when not root.
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

#[path = "../../cli/tests/netns/mod.rs"]
mod netns;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netns::{Lan, Netns, TempDir, wait_until, weft_bin};

/// A process this test started, killed by its own PID on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `weft up` in `ns` with host name `host` (its own UTS namespace, so the peers
/// table shows distinct names).
fn start_node(ns: &Netns, dir: &Path, host: &str, overlay: &str, extra: &[&str]) -> Proc {
    let log = std::fs::File::create(dir.join(format!("{host}.log"))).unwrap();
    let child = ns
        .cmd("unshare")
        .args(["--uts", "sh", "-c", r#"hostname "$0" && exec "$@""#, host, weft_bin(), "up"])
        .args(["--network-name", "gui-e2e", "--network-secret", "correct horse", "--threads", "2"])
        .args(["-i", overlay])
        .arg("--state-dir")
        .arg(dir.join(format!("{host}-state")))
        .arg("--control")
        .arg(dir.join(format!("{host}.sock")))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn weft");
    Proc(child)
}

fn established(control: &Path, overlay: &str) -> bool {
    let Ok(out) = Command::new(weft_bin()).args(["status", "--json", "--control"]).arg(control).output() else {
        return false;
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else { return false };
    v["peers"].as_array().is_some_and(|ps| ps.iter().any(|p| p["overlay"] == overlay && p["state"] == "established"))
}

/// Starts Xvfb on a display number nobody uses, listening on its Unix socket only.
fn xvfb() -> (Proc, String) {
    for n in 0..50 {
        let display = 140 + (std::process::id() as usize + n) % 800;
        if Path::new(&format!("/tmp/.X11-unix/X{display}")).exists()
            || Path::new(&format!("/tmp/.X{display}-lock")).exists()
        {
            continue;
        }
        let child = Command::new("Xvfb")
            .args([&format!(":{display}"), "-screen", "0", "1280x800x24", "-nolisten", "tcp"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb is not installed (apt-get install xvfb; .ci/run installs it)");
        let mut x = Proc(child);
        let sock = format!("/tmp/.X11-unix/X{display}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if Path::new(&sock).exists() {
                return (x, format!(":{display}"));
            }
            if let Ok(Some(_)) = x.0.try_wait() {
                break; // lost a race for this display; try the next
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("could not start Xvfb on any display");
}

#[test]
fn the_window_shows_a_live_mesh_under_xvfb() {
    if !is_root() {
        eprintln!("skipped: the GUI end-to-end test needs root (network namespaces, TUN devices)");
        return;
    }
    let lan = Lan::new(3);
    let dir = TempDir::new();
    let _alpha = start_node(&lan.hosts[0], &dir.0, "alpha", "10.126.126.1/24", &[]);
    let peer = format!("udp://{}:11010", lan.addrs[0]);
    let _bravo = start_node(&lan.hosts[1], &dir.0, "bravo", "10.126.126.2/24", &["-p", &peer]);
    let _charlie = start_node(&lan.hosts[2], &dir.0, "charlie", "10.126.126.3/24", &["-p", &peer]);
    let control = dir.0.join("alpha.sock");
    wait_until(Duration::from_secs(15), "alpha sees bravo and charlie established", || {
        established(&control, "10.126.126.2") && established(&control, "10.126.126.3")
    });

    // Traffic through the tunnel, inside the namespaces only, each bounded in time.
    let _server = Proc(
        lan.hosts[0]
            .cmd("iperf3")
            .args(["-s", "-1", "-B", "10.126.126.1"])
            .stdout(Stdio::null())
            .spawn()
            .expect("iperf3"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let _stream = Proc(
        lan.hosts[1]
            .cmd("iperf3")
            .args(["-c", "10.126.126.1", "-t", "40", "-b", "120M"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("iperf3"),
    );
    let _flood = Proc(
        lan.hosts[2]
            .cmd("ping")
            .args(["-q", "-f", "-s", "1000", "-w", "40", "10.126.126.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping"),
    );

    let (_x, display) = xvfb();
    let png = dir.0.join("gui.png");
    let gui = Command::new(env!("CARGO_BIN_EXE_weft-gui"))
        .arg("--control")
        .arg(&control)
        .arg("--screenshot")
        .arg(&png)
        .args(["--screenshot-after", "20"])
        .env("DISPLAY", &display)
        .env_remove("WAYLAND_DISPLAY")
        .env("LIBGL_ALWAYS_SOFTWARE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weft-gui");
    let mut gui = Proc(gui);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = gui.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "weft-gui did not save its screenshot and exit within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(gui.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "weft-gui failed ({status}): {err}");

    // What the window drew, as it reports it on exit in screenshot mode.
    let mut out = String::new();
    std::io::Read::read_to_string(gui.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(out.contains("bravo 10.126.126.2 up direct"), "the window showed bravo up: {out}");
    assert!(out.contains("charlie 10.126.126.3 up direct"), "the window showed charlie up: {out}");
    let points: usize = field(&out, "plot points").parse().unwrap();
    assert!(points >= 10, "the plot had points for most of the 20 s: {out}");
    let rx: f64 = field(&out, "total rx B/s").parse().unwrap();
    assert!(rx > 10_000.0, "the flood shows as throughput: {out}");
    // The mesh map drew this node and both peers, each on a direct path.
    assert_eq!(field(&out, "map"), "Mesh map: 3 members, 2 direct paths, 0 relayed, 0 down", "{out}");

    let img = image::open(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display())).to_rgba8();
    assert_eq!((img.width(), img.height()), (1280, 800), "the window fills the 1280×800 screen at scale 1");
    let colours: std::collections::HashSet<[u8; 4]> = img.pixels().map(|p| p.0).collect();
    assert!(colours.len() > 50, "the picture has content ({} colours)", colours.len());
    if let Some(keep) = std::env::var_os("WEFT_GUI_SCREENSHOT") {
        std::fs::copy(&png, &keep).unwrap_or_else(|e| panic!("copy to {}: {e}", Path::new(&keep).display()));
    }
}

/// The value after `name: ` up to the next `;` or line end.
fn field<'a>(text: &'a str, name: &str) -> &'a str {
    let start = text.find(&format!("{name}: ")).unwrap_or_else(|| panic!("no {name} in {text}")) + name.len() + 2;
    text[start..].split([';', '\n']).next().unwrap().trim()
}
