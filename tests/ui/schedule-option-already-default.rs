use mxswitch::prelude::*;

// `hadamard = true` is mxfp4's default, so the second phase changes nothing.
#[precision(schedule = [mxfp4 @ 0, mxfp4(hadamard = true) @ 100])]
struct M {
    #[quantize]
    a: QuantLinear,
}

fn main() {}
