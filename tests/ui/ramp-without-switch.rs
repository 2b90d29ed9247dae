use mxswitch::precision;

struct Linear;

#[precision(mxfp4, layers_per_iter = 4)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
