//! Fuzz the replication frame decoder: it must never panic, and what decodes must re-encode
//! identically.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| chorus_core::format::wire::fuzz_decode(data));
