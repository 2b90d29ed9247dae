use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
#[precision(mxfp4, switch_to = fp8, at = 300u8)]
struct M {
    #[quantize]
    a: QuantLinear,
}
fn main() {}
