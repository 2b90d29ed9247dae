use mxswitch::precision;

struct Linear;

#[precision(schedule = [mxfp4 @ 100, fp8 @ 12000])]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
