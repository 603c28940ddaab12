//! Integration tests of trinity-buffer: one binary, one module per concern.

mod pyarrow_files;
mod queue;
mod readers;
mod resume;
mod sqlite_crash;
mod support;
