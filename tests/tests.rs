//! Armoury's integration tests: one binary, a module per area (keeps link times down).

mod common;
mod gradcheck;
