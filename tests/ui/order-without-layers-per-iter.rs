use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
#[precision(mxfp4, switch_to = fp8, at = 300, order = shallow_to_deep)]
struct M {
    #[quantize]
    a: QuantLinear,
}
fn main() {}
