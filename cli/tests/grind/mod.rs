//! Node keys for tests of members that grind their node id (shared by the e2e suites
//! that need one; the GUI's tests reuse `netns` without the engine crates).

use std::path::Path;

/// Writes a node key into the state directory of node `name` (in `dir`, as
/// [`Node::start`] names it) whose node id sorts below `below` (16 hex digits): a
/// member that ground its id to win "lowest id" ties. Returns the new id.
pub fn key_below(dir: &Path, name: &str, below: &str) -> String {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let below: weft_peers::NodeId = below.parse().unwrap();
    let key = (0..4096)
        .map(|_| weft_core::handshake::StaticKey::generate().unwrap())
        .find(|k| weft_peers::NodeId::from_public(&k.public) < below)
        .expect("a lower node id in 4096 tries");
    let state = dir.join(format!("{name}-state"));
    std::fs::create_dir_all(&state).unwrap();
    let hex: String = key.seed_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(state.join("node.key")).unwrap();
    f.write_all(format!("ed25519 {hex}\n").as_bytes()).unwrap();
    weft_peers::NodeId::from_public(&key.public).to_string()
}
