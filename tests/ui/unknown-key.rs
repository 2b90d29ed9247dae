use mxswitch::precision;

struct Linear;

#[precision(mxfp4, swich_to = fp8, at = 12000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
