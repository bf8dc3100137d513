//! The `/metrics` endpoint: HTTP/1.1 served by hyper, Prometheus text rendered from
//! the node's status. Limits: at most 8 scrapes at once (more are closed at once), a
//! request head of at most 8 KiB read within 5 s, and 10 s for the whole exchange.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tracing::debug;
use weft_control::Reply;

use crate::control::server::Requests;

/// Scrapes served at once; more are closed at once.
pub(crate) const MAX_SCRAPES: usize = 8;
/// Longest HTTP request head (hyper's smallest read buffer).
pub(crate) const MAX_HTTP_HEAD: usize = 8192;
/// How long a client has to send its request head.
const HEAD_LIMIT: Duration = Duration::from_secs(5);
/// How long one scrape may take in all.
const SCRAPE_LIMIT: Duration = Duration::from_secs(10);

/// Serves `GET /metrics` for ever. `status` makes the request for a status that goes
/// to the node's loop with `requests`.
pub(crate) async fn serve<A: Send + 'static>(listener: TcpListener, requests: Requests<A>, status: fn() -> A) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let requests = requests.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| answer(req, requests.clone(), status));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_LIMIT)
                .max_buf_size(MAX_HTTP_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(SCRAPE_LIMIT, conn).await {
                debug!(error = %e, "metrics connection failed");
            }
            drop(slot);
        });
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    r.headers_mut().insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
    r
}

async fn answer<A>(
    req: Request<Incoming>,
    requests: Requests<A>,
    status: fn() -> A,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n".into()));
    }
    if req.uri().path() != "/metrics" {
        return Ok(reply(StatusCode::NOT_FOUND, TEXT, "metrics are at /metrics\n".into()));
    }
    let (tx, rx) = oneshot::channel();
    let got = match requests.send((status(), tx)).await {
        Ok(()) => rx.await.ok(),
        Err(_) => None,
    };
    Ok(match got {
        Some(Reply::Status(s)) => match super::render(&s) {
            Ok(body) => reply(StatusCode::OK, super::CONTENT_TYPE, body),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, format!("{e}\n")),
        },
        Some(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, "no status\n".into()),
        None => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "the node is shutting down\n".into()),
    })
}
