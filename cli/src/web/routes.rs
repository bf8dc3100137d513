//! The console's routes and what guards every one of them: the login (token → session
//! cookie, else 401), the CSRF check of every state-changing request (the session's
//! token in a header, and a same-origin `Origin`), and the security headers of every
//! response (a strict content security policy: scripts, styles and connections from
//! the console itself only, no inline script, no framing).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::Console;
use super::session::{self, COOKIE, CSRF_HEADER, Session};

/// The content security policy of every response.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");
const LOGIN: &str = include_str!("assets/login.html");

/// Every route; all of them behind the login, every response with the headers.
pub(crate) fn router(c: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(|| async { page(INDEX) }))
        .route("/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/api/session", get(session_info))
        .route("/api/status", get(status))
        .route("/api/events", get(events))
        .route("/api/logout", post(logout))
        .route("/api/policy/check", post(super::actions::policy_check))
        .route("/api/policy/explain", post(super::actions::policy_explain))
        .route("/api/policy/push", post(super::actions::policy_push))
        .route("/api/invite", post(super::actions::invite))
        .route("/api/revoke", post(super::actions::revoke))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found") })
        .layer(middleware::from_fn_with_state(c.clone(), login))
        .layer(middleware::from_fn(headers))
        .with_state(c)
}

/// The security headers, on every response (refusals included).
async fn headers(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The login token rides in the first address: never send it on.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    r
}

/// The login: `?token=` buys a session (and a redirect that drops the token from the
/// address); a session cookie lets the request through, a state-changing one only with
/// its CSRF token and a same-origin `Origin`; anything else is 401.
async fn login(State(c): State<Arc<Console>>, mut req: Request, next: Next) -> Response {
    let now = Instant::now();
    if let Some(token) = query_token(req.uri()) {
        let mut sessions = c.sessions.lock();
        if !sessions.token_matches(&token) {
            drop(sessions);
            return refuse(req.uri(), "wrong token");
        }
        let (id, _) = sessions.open(now, session::random32);
        let max_age = sessions.lifetime().as_secs();
        drop(sessions);
        let secure = if c.tls { "; Secure" } else { "" };
        let cookie = format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}");
        let to = req.uri().path().to_owned();
        let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    let Some(id) = session_cookie(req.headers()) else { return refuse(req.uri(), "login required") };
    let Some(s) = c.sessions.lock().check(now, &id) else {
        return refuse(req.uri(), "the session ended: log in again");
    };
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        if !same_origin(req.headers()) {
            return (StatusCode::FORBIDDEN, axum::Json(json!({"error": "cross-origin request refused"})))
                .into_response();
        }
        let given = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if !session::csrf_matches(&s, given) {
            return (StatusCode::FORBIDDEN, axum::Json(json!({"error": "missing or wrong CSRF token"})))
                .into_response();
        }
    }
    req.extensions_mut().insert(SessionId(id));
    req.extensions_mut().insert(s);
    next.run(req).await
}

/// The cookie value of the request's session (for logout).
#[derive(Debug, Clone)]
pub(crate) struct SessionId(String);

/// A 401: the API says so in JSON, a page asks for the token.
fn refuse(uri: &Uri, why: &str) -> Response {
    if uri.path().starts_with("/api/") {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "error": why }))).into_response();
    }
    let body = LOGIN.replace("{why}", why);
    (StatusCode::UNAUTHORIZED, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// The `token` query parameter, if the address carries one.
fn query_token(uri: &Uri) -> Option<String> {
    let q = uri.query()?;
    q.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == "token").map(|(_, v)| v.to_owned())
}

fn session_cookie(h: &HeaderMap) -> Option<String> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| session::cookie(v, COOKIE))
        .map(str::to_owned)
}

/// Whether a state-changing request comes from the console's own pages: its `Origin`
/// (which browsers send with every such request) names the host it was sent to.
fn same_origin(h: &HeaderMap) -> bool {
    let Some(host) = h.get(header::HOST).and_then(|v| v.to_str().ok()) else { return false };
    match h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        // Not from a browser (a script with the session's cookie and CSRF token).
        None => true,
        Some(o) => o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")) == Some(host),
    }
}

fn page(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// `GET /api/session`: the CSRF token for this session's changes, and what the console
/// may do (the authority's actions only with its key).
async fn session_info(State(c): State<Arc<Console>>, axum::Extension(s): axum::Extension<Session>) -> Response {
    axum::Json(json!({
        "csrf": s.csrf,
        "authority": c.authority.as_ref().map(|(k, _)| k.id().to_string()),
        "invites": c.authority.is_some() && c.secret.is_some(),
    }))
    .into_response()
}

/// `POST /api/logout`.
async fn logout(State(c): State<Arc<Console>>, axum::Extension(id): axum::Extension<SessionId>) -> Response {
    c.sessions.lock().close(&id.0);
    let gone = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, gone)], axum::Json(json!({"done": "logged out"}))).into_response()
}

/// `GET /api/status`: the node's status (`weft status --json`).
async fn status(State(c): State<Arc<Console>>) -> Response {
    match c.snapshot.status().await {
        Ok(s) => axum::Json(&*s).into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, axum::Json(json!({ "error": e }))).into_response(),
    }
}

/// `GET /api/events`: server-sent events, one a second: each member's traffic
/// counters and state, and the node's totals, for the live throughput plot and map.
/// The stream ends with its session (logout, expiry).
async fn events(
    State(c): State<Arc<Console>>,
    axum::Extension(id): axum::Extension<SessionId>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold((c, id, true), |(c, id, first)| async move {
        if !first {
            tokio::time::sleep(Duration::from_secs(1)).await;
            c.sessions.lock().check(Instant::now(), &id.0)?;
        }
        let ev = match c.snapshot.status().await {
            Ok(s) => Event::default().event("traffic").data(traffic(&s).to_string()),
            Err(e) => Event::default().event("error").data(json!({ "error": e }).to_string()),
        };
        Some((Ok(ev), (c, id, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// One event: the counters the plot differentiates, per member and in total.
pub(crate) fn traffic(s: &weft_control::StatusJson) -> serde_json::Value {
    let (rx, tx) = s.pipelines.iter().fold((0u64, 0u64), |(r, t), p| (r + p.rx_bytes, t + p.tx_bytes));
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    json!({
        "t": unix,
        "rx_bytes": rx,
        "tx_bytes": tx,
        "peers": s.peers.iter().map(|p| json!({
            "node_id": p.node_id,
            "rx_bytes": p.rx_bytes,
            "tx_bytes": p.tx_bytes,
            "state": p.state,
            "path": p.path,
            "via": p.via,
            "rtt_ms": p.rtt_ms,
        })).collect::<Vec<_>>(),
    })
}
