//! `apply(iteration)` allocates nothing while no linear changes recipe: the
//! schedule is a `static`, the walk borrows its paths, the report is counts.
//! A binary of its own, because it installs a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mxswitch::models::flux::{Flux, RunConfig};
use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
use mxswitch::runtime::schedule::SwitchReport;
use mxswitch::runtime::schedule_config::ToSchedule;

/// Counts the allocations of a thread while it is measuring (other test
/// threads and the harness do not count).
struct Counting;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs while thread locals are torn down.
    let _ = MEASURING.try_with(|m| {
        if m.get() {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What `f` returns and how many allocations it made on this thread.
fn allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
    ALLOCATIONS.with(|n| n.set(0));
    MEASURING.with(|m| m.set(true));
    let r = f();
    MEASURING.with(|m| m.set(false));
    (r, ALLOCATIONS.with(Cell::get))
}

/// Apply every iteration of `iterations`, counting allocations and changes.
fn sweep(
    iterations: impl Iterator<Item = u64>,
    mut apply: impl FnMut(u64) -> SwitchReport,
) -> (usize, u64) {
    allocations(|| iterations.map(|i| apply(i).changed).sum::<usize>())
}

#[test]
fn the_counter_sees_allocations() {
    let (v, n) = allocations(|| vec![1u8; 3]);
    assert_eq!((v.len(), n), (3, 1));
    let (b, n) = allocations(|| Box::new(12_000u64));
    assert_eq!((*b, n), (12_000, 1));
}

#[test]
fn flux_between_switches_allocates_nothing() {
    let cfg = RunConfig::load("flux-tiny").unwrap();
    let mut model = Flux::new(&cfg.model);
    // The first apply names each linear by its path; that is set-up.
    model.apply(0);
    let (changed, n) = sweep(1..500, |i| model.apply(i));
    assert_eq!((changed, n), (0, 0), "apply(1..500) under the attribute");
    let (changed, n) = sweep((11_000..11_999).rev(), |i| model.apply(i));
    assert_eq!((changed, n), (0, 0), "apply in reverse, still mxfp4");

    let report = model.apply(12_000);
    assert_eq!(report.changed, 24);
    assert_eq!(
        report.to_string(),
        "4/4 layers (24/24 linears) now fp8 at iteration 12000"
    );
    let (changed, n) = sweep(12_001..12_500, |i| model.apply(i));
    assert_eq!((changed, n), (0, 0), "after the switch");

    // A run-time schedule is checked against the allow-list on every call,
    // without allocating either.
    let schedule = cfg.schedule.to_schedule().unwrap();
    let start = schedule.phases()[1].start;
    model.apply_with(&schedule, 0).unwrap();
    let (changed, n) = sweep(1..start, |i| model.apply_with(&schedule, i).unwrap());
    assert_eq!((changed, n), (0, 0), "apply_with before its switch");
    let report = model.apply_with(&schedule, start).unwrap();
    assert_eq!(
        (report.changed, report.recipe),
        (24, schedule.phases()[1].recipe)
    );
}

#[precision(layer)]
struct Block {
    #[quantize]
    fc1: QuantLinear,
    #[quantize]
    fc2: QuantLinear,
}

#[precision(mxfp4, switch_to = fp8, at = 100, layers_per_iter = 3, order = shallow_to_deep)]
struct Ramped {
    #[quantize]
    input: QuantLinear,
    #[layers]
    blocks: Vec<Block>,
}

#[test]
fn a_ramp_allocates_nothing_before_or_after_it() {
    let lin = || QuantLinear::new(8, 8, true);
    let mut model = Ramped {
        input: lin(),
        blocks: (0..10)
            .map(|_| Block {
                fc1: lin(),
                fc2: lin(),
            })
            .collect(),
    };
    model.apply(0);
    let (changed, n) = sweep(1..100, |i| model.apply(i));
    assert_eq!((changed, n), (0, 0), "before the ramp");
    // The ramp: 3, 6, 9, then all 10 layers, the extra with the first three.
    let changes: Vec<usize> = (100..104).map(|i| model.apply(i).changed).collect();
    assert_eq!(changes, [7, 6, 6, 2]);
    assert_eq!(
        model.apply(103).to_string(),
        "10/10 layers (21/21 linears) now fp8 at iteration 103"
    );
    let (changed, n) = sweep(104..1000, |i| model.apply(i));
    assert_eq!((changed, n), (0, 0), "after the ramp");
}
