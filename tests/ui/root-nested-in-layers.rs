use mxswitch::prelude::*;
#[precision(mxfp4, switch_to = fp8, at = 10)]
struct Inner {
    #[quantize]
    a: QuantLinear,
}
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct Outer {
    #[layers]
    blocks: Vec<Inner>,
}
fn main() {}
