use mxswitch::precision;

struct Linear;

#[precision(schedule = [mxfp4 @ 0, fp8 @ 12000], switch_to = bf16, at = 15000)]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
