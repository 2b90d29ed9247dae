use mxswitch::precision;

struct Linear;

#[precision(schedule = [mxfp4 @ 0, bf16 @ 15000, fp8 @ 12000])]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
