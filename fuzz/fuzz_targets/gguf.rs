//! `gguf`: see `trinity_fuzz::gguf` for what is done with each input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trinity_fuzz::gguf(data));
