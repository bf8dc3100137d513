//! Transports that carry sealed datagrams between nodes. Only UDP exists so far.

pub mod udp;
