use mxswitch::precision;

struct Linear;

#[precision(config = "tests/configs/malformed.ron")]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
