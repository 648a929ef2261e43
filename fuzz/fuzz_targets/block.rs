//! Fuzz the block decoder: it must never panic, and what decodes must re-encode identically.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| chorus_core::format::block::fuzz_decode(data));
