//! Replays the kept corpus (`fuzz/corpus/TARGET/*`) and the emitter seeds through
//! every fuzz target's body on stable: a crash found once stays fixed.

use std::path::Path;

#[test]
fn every_target_has_a_corpus_and_replays_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, body) in weft_fuzz::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        files.sort();
        assert!(!files.is_empty(), "no corpus for {name}");
        for f in files {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            eprintln!("{name}: {}", f.display());
            body(&data);
        }
    }
}

#[test]
fn emitter_seeds_pass_their_targets() {
    for (target, name, bytes) in weft_fuzz::seeds::seeds() {
        let (_, body) = weft_fuzz::TARGETS.iter().find(|t| t.0 == target).unwrap_or_else(|| panic!("{target}"));
        eprintln!("{target}: {name}");
        body(&bytes);
    }
}

#[test]
fn the_handshake_seeds_are_a_whole_handshake() {
    let mut kinds: Vec<u8> =
        weft_fuzz::seeds::seeds().into_iter().filter(|s| s.0 == "handshake_header").map(|s| s.2[0]).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds, [1, 2, 3], "init, response, finish");
}
