//! End-to-end: the web console in a real headless Chromium (Debian's `chromium`,
//! driven through `chromedriver` by WebDriver) against a live three-member mesh with
//! an authority. The console, chromedriver and the browser run in a namespace of their
//! own with only loopback, so the browser reaches nothing but the console; the console
//! reaches the node through its control socket (a file). In the page: the members
//! page lists all three with the paths the node reports; an invite made in the page
//! lets a fourth machine join; a policy edited and pushed in the page is in force on
//! another member (a flow it forbids is refused there); a member revoked in the page
//! is cut off by every node. With WEFT_WEB_SCREENSHOTS=DIR, each page's screenshot is
//! written there (docs/images for docs/web-console.md).
#![allow(unsafe_code, unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use netns::{Lan, Netns, Node, TempDir, ping, require_root, wait_until, weft};

const NET: [&str; 4] = ["--network-name", "e2e-web", "--network-secret", "web console secret"];
const IPS: [&str; 3] = ["10.126.150.1", "10.126.150.2", "10.126.150.3"];
const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

/// A process this test started, killed by its own PID (and its process group: the
/// browser chromedriver starts) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_group(cmd: &mut Command) -> Proc {
    use std::os::unix::process::CommandExt;
    Proc(cmd.process_group(0).spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}")))
}

fn node_id(dir: &TempDir, name: &str) -> String {
    weft(&["id", "--state-dir", dir.0.join(format!("{name}-state")).to_str().unwrap()])
}

fn start_members(lan: &Lan, dir: &TempDir, key: &str, authority: &str) -> Vec<Node> {
    let listen = |i: usize| format!("udp://{}:11010", lan.addrs[i]);
    (0..3)
        .map(|i| {
            let id = node_id(dir, &format!("n{i}"));
            let ip = format!("{}/24", IPS[i]);
            let mut sign = vec!["authority", "sign", "--key", key, "--node-id", &id, "--name", NAMES[i]];
            sign.extend(["--ipv4", &ip, "--network-name", "e2e-web", "--expires", "20d", "--groups", "dev"]);
            if i == 0 {
                sign.push("--issuer");
            }
            let cert = weft(&sign);
            let mut args = NET.to_vec();
            let (l, p) = (listen(i), listen(0));
            args.extend(["--threads", "1", "--authority", authority, "--certificate", &cert, "--listen", &l]);
            if i == 0 {
                args.extend(["--authority-key", key]);
            } else {
                args.extend(["--peer", &p]);
            }
            Node::start(&lan.hosts[i], &dir.0, &format!("n{i}"), &args)
        })
        .collect()
}

/// `weft web` in `ns` for the node at `control`, with the authority's key: the
/// process and the address it printed.
fn start_console(ns: &Netns, dir: &TempDir, control: &Path, key: &str) -> (Proc, String) {
    let log = std::fs::File::create(dir.0.join("web.log")).unwrap();
    let mut p = spawn_group(
        ns.cmd(netns::weft_bin())
            .args(["web", "--listen", "127.0.0.1:0", "--authority-key", key, "--control"])
            .arg(control)
            .env("WEFT_NETWORK_SECRET", NET[3])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log),
    );
    let mut line = String::new();
    BufReader::new(p.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let log = std::fs::read_to_string(dir.0.join("web.log")).unwrap_or_default();
    assert!(line.starts_with("http://127.0.0.1:") && line.contains("/?token="), "weft web printed {line:?}\n{log}");
    (p, line.trim().to_owned())
}

/// chromedriver in `ns` (the browser it starts lives there too).
fn start_chromedriver(ns: &Netns) -> Proc {
    spawn_group(ns.cmd("chromedriver").args(["--port=9515"]).stdout(Stdio::null()).stderr(Stdio::null()))
}

async fn browser(profile: &Path) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect("127.0.0.1:9515").is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let caps = serde_json::json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    });
    let serde_json::Value::Object(caps) = caps else { unreachable!() };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector).capabilities(caps).connect("http://127.0.0.1:9515").await.unwrap()
}

/// Opens the console logged in (the token's address), goes to `view` (`#policy`,
/// `#membership`), runs `f` on the page from inside the sandbox, and closes the browser.
fn on_page<T>(sandbox: &Netns, profile: &Path, url: &str, view: &str, f: impl AsyncFnOnce(&Client) -> T + Send) -> T
where
    T: Send,
{
    sandbox.within(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let c = browser(profile).await;
            let base = url.split("/?").next().unwrap().to_owned();
            c.goto(url).await.unwrap();
            c.goto(&format!("{base}/{view}")).await.unwrap();
            let out = f(&c).await;
            c.close().await.unwrap();
            out
        })
    })
}

/// Polls `cond` (an async check of the page) every 200 ms until it holds.
async fn until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out after {limit:?} waiting in the page for {what}");
}

async fn text(c: &Client, css: &str) -> String {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

async fn shot(c: &Client, dir: &TempDir, name: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(dir.0.join(format!("{name}.png")), &png).unwrap();
    if let Ok(out) = std::env::var("WEFT_WEB_SCREENSHOTS") {
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(Path::new(&out).join(format!("web-{name}.png")), &png).unwrap();
    }
}

/// The members table's rows: name cell and path cell.
async fn member_rows(c: &Client) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for row in c.find_all(Locator::Css("#members tbody tr")).await.unwrap_or_default() {
        let cells = row.find_all(Locator::Css("td")).await.unwrap_or_default();
        if cells.len() > 6 {
            out.push((cells[0].text().await.unwrap_or_default(), cells[6].text().await.unwrap_or_default()));
        }
    }
    out
}

#[test]
fn the_console_shows_the_mesh_and_its_invite_policy_push_and_revocation_take_effect_on_every_member() {
    require_root();
    let lan = Lan::new(4);
    let dir = TempDir::new();
    let key = dir.0.join("auth.key").to_str().unwrap().to_owned();
    let authority = weft(&["authority", "init", "--out", &key]);
    let mut nodes = start_members(&lan, &dir, &key, &authority);
    wait_until(Duration::from_secs(30), "the three members mesh", || {
        nodes[0].peer_established(IPS[1]) && nodes[0].peer_established(IPS[2]) && nodes[1].routes_to(IPS[2])
    });
    let sandbox = Netns::new();
    let (_console, url) = start_console(&sandbox, &dir, &nodes[0].control, &key);
    let _driver = start_chromedriver(&sandbox);
    let profile = dir.0.join("chromium-profile");
    let gamma_key = node_id(&dir, "n2");

    let joined = sandbox.within(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let c = browser(&profile).await;
            // Without the token: the page that asks for it.
            let base = url.split("/?").next().unwrap().to_owned();
            c.goto(&base).await.unwrap();
            assert!(c.source().await.unwrap().contains("name=\"token\""), "the login page");

            // Members: all three, with the paths the node reports.
            c.goto(&url).await.unwrap();
            assert_eq!(c.current_url().await.unwrap().query(), None, "the token left the address");
            until(Duration::from_secs(15), "three members", || async { member_rows(&c).await.len() == 3 }).await;
            let st = nodes[0].status();
            let rows = member_rows(&c).await;
            for p in st["peers"].as_array().unwrap() {
                let name = p["hostname"].as_str().unwrap();
                let want = match p["path"].as_str().unwrap() {
                    "relay" => format!("relayed via {}", p["via_hostname"].as_str().unwrap()),
                    other => other.to_owned(),
                };
                assert!(rows.iter().any(|(n, path)| n == name && *path == want), "{name} {want}: {rows:?}");
            }
            assert!(rows.iter().any(|(n, _)| n.starts_with("alpha")), "{rows:?}");
            c.find(Locator::Css("#search")).await.unwrap().send_keys("gam").await.unwrap();
            until(Duration::from_secs(5), "search leaves gamma", || async {
                let r = member_rows(&c).await;
                r.len() == 1 && r[0].0 == "gamma"
            })
            .await;
            c.find(Locator::Css("#search")).await.unwrap().clear().await.unwrap();
            c.execute("document.getElementById('search').dispatchEvent(new Event('input'))", vec![]).await.unwrap();
            shot(&c, &dir, "members").await;
            c.find(Locator::LinkText("beta")).await.unwrap().click().await.unwrap();
            until(Duration::from_secs(5), "beta's page", || async {
                text(&c, "#member-title").await.starts_with("beta") && text(&c, "#member-facts").await.contains("dev")
            })
            .await;
            shot(&c, &dir, "member").await;
            c.goto(&format!("{base}/#map")).await.unwrap();
            until(Duration::from_secs(10), "the map and live counters", || async {
                c.find_all(Locator::Css("#map g.node")).await.map_or(0, |v| v.len()) == 3
                    && c.find_all(Locator::Css("#map line.link")).await.map_or(0, |v| v.len()) >= 2
                    && text(&c, "#rate").await.starts_with("now:")
            })
            .await;
            shot(&c, &dir, "map").await;

            // An invite made in the page.
            c.goto(&format!("{base}/#membership")).await.unwrap();
            until(Duration::from_secs(5), "the invite form", || async {
                c.find(Locator::Css("#invite-box")).await.unwrap().is_displayed().await.unwrap_or(false)
            })
            .await;
            c.find(Locator::Css("#invite-groups")).await.unwrap().send_keys("ops").await.unwrap();
            c.find(Locator::Css("#invite button[type=submit]")).await.unwrap().click().await.unwrap();
            let token = {
                let start = Instant::now();
                loop {
                    let v = c.find(Locator::Css("#invite-token")).await.unwrap().prop("value").await.unwrap();
                    match v {
                        Some(t) if t.starts_with("weft-invite:") => break t,
                        _ if start.elapsed() > Duration::from_secs(10) => panic!("no invite token in the page"),
                        _ => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            };
            assert!(text(&c, "#invite-summary").await.contains("ops"));
            let qr = c.find(Locator::Css("#invite-qr")).await.unwrap();
            assert!(qr.attr("src").await.unwrap().unwrap().starts_with("data:image/svg+xml;base64,"));
            shot(&c, &dir, "membership").await;
            c.close().await.unwrap();
            token
        })
    });

    // The fourth machine joins with the invite alone.
    let d = Node::start(&lan.hosts[3], &dir.0, "n3", &["--join", &joined, "--threads", "1"]);
    let st = d.status();
    assert_eq!(st["certificate"]["groups"], serde_json::json!(["ops"]), "{st}");
    let d_addr = st["overlay"].as_str().unwrap().split('/').next().unwrap().to_owned();
    wait_until(Duration::from_secs(20), "the joined machine reaches alpha", || d.peer_established(IPS[0]));
    assert!(ping(&lan.hosts[3], IPS[0]), "{}", d.log_text());

    // A policy typed in the page and pushed: alpha reaches everyone, nobody else.
    let policy =
        "[[allow]]\nfrom = [\"alpha\"]\nto = [\"*\"]\n\n[[test]]\nfrom = \"beta\"\nto = \"gamma:22\"\nallow = false\n";
    on_page(&sandbox, &profile, &url, "#policy", async |c: &Client| {
        let editor = c.find(Locator::Css("#policy-text")).await.unwrap();
        // A broken policy first: the check says why as it is typed.
        editor.send_keys("[[allow]]\nfrom = [\"alpha\"]\n").await.unwrap();
        until(Duration::from_secs(5), "the check refuses a rule without `to`", || async {
            text(c, "#policy-check").await.starts_with("✗")
        })
        .await;
        editor.clear().await.unwrap();
        editor.send_keys(policy).await.unwrap();
        until(Duration::from_secs(5), "the check passes", || async {
            text(c, "#policy-check").await.starts_with("✓")
        })
        .await;
        c.find(Locator::Css("#policy-push")).await.unwrap().click().await.unwrap();
        until(Duration::from_secs(10), "the push", || async {
            text(c, "#policy-push-result").await.starts_with("pushed")
        })
        .await;
        until(Duration::from_secs(10), "the rules in force", || async {
            text(c, "#policy-rules tbody").await.contains("from [alpha] to [*]")
        })
        .await;
        c.find(Locator::Css("#explain-from")).await.unwrap().send_keys("beta").await.unwrap();
        c.find(Locator::Css("#explain-to")).await.unwrap().send_keys("gamma:22").await.unwrap();
        c.find(Locator::Css("#explain button")).await.unwrap().click().await.unwrap();
        until(Duration::from_secs(5), "explain", || async { text(c, "#explain-result").await.contains("denied") })
            .await;
        shot(c, &dir, "policy").await;
    });
    let version = nodes[0].status()["policy"]["version"].clone();
    wait_until(Duration::from_secs(20), "gamma puts the pushed policy in force", || {
        nodes[2].status()["policy"]["version"] == version
    });
    assert!(ping(&lan.hosts[0], IPS[2]), "alpha still reaches gamma");
    assert!(!ping(&lan.hosts[1], IPS[2]), "the pushed policy refuses beta's ping at gamma");
    // Beta's ping at alpha is refused too, and alpha's console lists it by name.
    assert!(!ping(&lan.hosts[1], IPS[0]), "the pushed policy refuses beta's ping at alpha");
    on_page(&sandbox, &profile, &url, "#policy", async |c: &Client| {
        until(Duration::from_secs(10), "beta's ping among the recent denials", || async {
            let t = text(c, "#policy-denials tbody").await;
            t.contains(&format!("beta {}", IPS[1])) && t.contains("icmp")
        })
        .await;
    });

    // Gamma revoked in the page, after a confirmation naming it.
    on_page(&sandbox, &profile, &url, "#membership", async |c: &Client| {
        let gamma_short = nodes[0].peer(IPS[2]).unwrap()["node_id"].as_str().unwrap().to_owned();
        let button = format!("button[data-revoke='{gamma_short}']");
        until(Duration::from_secs(5), "gamma's revoke button", || async {
            c.find(Locator::Css(&button)).await.is_ok()
        })
        .await;
        c.find(Locator::Css(&button)).await.unwrap().click().await.unwrap();
        assert!(text(c, "#revoke-name").await.starts_with("gamma"));
        // The wrong name is refused.
        c.find(Locator::Css("#revoke-confirm")).await.unwrap().send_keys("beta").await.unwrap();
        c.find(Locator::Css("#revoke-ok")).await.unwrap().click().await.unwrap();
        until(Duration::from_secs(5), "the refusal", || async {
            text(c, "#revoke-result").await.starts_with("not revoked")
        })
        .await;
        c.find(Locator::Css(&button)).await.unwrap().click().await.unwrap();
        c.find(Locator::Css("#revoke-confirm")).await.unwrap().send_keys("gamma").await.unwrap();
        c.find(Locator::Css("#revoke-ok")).await.unwrap().click().await.unwrap();
        until(Duration::from_secs(10), "the revocation", || async {
            text(c, "#revoke-result").await.starts_with("revoked gamma")
        })
        .await;
    });
    let took = wait_until(Duration::from_secs(20), "every member cuts gamma off", || {
        [&nodes[0], &nodes[1], &d].iter().all(|n| {
            let s = n.status();
            s["revocations"].as_array().is_some_and(|r| r.iter().any(|k| k == gamma_key.as_str()))
                && !n.peer_established(IPS[2])
        })
    });
    eprintln!("every member cut gamma off {took:?} after the page's revocation");
    // The policy lets alpha reach gamma: only the revocation stops it now.
    assert!(!ping(&lan.hosts[0], IPS[2]), "alpha still reaches the revoked gamma");
    assert!(ping(&lan.hosts[0], &d_addr), "alpha still reaches the joined member");
    nodes.push(d);
}
