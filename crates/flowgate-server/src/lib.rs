//! The Flowgate service: the `flowgate` binary's commands and server.
//!
//! The binary is a thin `main` around [`cli::run`]; everything it does is reachable from here so
//! tests can start a server on port 0 and talk to it.

pub mod cli;
pub mod server;
