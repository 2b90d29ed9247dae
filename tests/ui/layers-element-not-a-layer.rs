use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
struct Plain {
    a: QuantLinear,
}
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[layers]
    blocks: Vec<Plain>,
}
fn main() {}
