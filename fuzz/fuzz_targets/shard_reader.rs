//! `ShardSet::open` on a folder holding the input as its one shard, then
//! every sample read through `ValShards::batches`.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use mxswitch_fuzz::ShardTarget;

static TARGET: Mutex<Option<ShardTarget>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut target = TARGET.lock().unwrap_or_else(|e| e.into_inner());
    target.get_or_insert_with(ShardTarget::new).load(data);
});
