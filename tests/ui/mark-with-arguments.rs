use mxswitch::precision;

struct Linear;

#[precision(mxfp4)]
struct Flux {
    #[quantize(fp8)]
    img_in: Linear,
}

fn main() {}
