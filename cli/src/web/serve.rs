//! The console's listener: HTTP/1.1 by hyper, each connection on its own task, behind
//! rustls when a certificate is given; at most [`MAX_CONNECTIONS`] at once, and a
//! client that does not finish its TLS handshake or request headers in time is closed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing::debug;

use crate::config::values::{UsageError, check_private};

/// Connections served at once (event streams included); more wait in the backlog.
const MAX_CONNECTIONS: usize = 64;
/// Time for a TLS handshake, and for a request's headers.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The TLS server config from a PEM chain and key.
pub(crate) fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let bad = |what: &str, p: &Path, e: &dyn std::fmt::Display| UsageError(format!("{what} {}: {e}", p.display()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad("cannot read --tls-cert", cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad("invalid --tls-cert", cert, &e))?;
    if chain.is_empty() {
        return Err(UsageError(format!("--tls-cert {}: no certificate in it", cert.display())).into());
    }
    check_private(key, "TLS key", "")?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("invalid --tls-key", key, &e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| UsageError(format!("--tls-cert and --tls-key do not make a usable pair: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves `router` on `listener` until SIGINT or SIGTERM.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p?,
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        let (tcp, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: wait, do not spin.
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        };
        let svc = TowerToHyperService::new(router.clone());
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let http = {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new()).header_read_timeout(HANDSHAKE);
                b
            };
            let done = match acceptor {
                Some(a) => match tokio::time::timeout(HANDSHAKE, a.accept(tcp)).await {
                    Ok(Ok(s)) => http.serve_connection(TokioIo::new(s), svc).await,
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                },
                None => http.serve_connection(TokioIo::new(tcp), svc).await,
            };
            if let Err(e) = done {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    Ok(())
}
