use mxswitch::precision;

struct Linear;

#[precision(config = "tests/configs/phase-changes-nothing.ron")]
struct Flux {
    #[quantize]
    img_in: Linear,
}

fn main() {}
