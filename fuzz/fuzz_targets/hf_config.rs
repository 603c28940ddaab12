//! `hf_config`: see `trinity_fuzz::hf_config` for what is done with each input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trinity_fuzz::hf_config(data));
