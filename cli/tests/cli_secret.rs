//! `weft secret generate`: one strong random secret on stdout, nothing else.
#![allow(unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::process::Command;

use netns::weft_bin;

fn generate() -> String {
    let out = Command::new(weft_bin()).args(["secret", "generate"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let secret = text.strip_suffix('\n').expect("one line").to_owned();
    assert!(!secret.contains('\n'), "{text:?}");
    secret
}

#[test]
fn generate_prints_one_strong_secret_each_time() {
    let a = generate();
    let b = generate();
    // 32 random bytes, base64url without padding.
    assert_eq!(a.len(), 43, "{a}");
    assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{a}");
    assert_ne!(a, b);
    assert!(weft::config::secret::estimate_bits(&a) >= weft::config::secret::WEAK_BITS);
}
