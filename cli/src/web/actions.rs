//! What the console does beyond showing the status: the policy editor's check (the
//! code of `weft policy check`, then the policy's tests against the members this node
//! knows), `explain`, and the authority's actions: sign and push a policy, make an
//! invite, revoke a member. Signing goes through `commands::authority`, the code of
//! `weft authority`; the result reaches the mesh the way `weft policy push` and
//! `weft revoke add` hand it over, through the node's control socket.

use std::net::IpAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use weft_control::{Reply, Request, StatusJson};
use weft_core::policy::Member;

use super::Console;
use super::snapshot::ask;
use crate::commands::authority;
use crate::config::values::IpNet;

/// A policy text from the editor.
#[derive(Debug, Deserialize)]
pub(crate) struct PolicyText {
    text: String,
}

/// `POST /api/policy/check`: the first problem, or the rules and tests; then the
/// tests again against the members this node knows now.
pub(crate) async fn policy_check(State(c): State<Arc<Console>>, Json(p): Json<PolicyText>) -> Response {
    let checked = match crate::services::policy::check_text(&p.text) {
        Ok(ch) => ch,
        Err(e) => return Json(json!({ "ok": false, "error": e })).into_response(),
    };
    let live = match c.snapshot.status().await {
        Ok(s) => {
            let (members, overlay) = members(&s);
            match weft_core::policy::Policy::parse(&p.text).map(|pol| pol.check_known_tests(&members, &overlay)) {
                Ok(Ok((passed, skipped))) => json!({ "ok": true, "passed": passed, "skipped": skipped }),
                Ok(Err(e)) | Err(e) => json!({ "ok": false, "error": e.to_string() }),
            }
        }
        Err(e) => json!({ "ok": false, "error": e }),
    };
    Json(json!({
        "ok": live["ok"] == true,
        "rules": checked.rules,
        "tests": checked.tests,
        "unresolved": checked.unresolved,
        "version": checked.version,
        "members": live,
    }))
    .into_response()
}

/// A flow to explain, against the policy in force or a draft.
#[derive(Debug, Deserialize)]
pub(crate) struct Flow {
    from: String,
    to: String,
    proto: String,
    /// The editor's text: explain against this draft (the members this node knows)
    /// instead of the policy in force.
    #[serde(default)]
    draft: Option<String>,
}

/// `POST /api/policy/explain`: which rule decides a flow. Against the policy in force
/// the node answers (as for `weft policy explain`); against a draft the console does,
/// with the members and overlay of the node's status.
pub(crate) async fn policy_explain(State(c): State<Arc<Console>>, Json(f): Json<Flow>) -> Response {
    let Some(text) = f.draft else {
        return node_change(&c, Request::ExplainPolicy { from: f.from, to: f.to, proto: f.proto }).await;
    };
    let policy = match weft_core::policy::Policy::parse(&text) {
        Ok(p) => p,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &format!("the draft does not parse: {e}")),
    };
    let status = match c.snapshot.status().await {
        Ok(s) => s,
        Err(e) => return failed(StatusCode::BAD_GATEWAY, &e),
    };
    let (members, overlay) = members(&status);
    match crate::services::policy::explain_flow(&policy, "the draft", &members, &overlay, (&f.from, &f.to, &f.proto)) {
        Ok(done) => Json(json!({ "done": done })).into_response(),
        Err(e) => failed(StatusCode::BAD_REQUEST, &e),
    }
}

/// `POST /api/policy/push`: sign the editor's text with the authority's key (as
/// `weft authority sign-policy` does) and hand it to the node (as `weft policy push`).
pub(crate) async fn policy_push(State(c): State<Arc<Console>>, Json(p): Json<PolicyText>) -> Response {
    let Some((key, _)) = &c.authority else { return no_key() };
    let network = match c.snapshot.status().await {
        Ok(s) => s.network_name.clone(),
        Err(e) => return failed(StatusCode::BAD_GATEWAY, &e),
    };
    let signed = match authority::signed_policy(key, &network, None, &p.text) {
        Ok(s) => s,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &e.0),
    };
    let r = node_change(&c, Request::PushPolicy { policy: signed.policy.to_text() }).await;
    if r.status().is_success() {
        tracing::info!(summary = %signed.summary, "the console pushed a signed policy");
        return Json(json!({ "done": signed.summary })).into_response();
    }
    r
}

/// An invite to make.
#[derive(Debug, Deserialize)]
pub(crate) struct InviteForm {
    #[serde(default)]
    groups: String,
    uses: u32,
    expires: String,
    cert_expires: String,
    /// Entry points, one per line or comma-separated (default: this node's udp
    /// listeners with a concrete address).
    #[serde(default)]
    peers: String,
}

/// `POST /api/invite`: an invite signed with the authority's key (as `weft authority
/// invite`), as text and as a QR code (SVG).
pub(crate) async fn invite(State(c): State<Arc<Console>>, Json(f): Json<InviteForm>) -> Response {
    let Some((key, _)) = &c.authority else { return no_key() };
    let Some(secret) = &c.secret else {
        return failed(
            StatusCode::FORBIDDEN,
            "invites carry the network secret: start `weft web` with WEFT_NETWORK_SECRET (or --network-secret)",
        );
    };
    let s = match c.snapshot.status().await {
        Ok(s) => s,
        Err(e) => return failed(StatusCode::BAD_GATEWAY, &e),
    };
    let split = |t: &str| -> Vec<String> {
        t.split([',', '\n', ' ']).map(str::trim).filter(|x| !x.is_empty()).map(str::to_owned).collect()
    };
    let mut peers = split(&f.peers);
    if peers.is_empty() {
        peers = s
            .listeners
            .iter()
            .filter(|l| l.starts_with("udp://") && !l.contains("0.0.0.0") && !l.contains("[::]"))
            .cloned()
            .collect();
    }
    let groups = split(&f.groups);
    let spec = authority::InviteSpec {
        network: &s.network_name,
        secret: &secret.0,
        peers: &peers,
        groups: &groups,
        expires: &f.expires,
        uses: f.uses,
        cert_expires: &f.cert_expires,
    };
    let made = match authority::make_invite(key, &spec) {
        Ok(m) => m,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &format!("{e:#}")),
    };
    let svg = match qr_svg(&made.token) {
        Ok(s) => s,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &e),
    };
    tracing::info!(invite = %made.id, uses = f.uses, "the console made an invite");
    Json(json!({
        "token": made.token,
        "id": made.id,
        "groups": made.groups,
        "uses": authority::uses_text(f.uses),
        "expires": authority::utc(made.expires),
        "entry_points": peers,
        "qr_svg": base64::engine::general_purpose::STANDARD.encode(svg),
    }))
    .into_response()
}

/// A member to revoke, and the name the admin typed to confirm it.
#[derive(Debug, Deserialize)]
pub(crate) struct RevokeForm {
    /// Its node key (64 hex digits).
    key: String,
    /// Its host name, typed again.
    confirm: String,
}

/// `POST /api/revoke`: after the confirmation names the member, a revocation signed
/// with the authority's key (as `weft authority revoke`) handed to the node (as
/// `weft revoke add`), which carries it to every member.
pub(crate) async fn revoke(State(c): State<Arc<Console>>, Json(f): Json<RevokeForm>) -> Response {
    let Some((key, path)) = &c.authority else { return no_key() };
    let subject = match authority::parse_node_id(&f.key) {
        Ok(s) => s,
        Err(e) => return failed(StatusCode::BAD_REQUEST, &e.0),
    };
    let s = match c.snapshot.status().await {
        Ok(s) => s,
        Err(e) => return failed(StatusCode::BAD_GATEWAY, &e),
    };
    let Some(member) = s.peers.iter().find(|p| p.key.eq_ignore_ascii_case(f.key.trim())) else {
        return failed(StatusCode::NOT_FOUND, "no member with that key is known to this node");
    };
    if f.confirm.trim() != member.hostname {
        return failed(
            StatusCode::BAD_REQUEST,
            &format!("the confirmation must name the member: type {:?}", member.hostname),
        );
    }
    let revocation = match authority::revocation(key, path, subject, true) {
        Ok(r) => r,
        Err(e) => return failed(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    };
    let name = member.hostname.clone();
    let r = node_change(&c, Request::AddRevocation { revocation: revocation.to_text() }).await;
    if r.status().is_success() {
        tracing::warn!(member = %name, "the console revoked a member");
    }
    r
}

/// The members of status as the access policy names them, and the overlay networks.
pub(crate) fn members(s: &StatusJson) -> (Vec<Member>, Vec<(IpAddr, u8)>) {
    let cidr = |t: &str| IpNet::parse_cidr(t).map(|n| (n.addr, n.prefix));
    let addr = |t: &str| cidr(t).map(|(a, _)| a).or_else(|| t.parse().ok());
    let subnets_of = |id: &str| -> Vec<(IpAddr, u8)> {
        s.routes
            .iter()
            .filter(|r| r.node_id == id)
            .flat_map(|r| r.proxied.iter().filter_map(|p| cidr(p)))
            .filter(|&(_, p)| p != 0)
            .collect()
    };
    let mut out = vec![Member {
        node_id: s.node_id.clone(),
        key: s.certificate.as_ref().map(|c| c.node_id.clone()).unwrap_or_default(),
        name: s.hostname.clone(),
        addrs: [Some(s.overlay.as_str()), s.overlay6.as_deref()].into_iter().flatten().filter_map(addr).collect(),
        groups: s.certificate.as_ref().map(|c| c.groups.clone()).unwrap_or_default(),
        subnets: s.proxy_networks.iter().filter_map(|p| cidr(p)).filter(|&(_, p)| p != 0).collect(),
    }];
    for p in &s.peers {
        out.push(Member {
            node_id: p.node_id.clone(),
            key: p.key.clone(),
            name: p.hostname.clone(),
            addrs: [Some(p.overlay.as_str()), p.overlay6.as_deref()].into_iter().flatten().filter_map(addr).collect(),
            groups: p.groups.clone(),
            subnets: subnets_of(&p.node_id),
        });
    }
    let overlay = [Some(s.overlay.as_str()), s.overlay6.as_deref()]
        .into_iter()
        .flatten()
        .filter_map(cidr)
        .map(|(a, p)| (IpNet { addr: a, prefix: p }.network().addr, p))
        .collect();
    (out, overlay)
}

/// A QR code of `text` as an SVG document.
pub(crate) fn qr_svg(text: &str) -> Result<String, String> {
    let code = qrcode::QrCode::with_error_correction_level(text.as_bytes(), qrcode::EcLevel::L)
        .map_err(|e| format!("the invite is too long for a QR code: {e}"))?;
    Ok(code.render::<qrcode::render::svg::Color<'_>>().min_dimensions(240, 240).quiet_zone(true).build())
}

/// Sends a request to the node and maps its reply: done → 200, refused → 400.
async fn node_change(c: &Console, req: Request) -> Response {
    let r = match ask(&c.control, req).await {
        Ok(Reply::Done { message }) => Json(json!({ "done": message })).into_response(),
        Ok(Reply::Error { message }) => failed(StatusCode::BAD_REQUEST, &message),
        Ok(Reply::Status(_) | Reply::WgClient(_)) => failed(StatusCode::BAD_GATEWAY, "unexpected reply from the node"),
        Err(e) => failed(StatusCode::BAD_GATEWAY, &e),
    };
    c.snapshot.invalidate().await;
    r
}

fn no_key() -> Response {
    failed(StatusCode::FORBIDDEN, "this console has no authority key: start `weft web` with --authority-key")
}

fn failed(code: StatusCode, why: &str) -> Response {
    (code, Json(json!({ "error": why }))).into_response()
}
