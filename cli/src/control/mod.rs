//! The control socket, server side: who may connect ([`access`]) and the server that
//! answers requests ([`server`]). The protocol and its client are `weft-control`.

pub mod access;
pub mod server;
