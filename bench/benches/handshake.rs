//! What a member certificate adds to a handshake: a full IK handshake (init, answer,
//! both hellos parsed) without certificates and with them, and the responder's check
//! of the initiator's certificate (decode, Ed25519 signature, validity, claims).
//!
//! `cargo bench -p weft-bench --bench handshake`
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::net::Ipv4Addr;

use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use weft_bench::harness::{params, static_key};
use weft_core::cert::{AuthorityKey, CertBody, Certificate};
use weft_core::crypto::Cipher;
use weft_core::handshake::{Initiator, Params, Protocol, Responded, Responder, Stamp};
use weft_core::wire::Pattern;

const NOW: u64 = 1_800_000_000;

fn member(rng: &mut ChaCha8Rng, auth: Option<&AuthorityKey>, last: u8) -> Params {
    let ip = Ipv4Addr::new(10, 126, 0, last);
    let mut p = params(static_key(rng), "bench", "a bench secret", Cipher::Aes128Gcm, ip, format!("member-{last}"));
    p.hello.protocol = Some(Protocol::ours(0));
    p.hello.cert = auth.map(|a| {
        CertBody {
            authority: a.id(),
            node: p.local.public,
            network: "bench".into(),
            name: p.hello.hostname.clone(),
            ipv4: (ip, p.hello.prefix),
            ipv6: None,
            groups: vec!["dev".into(), "ci".into()],
            subnets: Vec::new(),
            exit: false,
            portal: false,
            not_before: NOW - 60,
            not_after: NOW + 86_400,
            issued: Some(NOW - 60),
            issuer: false,
        }
        .sign(a)
        .unwrap()
        .to_bytes()
    });
    p
}

fn handshake(a: &Params, b: &Params, t: u64) {
    let (init, m1) =
        Initiator::start(a, Some(&b.local.public), Stamp::from_unix(std::time::Duration::from_secs(t))).unwrap();
    let Responded::Completed(_, m2) = Responder::respond(b, Pattern::Ik, &m1).unwrap() else { panic!() };
    init.read_response(a, &m2).unwrap();
}

fn benches(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let auth = AuthorityKey::from_seed([5; 32]);
    let mut g = c.benchmark_group("handshake");
    for (name, with) in [("ik_without_certificates", None), ("ik_with_certificates", Some(&auth))] {
        let (a, b) = (member(&mut rng, with, 1), member(&mut rng, with, 2));
        let mut t = NOW;
        g.bench_function(name, |bench| {
            bench.iter(|| {
                t += 1;
                handshake(&a, &b, t);
            });
        });
    }
    let a = member(&mut rng, Some(&auth), 1);
    let bytes = a.hello.cert.clone().unwrap();
    let trusted = [auth.id()];
    g.bench_function("certificate_check", |bench| {
        bench.iter(|| {
            let cert = Certificate::from_bytes(&bytes).unwrap();
            cert.check(&trusted, "bench", &a.local.public, NOW).unwrap();
        });
    });
    g.finish();
}

criterion_group!(handshake_benches, benches);
criterion_main!(handshake_benches);
