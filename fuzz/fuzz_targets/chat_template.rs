//! `chat_template`: see `trinity_fuzz::chat_template` for what is done with each input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trinity_fuzz::chat_template(data));
