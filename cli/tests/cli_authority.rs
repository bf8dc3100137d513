//! The authority's local commands, as an admin runs them: `weft authority init`,
//! `weft id`, `weft authority sign`, `weft cert show`, `weft authority revoke`; each
//! bad input refused with exit 2 and a message naming it.
#![allow(unreachable_pub, clippy::unwrap_used)]

mod netns;

use std::process::{Command, Output};

use netns::{TempDir, weft_bin};

fn weft(args: &[&str]) -> Output {
    Command::new(weft_bin()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = weft(args);
    assert!(out.status.success(), "weft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

fn refused(args: &[&str], names: &str) {
    let out = weft(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "weft {args:?}: {err}");
    assert!(err.contains(names), "weft {args:?} should name {names:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn an_admin_issues_reads_and_revokes_a_certificate() {
    let dir = TempDir::new();
    let key = dir.0.join("auth.key");
    let key = key.to_str().unwrap();
    let public = ok(&["authority", "init", "--out", key]);
    assert!(public.starts_with("weft-authority:") && !public.contains('\n'), "{public}");
    refused(&["authority", "init", "--out", key], "refusing to overwrite");

    let state = dir.0.join("member");
    let id = ok(&["id", "--state-dir", state.to_str().unwrap()]);
    assert_eq!(id.len(), 64, "{id}");
    assert_eq!(ok(&["id", "--state-dir", state.to_str().unwrap()]), id, "the id is the node key's, kept");

    let cert = ok(&[
        "authority",
        "sign",
        "--key",
        key,
        "--node-id",
        &id,
        "--name",
        "build-01",
        "--ipv4",
        "10.126.0.5/24",
        "--ipv6",
        "fd00::5/64",
        "--groups",
        "dev,ci",
        "--subnet",
        "192.168.50.7/24",
        "--exit",
        "--expires",
        "90d",
        "--network-name",
        "office",
    ]);
    assert!(cert.starts_with("weft-cert:") && !cert.contains('\n'), "{cert}");
    let words = ok(&["cert", "show", &cert]);
    for want in [
        "build-01 (valid)",
        &id,
        "office",
        "10.126.0.5/24",
        "fd00::5/64",
        "dev, ci",
        "192.168.50.0/24",
        "may offer",
        &public,
    ] {
        assert!(words.contains(want), "cert show lacks {want:?}:\n{words}");
    }
    let file = dir.0.join("member.cert");
    std::fs::write(&file, format!("{cert}\n")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["cert", "show", "--json", file.to_str().unwrap()])).unwrap();
    assert_eq!(json["node_id"], id.as_str());
    assert_eq!(json["groups"], serde_json::json!(["dev", "ci"]));
    assert_eq!(json["state"], "valid");
    assert_eq!(json["not_after"].as_u64().unwrap() - json["not_before"].as_u64().unwrap(), 90 * 86_400);

    let revocation = ok(&["authority", "revoke", "--key", key, &id]);
    assert!(revocation.starts_with("weft-revocation:"), "{revocation}");

    // A certificate altered after signing is shown as such and refused.
    let mut forged: Vec<char> = cert.chars().collect();
    let at = forged.len() - 100;
    forged[at] = if forged[at] == 'A' { 'B' } else { 'A' };
    let forged: String = forged.into_iter().collect();
    refused(&["cert", "show", &forged], "signature does not verify");

    // Bad input, each named.
    let sign = |extra: &[&str]| {
        let mut a = vec!["authority", "sign", "--key", key, "--name", "x"];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, names: &str| refused(&args.iter().map(String::as_str).collect::<Vec<_>>(), names);
    run(sign(&["--node-id", "e361616bc623cf03", "--ipv4", "10.1.1.1/24"]), "short form");
    run(sign(&["--node-id", &id, "--ipv4", "10.1.1.1"]), "invalid overlay address");
    run(sign(&["--node-id", &id, "--ipv4", "10.1.1.1/24", "--ipv6", "10.1.1.1/24"]), "invalid --ipv6");
    run(sign(&["--node-id", &id, "--ipv4", "10.1.1.1/24", "--subnet", "192.168.1.0/33"]), "invalid --subnet");
    run(sign(&["--node-id", &id, "--ipv4", "10.1.1.1/24", "--groups", "a b"]), "invalid group");
    run(sign(&["--node-id", &id, "--ipv4", "10.1.1.1/24", "--expires", "10y"]), "invalid duration");
    refused(
        &[
            "authority",
            "sign",
            "--key",
            "/nonexistent/auth.key",
            "--node-id",
            &id,
            "--name",
            "x",
            "--ipv4",
            "10.1.1.1/24",
        ],
        "cannot read the authority key",
    );
    refused(&["cert", "show", "weft-cert:AAAA"], "invalid certificate");
    refused(&["cert", "show", "/nonexistent"], "neither a certificate");
    refused(&["authority", "revoke", "--key", key, "abc"], "invalid node id");
}

#[test]
fn a_host_name_or_address_stays_with_its_key_until_that_key_is_revoked_and_replace_is_given() {
    let dir = TempDir::new();
    let key = dir.0.join("auth.key");
    let key = key.to_str().unwrap();
    ok(&["authority", "init", "--out", key]);
    let id = |name: &str| ok(&["id", "--state-dir", dir.0.join(name).to_str().unwrap()]);
    let (alice, mallory) = (id("alice"), id("mallory"));
    let sign = |node: &str, name: &str, ipv4: &str, extra: &[&str]| {
        let mut a = vec!["authority", "sign", "--key", key, "--node-id", node, "--name", name, "--ipv4", ipv4];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run_ok = |v: Vec<String>| ok(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let run_refused = |v: Vec<String>, names: &str| refused(&v.iter().map(String::as_str).collect::<Vec<_>>(), names);

    let first = run_ok(sign(&alice, "alice", "10.126.0.5/24", &["--groups", "dev", "--issuer"]));
    let shown: serde_json::Value = serde_json::from_str(&ok(&["cert", "show", "--json", &first])).unwrap();
    assert_eq!(shown["issuer"], true);
    assert!(shown["issued"].as_u64().unwrap() >= shown["not_before"].as_u64().unwrap(), "{shown}");
    assert!(ok(&["cert", "show", &first]).contains("may issue"), "cert show names the issuer mark");
    let ledger = std::fs::read_to_string(format!("{key}.ledger")).unwrap();
    assert!(ledger.contains(&alice) && ledger.contains("\"alice\""), "{ledger}");
    // The same key re-certified (fewer groups, another address): fine.
    run_ok(sign(&alice, "alice", "10.126.0.6/24", &[]));
    // Another key asking for its name (in any case) or one of its addresses: refused.
    run_refused(sign(&mallory, "Alice", "10.126.0.9/24", &[]), "host name \"alice\" was signed for node");
    run_refused(sign(&mallory, "mallory", "10.126.0.5/24", &[]), "address 10.126.0.5 was signed for node");
    // --replace only once the old key is revoked.
    run_refused(sign(&mallory, "alice", "10.126.0.9/24", &["--replace"]), "revoke it first");
    let revocation = ok(&["authority", "revoke", "--key", key, &alice]);
    assert!(revocation.starts_with("weft-revocation:"));
    assert!(std::fs::read_to_string(format!("{key}.ledger")).unwrap().contains("revoked"));
    run_refused(sign(&mallory, "alice", "10.126.0.9/24", &[]), "--replace");
    let moved = run_ok(sign(&mallory, "alice", "10.126.0.5/24", &["--replace"]));
    assert!(ok(&["cert", "show", &moved]).contains(&mallory));
    // The help says how a name moves.
    let help = ok(&["authority", "sign", "--help"]);
    assert!(help.contains("--replace") && help.contains("revoke"), "{help}");
}
