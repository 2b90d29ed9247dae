use mxswitch::precision;

struct Linear;

#[precision(mxfp4, switch_to = fp8, at = 12000, at = 13000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
