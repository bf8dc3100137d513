//! The bodies of Weft's fuzz targets, one `pub fn NAME(data: &[u8])` per target.
//!
//! cargo-fuzz (`fuzz/`, nightly, libFuzzer) calls them from `fuzz/fuzz_targets/NAME.rs`;
//! `tests/corpus.rs` replays the kept corpus (`fuzz/corpus/NAME/`) and the seeds the
//! code's own emitters produce ([`seeds`]) through them on stable, so `cargo test`
//! covers every target. A body panics only when an invariant breaks: peer bytes must
//! never panic the node.
#![warn(missing_docs)]
#![allow(clippy::unwrap_used)]

mod node;
mod parsers;
mod rx;
pub mod seeds;
mod upnp;

pub use node::node;
pub use parsers::{
    cert, control, data_header, handshake_header, hello, pcp_response, pmp_response, policy, quic_reassembly, record,
    reject, relay_header, stream_frames,
};
pub use rx::rx;
pub use upnp::upnp_gateway;

/// A target's body.
pub type Body = fn(&[u8]);

/// Every target by name, as `fuzz/run.sh` and the corpus test know them.
pub const TARGETS: &[(&str, Body)] = &[
    ("data_header", data_header),
    ("handshake_header", handshake_header),
    ("reject", reject),
    ("relay_header", relay_header),
    ("hello", hello),
    ("record", record),
    ("control", control),
    ("stream_frames", stream_frames),
    ("quic_reassembly", quic_reassembly),
    ("rx", rx),
    ("node", node),
    ("cert", cert),
    ("policy", policy),
    ("pcp_response", pcp_response),
    ("pmp_response", pmp_response),
    ("upnp_gateway", upnp_gateway),
];
