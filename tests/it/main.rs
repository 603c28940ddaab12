//! Integration tests: the `trinity` binary run as a user runs it, in temporary directories.

mod cli;
mod config;
mod rft;
mod support;
