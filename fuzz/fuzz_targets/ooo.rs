//! Fuzz the out-of-order decoders (entry record, group payload, message, hard state,
//! membership; the first byte picks one): they must never panic, and what decodes must
//! re-encode to the same value (and the same bytes, for the current layouts).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| chorus_core::format::ooo::fuzz_decode(data));
