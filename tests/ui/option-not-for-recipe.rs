use mxswitch::precision;

struct Linear;

#[precision(mxfp4(pow2 = true), switch_to = fp8(scale = rceil), at = 12000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
