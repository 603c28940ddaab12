//! `safetensors_header`: see `trinity_fuzz::safetensors_header` for what is done with each input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trinity_fuzz::safetensors_header(data));
