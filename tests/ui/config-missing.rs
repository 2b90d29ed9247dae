use mxswitch::precision;

struct Linear;

#[precision(config = "tests/configs/no-such-file.ron")]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
