use mxswitch::prelude::*;
#[precision(layer)]
struct B {
    #[quantize]
    a: QuantLinear,
}
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[layers]
    blocks: Vec<Vec<B>>,
}
fn main() {}
