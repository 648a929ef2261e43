//! Fuzz the meta slot decoder: it must never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = chorus_storage::meta::decode_slot(data);
});
