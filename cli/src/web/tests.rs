//! The console's HTTP behaviour, through its real router, against a control socket that
//! answers with a recorded three-member status and records what it is asked.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt;
use weft_control::{Reply, Request as Ask};

use super::Console;
use super::routes::CSP;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const KEY_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// Every route, with the method it takes.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/app.js"),
    ("GET", "/style.css"),
    ("GET", "/api/session"),
    ("GET", "/api/status"),
    ("GET", "/api/events"),
    ("POST", "/api/logout"),
    ("POST", "/api/policy/check"),
    ("POST", "/api/policy/explain"),
    ("POST", "/api/policy/push"),
    ("POST", "/api/invite"),
    ("POST", "/api/revoke"),
    ("GET", "/no/such/page"),
];

fn status_json() -> serde_json::Value {
    let peer = |id: &str, name: &str, ip: &str, key: &str, path: &str, via: Option<&str>| {
        serde_json::json!({
            "node_id": id, "hostname": name, "overlay": ip, "endpoint": "udp://192.0.2.2:11010",
            "path": path, "via": via, "via_hostname": via.map(|_| "beta"), "hops": 1, "transport": "udp",
            "rtt_ms": 1.5, "loss": 0.0, "state": "established", "link": true, "last_handshake_secs": 3,
            "rx_bytes": 100, "rx_packets": 1, "tx_bytes": 200, "tx_packets": 2, "drops": {}, "error": null,
            "key": key, "groups": ["dev"], "cert_not_after": 1_900_000_000u64,
        })
    };
    serde_json::json!({
        "node_id": "aaaaaaaaaaaaaaaa", "network_name": "webtest", "hostname": "alpha",
        "overlay": "10.126.140.1/24", "cipher": "aes-128-gcm", "listeners": ["udp://192.0.2.1:11010"],
        "dev_name": "weft0", "offloads": {"tun": true, "tun_gro": true, "udp_gso": true, "udp_gro": true},
        "pipelines": [], "threads": 1, "uptime_secs": 5, "drops": {},
        "peers": [
            peer("bbbbbbbbbbbbbbbb", "beta", "10.126.140.2", KEY_B, "direct", None),
            peer("cccccccccccccccc", "gamma", "10.126.140.3", &"c".repeat(64), "relay", Some("bbbbbbbbbbbbbbbb")),
        ],
        "routes": [], "address_conflicts": [], "proxy_networks": [], "pending_peers": [], "refused_handshakes": [],
    })
}

/// A control socket answering status with [`status_json`] and `Done` to the rest,
/// keeping each request it was sent.
struct FakeNode {
    dir: PathBuf,
    socket: PathBuf,
    asked: Arc<Mutex<Vec<Ask>>>,
}

impl FakeNode {
    fn start() -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("weft-web-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("weft.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let kept = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_err() {
                    continue;
                }
                let Ok(req) = serde_json::from_str::<Ask>(&line) else { continue };
                let reply = match req {
                    Ask::Status => Reply::Status(Box::new(serde_json::from_value(status_json()).unwrap())),
                    _ => Reply::Done { message: "taken".into() },
                };
                kept.lock().unwrap().push(req);
                let _ = conn.write_all(format!("{}\n", serde_json::to_string(&reply).unwrap()).as_bytes());
            }
        });
        Self { dir, socket, asked }
    }

    fn console(&self) -> Console {
        Console::new(self.socket.clone(), TOKEN.into(), Duration::from_secs(3600))
    }

    /// A console holding a fresh authority key (written beside the socket).
    fn console_with_key(&self) -> (Console, weft_core::cert::AuthorityId) {
        let path = self.dir.join("auth.key");
        crate::commands::authority::init(&path).unwrap();
        let key = crate::daemon::state::load_key(&path).unwrap();
        let id = key.id();
        (self.console().with_authority(key, path).with_secret("s3cret horse".into()), id)
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn req(method: &str, path: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(path).header(header::HOST, "127.0.0.1:8787")
}

/// Logs in with the token: the session cookie and the CSRF token.
async fn login(app: &axum::Router) -> (String, String) {
    let r = app.clone().oneshot(req("GET", &format!("/?token={TOKEN}")).body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()[header::LOCATION], "/", "the redirect drops the token from the address");
    let set = r.headers()[header::SET_COOKIE].to_str().unwrap().to_owned();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=3600"] {
        assert!(set.contains(attr), "{set}");
    }
    let cookie = set.split(';').next().unwrap().to_owned();
    let r =
        app.clone().oneshot(req("GET", "/api/session").header(header::COOKIE, &cookie).body(Body::empty()).unwrap());
    let j = json(r.await.unwrap()).await;
    (cookie, j["csrf"].as_str().unwrap().to_owned())
}

async fn json(r: axum::response::Response) -> serde_json::Value {
    let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    serde_json::from_slice(&b).unwrap_or_else(|_| serde_json::json!({ "raw": String::from_utf8_lossy(&b) }))
}

fn post(path: &str, cookie: &str, csrf: &str, body: serde_json::Value) -> Request<Body> {
    req("POST", path)
        .header(header::COOKIE, cookie)
        .header("x-weft-csrf", csrf)
        .header(header::ORIGIN, "http://127.0.0.1:8787")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn assert_security_headers(r: &axum::response::Response, what: &str) {
    let h = r.headers();
    assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP, "{what}");
    assert!(CSP.contains("script-src 'self'") && CSP.contains("frame-ancestors 'none'") && !CSP.contains("unsafe"));
    assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{what}");
    assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "{what}");
    assert_eq!(h[header::REFERRER_POLICY], "no-referrer", "{what}");
}

#[test]
fn every_route_refuses_a_missing_or_wrong_token_or_session_and_says_so() {
    let node = FakeNode::start();
    let app = node.console().router();
    rt().block_on(async {
        for &(method, path) in ROUTES {
            let no_login = app.clone().oneshot(req(method, path).body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(no_login.status(), StatusCode::UNAUTHORIZED, "{method} {path} without login");
            assert_security_headers(&no_login, path);
            let wrong = format!("{path}?token={}", "f".repeat(32));
            let r = app.clone().oneshot(req(method, &wrong).body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{method} {path} with a wrong token");
            assert!(r.headers().get(header::SET_COOKIE).is_none());
            let r = app
                .clone()
                .oneshot(req(method, path).header(header::COOKIE, "weft_session=forged").body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{method} {path} with a forged session");
            let body = json(r).await;
            if path.starts_with("/api/") {
                assert!(body["error"].as_str().unwrap().contains("session"), "{body}");
            } else {
                assert!(body["raw"].as_str().unwrap().contains("name=\"token\""), "a page asks for the token: {body}");
            }
        }
        assert!(node.asked.lock().unwrap().is_empty(), "nothing reached the node without a login");
    });
}

#[test]
fn a_session_reads_pages_and_status_and_changes_need_its_csrf_token_from_the_same_origin() {
    let node = FakeNode::start();
    let app = node.console().router();
    rt().block_on(async {
        let (cookie, csrf) = login(&app).await;
        let get = |p: &str| req("GET", p).header(header::COOKIE, &cookie).body(Body::empty()).unwrap();
        let r = app.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_security_headers(&r, "/");
        let page = json(r).await["raw"].as_str().unwrap().to_owned();
        assert!(page.contains("<script src=\"/app.js\"") && !page.contains("<script>"), "no inline script");
        let r = app.clone().oneshot(get("/app.js")).await.unwrap();
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        let s = json(app.clone().oneshot(get("/api/status")).await.unwrap()).await;
        assert_eq!(s["peers"].as_array().unwrap().len(), 2, "{s}");
        assert_eq!(s["peers"][1]["via_hostname"], "beta");

        let check = serde_json::json!({ "text": "[[allow]]\nfrom = [\"*\"]\nto = [\"*\"]\n" });
        // No CSRF token, a wrong one, another origin: refused before the handler.
        let mut bare = post("/api/policy/check", &cookie, &csrf, check.clone());
        bare.headers_mut().remove("x-weft-csrf");
        let wrong = post("/api/policy/check", &cookie, "nope", check.clone());
        let mut cross = post("/api/policy/check", &cookie, &csrf, check.clone());
        cross.headers_mut().insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        for (what, r) in [("no CSRF token", bare), ("a wrong CSRF token", wrong), ("another origin", cross)] {
            let r = app.clone().oneshot(r).await.unwrap();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{what}");
            assert_security_headers(&r, what);
        }
        let r = json(app.clone().oneshot(post("/api/policy/check", &cookie, &csrf, check)).await.unwrap()).await;
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["rules"], 1);
        let bad = serde_json::json!({ "text": "[[allow]]\nfrom = [\"*\"]\n" });
        let r = json(app.clone().oneshot(post("/api/policy/check", &cookie, &csrf, bad)).await.unwrap()).await;
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["error"].as_str().unwrap().contains("to"), "{r}");
        // A test that holds offline but fails against the members this node knows
        // (gamma's certificate puts it in group dev).
        let live = serde_json::json!({ "text":
            "[[allow]]\nfrom = [\"group:dev\"]\nto = [\"alpha\"]\nproto = \"tcp\"\nports = [\"22\"]\n[[test]]\nfrom = \"gamma\"\nto = \"alpha:22\"\nallow = false\n" });
        let r = json(app.clone().oneshot(post("/api/policy/check", &cookie, &csrf, live.clone())).await.unwrap()).await;
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["members"]["error"].as_str().is_some_and(|e| e.contains("test 1")), "{r}");
        // Explain against that draft: the console answers with the members the node
        // knows (gamma is in group dev, so the draft lets it reach alpha:22; beta's
        // port 80 is no rule's).
        let draft = live["text"].clone();
        let flow = |from: &str, to: &str| serde_json::json!({ "from": from, "to": to, "proto": "tcp", "draft": draft });
        let r = json(app.clone().oneshot(post("/api/policy/explain", &cookie, &csrf, flow("gamma", "alpha:22"))).await.unwrap()).await;
        assert_eq!(r["done"], "gamma (10.126.140.3) -> alpha (10.126.140.1) tcp 22: allowed by rule 1 (from [group:dev] to [alpha], tcp ports 22)", "{r}");
        let r = json(app.clone().oneshot(post("/api/policy/explain", &cookie, &csrf, flow("beta", "alpha:80"))).await.unwrap()).await;
        assert!(r["done"].as_str().is_some_and(|d| d.ends_with("denied (no rule allows it; the draft)")), "{r}");
        let broken = serde_json::json!({ "from": "beta", "to": "alpha:22", "proto": "tcp", "draft": "[[allow]]\nfrom = [" });
        let r = app.clone().oneshot(post("/api/policy/explain", &cookie, &csrf, broken)).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(json(r).await.to_string().contains("the draft does not parse"));

        // Logout ends the session.
        let r = app.clone().oneshot(post("/api/logout", &cookie, &csrf, serde_json::json!({}))).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let r = app.clone().oneshot(get("/api/status")).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    });
}

#[test]
fn without_the_authority_key_push_invite_and_revoke_are_refused_and_reach_no_node() {
    let node = FakeNode::start();
    let app = node.console().router();
    rt().block_on(async {
        let (cookie, csrf) = login(&app).await;
        let s = json(
            app.clone()
                .oneshot(req("GET", "/api/session").header(header::COOKIE, &cookie).body(Body::empty()).unwrap())
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s["authority"], serde_json::Value::Null);
        assert_eq!(s["invites"], false);
        let asks = [
            ("/api/policy/push", serde_json::json!({ "text": "[[allow]]\nfrom = [\"*\"]\nto = [\"*\"]\n" })),
            ("/api/revoke", serde_json::json!({ "key": KEY_B, "confirm": "beta" })),
            ("/api/invite", serde_json::json!({ "uses": 1, "expires": "1h", "cert_expires": "1d" })),
        ];
        for (path, body) in asks {
            let r = app.clone().oneshot(post(path, &cookie, &csrf, body)).await.unwrap();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
            let j = json(r).await;
            assert!(j["error"].as_str().unwrap().contains("--authority-key"), "{path}: {j}");
        }
        let asked = node.asked.lock().unwrap();
        assert!(asked.iter().all(|a| matches!(a, Ask::Status)), "nothing but status reached the node: {asked:?}");
    });
}

#[test]
fn with_the_key_a_revocation_needs_the_members_name_and_push_and_invite_are_signed_by_it() {
    let node = FakeNode::start();
    let (console, authority) = node.console_with_key();
    let app = console.router();
    rt().block_on(async {
        let (cookie, csrf) = login(&app).await;
        let r = app
            .clone()
            .oneshot(post("/api/revoke", &cookie, &csrf, serde_json::json!({ "key": KEY_B, "confirm": "gamma" })))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "the confirmation names another member");
        assert!(json(r).await["error"].as_str().unwrap().contains("\"beta\""));
        let r = app
            .clone()
            .oneshot(post("/api/revoke", &cookie, &csrf, serde_json::json!({ "key": KEY_B, "confirm": "beta" })))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let text = "[[allow]]\nfrom = [\"group:dev\"]\nto = [\"*\"]\nproto = \"tcp\"\nports = [\"22\"]\n";
        let r = app
            .clone()
            .oneshot(post("/api/policy/push", &cookie, &csrf, serde_json::json!({ "text": text })))
            .await
            .unwrap();
        let (code, j) = (r.status(), json(r).await);
        assert_eq!(code, StatusCode::OK, "{j}");
        assert!(j["done"].as_str().unwrap().contains("1 rule(s)"), "{j}");
        let r = app
            .clone()
            .oneshot(post(
                "/api/invite",
                &cookie,
                &csrf,
                serde_json::json!({ "groups": "dev, ops", "uses": 2, "expires": "1h", "cert_expires": "30d" }),
            ))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let inv = json(r).await;
        let token = weft_core::invite::Token::from_text(inv["token"].as_str().unwrap()).unwrap();
        assert_eq!(token.invite.body().authority, authority);
        assert_eq!(token.invite.body().groups, ["dev", "ops"]);
        assert_eq!(token.invite.body().uses, 2);
        assert_eq!(token.entry_points, ["udp://192.0.2.1:11010"], "the node's own udp listener");
        use base64::Engine;
        let svg = base64::engine::general_purpose::STANDARD.decode(inv["qr_svg"].as_str().unwrap()).unwrap();
        assert!(String::from_utf8(svg).unwrap().contains("<svg"));

        let asked = node.asked.lock().unwrap();
        let revocations: Vec<_> = asked
            .iter()
            .filter_map(|a| match a {
                Ask::AddRevocation { revocation } => Some(weft_core::cert::Revocation::from_text(revocation).unwrap()),
                _ => None,
            })
            .collect();
        assert_eq!(revocations.len(), 1, "only the confirmed revocation reached the node: {asked:?}");
        assert_eq!(revocations[0].node, [0xbb; 32]);
        assert_eq!(revocations[0].authority, authority);
        let pushed: Vec<_> = asked
            .iter()
            .filter_map(|a| match a {
                Ask::PushPolicy { policy } => Some(weft_core::policy::SignedPolicy::from_text(policy).unwrap()),
                _ => None,
            })
            .collect();
        assert_eq!(pushed.len(), 1);
        assert_eq!(pushed[0].text, text);
        assert_eq!(pushed[0].network.as_deref(), Some("webtest"));
        let ledger = std::fs::read_to_string(node.dir.join("auth.key.ledger")).unwrap();
        assert!(ledger.contains(KEY_B), "the revocation is in the authority's ledger:\n{ledger}");
    });
}
