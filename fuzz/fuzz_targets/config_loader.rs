//! `RunConfig::from_ron`, the schedule, the parameter count and the plan on
//! arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mxswitch_fuzz::config_loader(data);
});
