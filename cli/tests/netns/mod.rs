//! Test topologies in network namespaces, made and removed by the test.
//!
//! Every namespace is named `wt-<pid>-<n>` and deleted when its guard drops, on every
//! exit path including panics. Links live between namespaces; the root namespace is
//! never a bridge or router and no test traffic leaves the namespaces made here.
#![allow(dead_code, unsafe_code, unreachable_pub, clippy::unwrap_used)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ring::digest;
use serde_json::Value;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Runs a command and panics with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ip ARGS`, checked.
pub fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// Whether e2e tests can run here (root, with `ip netns`).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the end-to-end tests need root (network namespaces, TUN devices)");
}

/// Links two namespaces with a veth pair and addresses.
pub fn link(a: &Netns, a_if: &str, a_addr: &str, b: &Netns, b_if: &str, b_addr: &str) {
    ip(&["link", "add", "name", a_if, "netns", &a.name, "type", "veth", "peer", "name", b_if, "netns", &b.name]);
    a.exec_ok(&["ip", "addr", "add", a_addr, "dev", a_if]);
    b.exec_ok(&["ip", "addr", "add", b_addr, "dev", b_if]);
    a.exec_ok(&["ip", "link", "set", "dev", a_if, "up"]);
    b.exec_ok(&["ip", "link", "set", "dev", b_if, "up"]);
}

/// A network namespace that is deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Self {
        let name = format!("wt-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        ns.exec_ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// A command that runs inside this namespace.
    pub fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, prog]);
        c
    }

    /// Runs a program inside, panicking on failure.
    pub fn exec_ok(&self, argv: &[&str]) -> Output {
        run(self.cmd(argv[0]).args(&argv[1..]))
    }

    /// Runs a program inside and returns whether it succeeded.
    pub fn exec_status(&self, argv: &[&str]) -> bool {
        self.cmd(argv[0])
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs `f` on a thread that has entered this namespace, so that sockets it opens
    /// live here.
    pub fn within<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let fd = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                // SAFETY: fd is a valid namespace file; setns only changes this thread's
                // network namespace, and the thread ends with the scope.
                let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .expect("thread in namespace panicked")
        })
    }
}

impl Netns {
    /// Moves the calling thread into namespace `name` for good and runs `f` there: for
    /// threads of their own (servers a test starts and joins later).
    pub fn enter_named<T>(name: &str, f: impl FnOnce() -> T) -> T {
        let path = format!("/run/netns/{name}");
        let fd = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: fd is a valid namespace file; setns only changes this thread's network
        // namespace, and the caller gives it a thread of its own.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    }
}

impl Drop for Netns {
    /// Ends whatever still runs inside (by PID: a ping or server that a failed
    /// assertion left behind; the namespace is this test's alone, so all of it is the
    /// test's own), then removes the namespace. Nothing outlives the test holding its
    /// output open, which would keep the suite's log pipe from ever closing.
    fn drop(&mut self) {
        for _ in 0..50 {
            let pids = Command::new("ip").args(["netns", "pids", &self.name]).stderr(Stdio::null()).output();
            let pids: Vec<i32> = pids
                .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect())
                .unwrap_or_default();
            if pids.is_empty() {
                break;
            }
            // Never the test itself (a thread of it may have entered the namespace).
            let own = std::process::id() as i32;
            if pids.iter().all(|&p| p == own) {
                break;
            }
            for pid in pids.into_iter().filter(|&p| p != own) {
                // SAFETY: kill has no memory preconditions; the PID runs in this
                // test's own namespace.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

impl Netns {
    /// Starts tcpdump on `iface` writing packets matching `filter` to `pcap` (at most
    /// `count` of them when given) and returns once the capture is armed.
    pub fn capture(&self, iface: &str, filter: &str, pcap: &Path, count: Option<u32>) -> Child {
        let mut args = vec!["-Z", "root", "-i", iface, "-U", "--immediate-mode", "-n", "-s", "0"];
        let count = count.map(|c| c.to_string());
        if let Some(c) = &count {
            args.extend(["-c", c]);
        }
        let mut dump = self
            .cmd("tcpdump")
            .args(args)
            .arg("-w")
            .arg(pcap)
            .arg(filter)
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump");
        // tcpdump says "listening on IFACE" once its capture is armed.
        let mut banner = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(dump.stderr.take().unwrap()), &mut banner).unwrap();
        assert!(banner.contains("listening"), "tcpdump: {banner}");
        dump
    }
}

/// Stops a capture with SIGINT so tcpdump flushes and closes its file.
pub fn stop_capture(mut dump: Child) {
    run(Command::new("kill").args(["-INT", &dump.id().to_string()]));
    let _ = dump.wait();
}

/// A LAN: a bridge inside its own "switch" namespace and hosts hanging off it by veth.
pub struct Lan {
    pub switch: Netns,
    pub hosts: Vec<Netns>,
    pub addrs: Vec<String>,
}

impl Lan {
    /// `n` hosts with underlay addresses 192.0.2.(i+1)/24.
    pub fn new(n: usize) -> Self {
        let switch = Netns::new();
        // Flood multicast (LAN discovery beacons) without waiting for a querier.
        switch.exec_ok(&["ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]);
        switch.exec_ok(&["ip", "link", "set", "br0", "up"]);
        let mut hosts = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..n {
            let h = Netns::new();
            let sw_end = format!("p{i}");
            ip(&[
                "link",
                "add",
                "eth0",
                "netns",
                &h.name,
                "type",
                "veth",
                "peer",
                "name",
                &sw_end,
                "netns",
                &switch.name,
            ]);
            switch.exec_ok(&["ip", "link", "set", &sw_end, "master", "br0"]);
            switch.exec_ok(&["ip", "link", "set", &sw_end, "up"]);
            let addr = format!("192.0.2.{}", i + 1);
            h.exec_ok(&["ip", "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            h.exec_ok(&["ip", "link", "set", "eth0", "up"]);
            hosts.push(h);
            addrs.push(addr);
        }
        Self { switch, hosts, addrs }
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let p = std::env::temp_dir().join(format!(
            "weft-e2e-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `weft` binary under test. Cargo names it for the weft package's own tests; the
/// tests of other packages (weft-gui's) take `WEFT_BIN`, or the `weft` that a workspace
/// build put next to their own test binary (target/debug/deps/.. -> target/debug).
pub fn weft_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = option_env!("CARGO_BIN_EXE_weft") {
            return p.to_owned();
        }
        if let Ok(p) = std::env::var("WEFT_BIN") {
            return p;
        }
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().and_then(Path::parent).map(|d| d.join("weft"));
        match bin {
            Some(b) if b.is_file() => b.to_string_lossy().into_owned(),
            _ => panic!("no weft binary beside {}: run `cargo build -p weft` first or set WEFT_BIN", exe.display()),
        }
    })
}

/// A running `weft up`, killed (by its own PID) on drop.
pub struct Node {
    pub child: Child,
    pub control: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub ns: String,
    args: Vec<String>,
    /// The command that starts it when it is not `weft up` as root.
    launcher: Option<Vec<String>>,
}

impl Node {
    /// Starts `weft up` in `ns` with the given extra arguments. `dir` holds the state
    /// directory, control socket and log of node `name`.
    pub fn start(ns: &Netns, dir: &Path, name: &str, args: &[&str]) -> Self {
        let state = dir.join(format!("{name}-state"));
        let control = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut n = Self {
            child: spawn(&ns.name, &state, &control, &log, &args),
            control,
            state,
            log,
            ns: ns.name.clone(),
            args,
            launcher: None,
        };
        n.wait_for_socket();
        n
    }

    /// Starts `bin up` (another build of weft: the previous release in the
    /// mixed-version tests) in `ns`, like [`Node::start`].
    #[allow(dead_code)]
    pub fn start_binary(ns: &Netns, dir: &Path, name: &str, bin: &str, args: &[&str]) -> Self {
        Self::start_command(ns, dir, name, &[bin], args)
    }

    /// Starts `command… up` in `ns`, like [`Node::start`]: `command` is the program and
    /// the words before `up` (an emulator and the binary it runs, for the arm64 test).
    #[allow(dead_code)]
    pub fn start_command(ns: &Netns, dir: &Path, name: &str, command: &[&str], args: &[&str]) -> Self {
        let state = dir.join(format!("{name}-state"));
        let control = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        let launcher: Vec<String> = command
            .iter()
            .copied()
            .chain(["up", "--state-dir"])
            .map(String::from)
            .chain([state.display().to_string(), "--control".into(), control.display().to_string()])
            .collect();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut n = Self {
            child: spawn_with(&ns.name, &launcher, &log, &args),
            control,
            state,
            log,
            ns: ns.name.clone(),
            args,
            launcher: Some(launcher),
        };
        n.wait_for_socket();
        n
    }

    /// Starts `weft up` in `ns` as `nobody` with every capability dropped, from a copy
    /// of the binary in `dir` (the build tree may not be readable by nobody), with
    /// HOME and XDG_RUNTIME_DIR of its own and no --state-dir or --control: it finds
    /// its defaults ($XDG_RUNTIME_DIR/weft/weft.sock, ~/.local/state/weft).
    pub fn start_unprivileged(ns: &Netns, dir: &Path, name: &str, args: &[&str]) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let home = dir.join(format!("{name}-home"));
        let run_dir = dir.join(format!("{name}-run"));
        for d in [&home, &run_dir] {
            std::fs::create_dir_all(d).unwrap();
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let bin = dir.join("weft-copy");
        if !bin.exists() {
            std::fs::copy(weft_bin(), &bin).unwrap();
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let launcher: Vec<String> = [
            "setpriv",
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "env",
            "-u",
            "XDG_STATE_HOME",
            "-u",
            "WEFT_CONTROL",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([
            format!("HOME={}", home.display()),
            format!("XDG_RUNTIME_DIR={}", run_dir.display()),
            bin.display().to_string(),
            "up".to_owned(),
        ])
        .collect();
        let log = dir.join(format!("{name}.log"));
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut n = Self {
            child: spawn_with(&ns.name, &launcher, &log, &args),
            control: run_dir.join("weft/weft.sock"),
            state: home.join(".local/state/weft"),
            log,
            ns: ns.name.clone(),
            args,
            launcher: Some(launcher),
        };
        n.wait_for_socket();
        n
    }

    /// Stops the node and starts it again with the same arguments and state.
    pub fn restart(&mut self) {
        self.stop();
        self.child = match &self.launcher {
            Some(l) => spawn_with(&self.ns, l, &self.log, &self.args),
            None => spawn(&self.ns, &self.state, &self.control, &self.log, &self.args),
        };
        self.wait_for_socket();
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the node as systemd does (SIGTERM) and waits for it to exit.
    pub fn terminate(&mut self) {
        run(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        // 30 s: an arm64 node under qemu-user takes about 9 s to make its TLS key.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("weft did not stop on SIGTERM: {}", self.log_text());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn wait_for_socket(&mut self) {
        // 30 s: an arm64 node under qemu-user takes about 9 s to make its TLS key.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.try_status().is_some() {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("weft exited early ({st}): {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("weft control socket never came up: {}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `weft status --json`, or None while the socket is not up.
    pub fn try_status(&self) -> Option<Value> {
        let out = Command::new(weft_bin()).args(["status", "--json", "--control"]).arg(&self.control).output().ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    pub fn status(&self) -> Value {
        self.try_status().unwrap_or_else(|| panic!("no status: {}", self.log_text()))
    }

    /// The status entry of the peer with overlay address `addr`.
    pub fn peer(&self, addr: &str) -> Option<Value> {
        self.status()["peers"].as_array()?.iter().find(|p| p["overlay"] == addr).cloned()
    }

    pub fn peer_established(&self, addr: &str) -> bool {
        self.peer(addr).is_some_and(|p| p["state"] == "established")
    }

    /// Whether the node has a route to the member at `addr` (a session is made when
    /// traffic wants one).
    pub fn routes_to(&self, addr: &str) -> bool {
        self.status()["routes"].as_array().is_some_and(|r| r.iter().any(|r| r["overlay"] == addr))
    }
}

fn spawn(ns: &str, state: &Path, control: &Path, log: &Path, args: &[String]) -> Child {
    let launcher = [weft_bin(), "up", "--state-dir"]
        .map(String::from)
        .into_iter()
        .chain([state.display().to_string(), "--control".into(), control.display().to_string()])
        .collect::<Vec<_>>();
    spawn_with(ns, &launcher, log, args)
}

fn spawn_with(ns: &str, launcher: &[String], log: &Path, args: &[String]) -> Child {
    let log_file = File::options().create(true).append(true).open(log).unwrap();
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(launcher)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("spawn weft")
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `cond` every 100 ms until it holds or `limit` passes; returns the time taken.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

/// Whether this kernel's TUN reads without waiting when asked (`RWF_NOWAIT`, Linux
/// 6.4 and later): only then do receive threads send the kernel's answers
/// (`tx_answers`).
pub fn tun_reads_without_waiting() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 4)
}

/// Whether a ping from `ns` to `addr` gets an answer (two tries, a second each).
pub fn ping(ns: &Netns, addr: &str) -> bool {
    ns.exec_status(&["ping", "-c", "2", "-i", "0.3", "-W", "1", addr])
}

/// The round-trip times of `count` pings from `ns` to `addr`, 50 ms apart (a reply
/// has 5 s: this counts answers, it does not time them).
pub fn ping_times(ns: &Netns, addr: &str, count: u32) -> Vec<f64> {
    let out = ns.cmd("ping").args(["-c", &count.to_string(), "-i", "0.05", "-W", "5", addr]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("time=").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// Sends `len` pseudo-random bytes over TCP from `from` to `to_ip` inside `to`, on a
/// port the receiver's kernel picks (a fixed port made back-to-back transfers to one
/// host fail with EADDRINUSE now and then); returns the SHA-256 of what was sent and of
/// what arrived.
pub fn transfer(from: &Netns, to: &Netns, to_ip: &str, len: usize) -> (Vec<u8>, Vec<u8>, Duration) {
    // An IPv6 address goes in brackets.
    let addr = if to_ip.contains(':') { format!("[{to_ip}]:0") } else { format!("{to_ip}:0") };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            to.within(|| {
                let l = TcpListener::bind(&addr).expect("bind receiver");
                ready_tx.send(l.local_addr().expect("receiver address")).unwrap();
                let (mut c, _) = l.accept().unwrap();
                c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let mut ctx = digest::Context::new(&digest::SHA256);
                let mut buf = vec![0u8; 1 << 16];
                let mut total = 0;
                loop {
                    let n = c.read(&mut buf).expect("receive");
                    if n == 0 {
                        break;
                    }
                    total += n;
                    ctx.update(&buf[..n]);
                }
                assert_eq!(total, len, "received byte count");
                ctx.finish().as_ref().to_vec()
            })
        });
        let addr = ready_rx.recv_timeout(Duration::from_secs(10)).expect("receiver ready");
        let sent = from.within(|| {
            let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
            c.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut ctx = digest::Context::new(&digest::SHA256);
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut buf = vec![0u8; 1 << 16];
            let start = Instant::now();
            let mut left = len;
            while left > 0 {
                for chunk in buf.chunks_mut(8) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
                }
                let n = left.min(buf.len());
                c.write_all(&buf[..n]).expect("send");
                ctx.update(&buf[..n]);
                left -= n;
            }
            c.shutdown(std::net::Shutdown::Write).unwrap();
            (ctx.finish().as_ref().to_vec(), start)
        });
        let got = rx.join().expect("receiver thread");
        (sent.0, got, sent.1.elapsed())
    })
}

/// Runs `weft ARGS` (not a node) and returns its standard output, trimmed; panics with
/// its standard error when it fails.
#[allow(dead_code)]
pub fn weft(args: &[&str]) -> String {
    let out = Command::new(weft_bin()).args(args).output().unwrap();
    assert!(out.status.success(), "weft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs `weft ARGS`: whether it succeeded, and its standard output and error together.
#[allow(dead_code)]
pub fn weft_out(args: &[&str]) -> (bool, String) {
    let out = Command::new(weft_bin()).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Writes a file only its owner reads (weft refuses secrets in open files).
#[allow(dead_code)]
pub fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}
