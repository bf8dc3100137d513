//! weft-gui: a desktop status window for a Weft node.
//!
//! It is a client of the node's control socket (the API behind `weft status`), never
//! a second implementation of node logic: [`client`] runs a worker thread that polls
//! the socket and carries out actions, [`model`] turns snapshots into rates, rows and
//! sort orders without touching egui or the OS, and [`ui`] draws them with egui.
//!
//! ```text
//!  node ◄──JSON lines──► client (worker thread) ──State──► ui::Dashboard ◄── app (eframe)
//!                              ▲                              │
//!                              └────────── Request ───────────┘
//! ```
#![warn(missing_docs)]

pub mod app;
pub mod args;
pub mod client;
pub mod model;
pub mod ui;
