use mxswitch::prelude::*;
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[quantize]
    a: QuantLinear,
    head: QuantLinear,
}
fn main() {}
