//! The Magic DNS domain (`--dns-domain`, or one made from the network name) and the
//! labels host names become in it.

/// The domain when the network name makes no label.
const FALLBACK: &str = "weft";

/// A DNS label from a host name: lowercase ASCII letters, digits and hyphens, no
/// hyphen at either end, at most 63 bytes; empty when nothing is left.
pub fn label(host: &str) -> String {
    let mut out = String::with_capacity(host.len().min(63));
    for c in host.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            // Dots, underscores, spaces and other characters become one hyphen.
            out.push('-');
        }
        if out.len() == 63 {
            break;
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The default domain of a network: its name as a label under `internal.` (the TLD
/// ICANN keeps for private use), e.g. `office.internal`.
pub fn default_domain(network: &str) -> String {
    let l = label(network);
    format!("{}.internal", if l.is_empty() { FALLBACK } else { &l })
}

/// Checks a `--dns-domain`: one or more valid labels (letters, digits, hyphens, not
/// at either end of a label), at most 253 bytes; returned lowercased, without a
/// trailing dot.
pub fn parse_domain(s: &str) -> Result<String, String> {
    let d = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    if d.is_empty() || d.len() > 253 {
        return Err(format!("invalid --dns-domain {s:?}: it must hold 1 to 253 characters"));
    }
    for l in d.split('.') {
        let ok = !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-');
        if !ok {
            return Err(format!(
                "invalid --dns-domain {s:?}: label {l:?} must be 1 to 63 letters, digits or inner hyphens"
            ));
        }
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_sanitised() {
        assert_eq!(label("Alpha.Example.COM"), "alpha-example-com");
        assert_eq!(label("  my_box  2 "), "my-box-2");
        assert_eq!(label("-x-"), "x");
        assert_eq!(label("\u{e9}t\u{e9}"), "t");
        assert_eq!(label(&"a".repeat(100)).len(), 63);
        assert_eq!(label("!!!"), "");
        assert_eq!(default_domain("Office LAN"), "office-lan.internal");
        assert_eq!(default_domain("***"), "weft.internal");
    }

    #[test]
    fn domains_are_checked() {
        assert_eq!(parse_domain("Mesh.Example.").unwrap(), "mesh.example");
        for bad in ["", ".", "a..b", "-a.b", "a-.b", "a b", "a_b.c", &"a".repeat(64)] {
            assert!(parse_domain(bad).is_err(), "{bad:?} accepted");
        }
    }
}
