use mxswitch::precision;

struct Linear;

#[precision(config = "tests/configs/unknown-field.ron")]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
