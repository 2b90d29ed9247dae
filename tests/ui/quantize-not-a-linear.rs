use mxswitch::precision;
use mxswitch::runtime::module::Dense;
#[precision(mxfp4, switch_to = fp8, at = 300)]
struct M {
    #[quantize]
    head: Dense,
}
fn main() {}
