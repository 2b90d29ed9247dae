//! `parse_checkpoint`, `RunRecord::from_checkpoint` and
//! `Checkpoint::restore` into one allocated micro model, reused across
//! inputs (allocating it per input would dominate).
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use mxswitch_fuzz::CheckpointTarget;

static TARGET: Mutex<Option<CheckpointTarget>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut target = TARGET.lock().unwrap_or_else(|e| e.into_inner());
    target.get_or_insert_with(CheckpointTarget::new).load(data);
});
