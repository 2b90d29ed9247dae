use mxswitch::precision;

struct Linear;

#[precision(layer, mxfp4, switch_to = fp8, at = 12000)]
struct DoubleBlock {
    #[quantize]
    img_qkv: Linear,
}

fn main() {}
