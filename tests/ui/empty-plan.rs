use mxswitch::precision;

struct Linear;

#[precision(mxfp4, switch_to = fp8, at = 12000)]
struct Flux {
    img_in: Linear,
}

fn main() {}
