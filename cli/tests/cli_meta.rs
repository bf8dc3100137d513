//! What packaging relies on: `--version` with the commit, `weft completions`, the
//! hidden `weft man`, and the shipped default config refusing to start a node; and
//! docs/reference/cli.md being what `weft man --markdown` renders.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft")).args(args).env_remove("WEFT_NETWORK_SECRET").output().expect("run weft")
}

fn stdout_of(args: &[&str]) -> String {
    let out = weft(args);
    assert!(out.status.success(), "weft {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn version_names_the_commit() {
    let v = stdout_of(&["--version"]);
    let prefix = format!("weft {} (", env!("CARGO_PKG_VERSION"));
    let commit = v
        .trim()
        .strip_prefix(&prefix)
        .and_then(|r| r.split_once(") protocol "))
        .map(|(c, p)| {
            assert!(p.parse::<u16>().is_ok_and(|p| p >= 2), "protocol {p:?}");
            c
        })
        .unwrap_or_else(|| panic!("{v:?}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "not a commit: {v:?}"
    );
    // Built from a git checkout, it is that checkout's HEAD.
    let git =
        Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output();
    if let Some(g) = git.ok().filter(|g| g.status.success()) {
        assert_eq!(commit, String::from_utf8_lossy(&g.stdout).trim());
    }
    assert!(stdout_of(&["status", "--version"]).contains(&v["weft ".len()..]), "subcommands print the same version");
    assert_eq!(stdout_of(&["version"]), v, "weft version says what --version says");
    let j: serde_json::Value = serde_json::from_str(&stdout_of(&["version", "--json"])).unwrap();
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(j["commit"], commit);
    assert!(v.trim().ends_with(&format!("protocol {}", j["protocol"])), "{v:?} {j}");
    assert!(j["min_protocol"].as_u64().unwrap() <= j["protocol"].as_u64().unwrap(), "{j}");
}

#[test]
fn completions_for_each_shell() {
    let bash = stdout_of(&["completions", "bash"]);
    assert!(bash.contains("weft") && bash.contains("complete -F"), "{bash}");
    assert!(bash.contains("--network-name"));
    assert!(stdout_of(&["completions", "zsh"]).starts_with("#compdef weft"));
    assert!(stdout_of(&["completions", "fish"]).contains("complete -c weft"));
    let bad = weft(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn man_pages_render() {
    let page = stdout_of(&["man"]);
    assert!(page.contains(".TH weft 1"), "{page}");
    assert!(page.contains(env!("CARGO_PKG_VERSION")));
    assert!(page.contains("weft\\-up(1)"), "weft(1) refers to the subcommand pages: {page}");
    let up = stdout_of(&["man", "up"]);
    assert!(up.contains(".TH weft-up 1") && up.contains("network\\-secret"), "{up}");
    let bad = weft(&["man", "man"]);
    assert_eq!(bad.status.code(), Some(2), "hidden commands have no page");
    let help = stdout_of(&["--help"]);
    assert!(!help.lines().any(|l| l.trim_start().starts_with("man ")), "`weft man` is hidden: {help}");
}

/// docs/reference/cli.md is generated from clap; a changed flag or help text must
/// regenerate it: `WEFT_BLESS=1 cargo test -p weft --test cli_meta` writes it.
#[test]
fn cli_reference_is_current() {
    let page = stdout_of(&["man", "--markdown"]);
    assert!(page.contains("## `weft up`") && page.contains("`--network-name <NAME>`"), "{page}");
    let version = stdout_of(&["--version"]);
    assert!(!page.contains(version.trim().trim_start_matches("weft ")), "no version or commit in the page");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/cli.md");
    if std::env::var_os("WEFT_BLESS").is_some() {
        std::fs::write(&path, &page).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == page,
        "docs/reference/cli.md is stale (it differs from `weft man --markdown`); regenerate it with \
         `WEFT_BLESS=1 cargo test -p weft --test cli_meta` and commit it"
    );
}

#[test]
fn shipped_config_and_empty_secret_refuse_to_start() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/weft.toml");
    let out = weft(&["up", "--config", shipped.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));

    let dir = std::env::temp_dir().join(format!("weft-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("weft.toml");
    std::fs::write(&cfg, "network-name = \"office\"\nnetwork-secret = \"\"\nipv4 = \"10.126.126.2/24\"\n").unwrap();
    let out = weft(&["up", "--config", cfg.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("network secret") && err.contains("empty"), "{err}");
}
