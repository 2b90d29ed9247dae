use mxswitch::precision;

struct Linear;

#[precision(mxfp4, switch_to = fp8)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
