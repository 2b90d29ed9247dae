use mxswitch::prelude::*;
#[precision(layer)]
struct B {
    #[quantize]
    a: QuantLinear,
}
#[precision(layer)]
struct Group {
    #[layers]
    blocks: Vec<B>,
}
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[layers]
    groups: Vec<Group>,
}
fn main() {}
