use mxswitch::precision;

struct Linear;

#[precision(mxfp4, switch_to = fp8, at = -100)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
