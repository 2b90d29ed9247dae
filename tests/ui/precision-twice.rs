use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
#[precision(mxfp4, switch_to = fp8, at = 300)]
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[quantize]
    a: QuantLinear,
}
fn main() {}
