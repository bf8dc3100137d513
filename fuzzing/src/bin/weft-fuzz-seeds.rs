//! Writes the emitter seeds (`weft_fuzz::seeds`) into `fuzz/corpus/TARGET/`.
//! Usage: `cargo run -p weft-fuzz --bin weft-fuzz-seeds [CORPUS_DIR]`.

fn main() -> std::io::Result<()> {
    let root = std::env::args().nth(1).unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus").into());
    for (target, name, bytes) in weft_fuzz::seeds::seeds() {
        let dir = std::path::Path::new(&root).join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}
