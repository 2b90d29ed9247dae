use mxswitch::precision;

struct Linear;

#[precision(mxfp4, switch_to = mxfp4, at = 12000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
