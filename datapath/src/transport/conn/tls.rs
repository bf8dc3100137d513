//! TLS for wss:// and QUIC. The node is authenticated by its Noise handshake inside the
//! tunnel, not by TLS: the client accepts any certificate, under a verifier whose name
//! says so (AnyCert).

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// rustls's *ring* provider with AES-128-GCM first among the TLS 1.3 suites (its
/// default order puts AES-256-GCM first). Every frame inside is already sealed end to
/// end by the session keys; this outer layer hides the tunnel from the path and keeps
/// the QUIC connection's own packets from being forged, and AES-128 does that with
/// ten rounds instead of fourteen on every QUIC packet and TLS record. The other
/// suites stay for peers (or TLS-terminating proxies) that insist on them.
pub(super) fn transport_crypto() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    rustls::crypto::CryptoProvider {
        cipher_suites: vec![TLS13_AES_128_GCM_SHA256, TLS13_CHACHA20_POLY1305_SHA256, TLS13_AES_256_GCM_SHA384],
        ..rustls::crypto::ring::default_provider()
    }
}

/// Accepts any certificate: the TLS of `wss://` and QUIC carries frames already
/// sealed by Noise sessions whose handshakes authenticate both ends (the network
/// PSK and the node keys); TLS only makes the traffic look like HTTPS. Handshake
/// signatures are still verified, so the TLS session itself is sound.
#[derive(Debug)]
pub(super) struct AnyCert(pub(super) Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
