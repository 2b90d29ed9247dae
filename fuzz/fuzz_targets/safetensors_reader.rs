//! `st_file::parse` on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mxswitch_fuzz::safetensors_reader(data);
});
