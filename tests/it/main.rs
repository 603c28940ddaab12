//! Integration tests: the `trinity` binary run as a user runs it, in temporary directories.

mod cli;
mod config;
mod model_commands;
mod rft;
mod support;
