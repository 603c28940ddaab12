//! `tokenizer`: see `trinity_fuzz::tokenizer` for what is done with each input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trinity_fuzz::tokenizer(data));
