//! Compile-fail tests of the `#[precision]` DSL: one file per mistake under
//! `tests/ui/`, each next to its `.stderr` snapshot. Refresh the snapshots
//! with `TRYBUILD=overwrite cargo test -p mxswitch --test compile_fail` and
//! read every changed one.

#[test]
fn ui() {
    // trybuild compiles each file inside a crate it generates under
    // `target/`, so `config = "..."` paths are resolved from this crate's
    // root through the variable the macro reads in place of CARGO_MANIFEST_DIR.
    std::env::set_var("MXSWITCH_CONFIG_ROOT", env!("CARGO_MANIFEST_DIR"));
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
