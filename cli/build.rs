//! Embeds the git commit in `weft --version` as WEFT_GIT_COMMIT: the output of
//! `git rev-parse --short HEAD`, or "unknown" when git or the repository is missing.
//! Never fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    if let Some(git_dir) = find_git_dir(&manifest_dir) {
        watch_head(&git_dir);
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(&manifest_dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=WEFT_GIT_COMMIT={commit}");
}

/// The repository's git directory: `.git` in this or a parent directory, or the
/// directory a `.git` file (worktree, submodule) points to.
fn find_git_dir(start: &Path) -> Option<PathBuf> {
    for dir in start.ancestors() {
        let dot_git = dir.join(".git");
        if dot_git.is_dir() {
            return Some(dot_git);
        }
        if dot_git.is_file() {
            let text = std::fs::read_to_string(&dot_git).ok()?;
            return Some(dir.join(text.strip_prefix("gitdir:")?.trim()));
        }
    }
    None
}

/// Reruns this script when HEAD moves: HEAD itself (branch switch) and the ref it
/// names (a commit), loose or packed. Only existing paths are watched, since cargo
/// reruns every time for a missing one.
fn watch_head(git_dir: &Path) {
    let head = git_dir.join("HEAD");
    if !head.is_file() {
        return;
    }
    println!("cargo:rerun-if-changed={}", head.display());
    let Some(name) = std::fs::read_to_string(&head).ok().and_then(|t| Some(t.strip_prefix("ref:")?.trim().to_owned()))
    else {
        return; // detached HEAD: the commit is in HEAD itself
    };
    // In a worktree, branches live in the common directory.
    let common = std::fs::read_to_string(git_dir.join("commondir"))
        .map_or_else(|_| git_dir.to_path_buf(), |c| git_dir.join(c.trim()));
    let loose = [git_dir.join(&name), common.join(&name)].into_iter().find(|p| p.is_file());
    match loose {
        Some(path) => println!("cargo:rerun-if-changed={}", path.display()),
        None => {
            // Packed ref: a commit writes a new loose ref into the ref's directory.
            if let Some(dir) = common.join(&name).parent().filter(|d| d.is_dir()) {
                println!("cargo:rerun-if-changed={}", dir.display());
            }
        }
    }
    let packed = common.join("packed-refs");
    if packed.is_file() {
        println!("cargo:rerun-if-changed={}", packed.display());
    }
}
