use mxswitch::prelude::*;
struct Config {
    depth: usize,
}
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[quantize]
    a: QuantLinear,
    config: Config,
}
fn main() {}
