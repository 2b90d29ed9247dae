use mxswitch::precision;
use std::collections::HashMap;

struct Linear;

#[precision(mxfp4)]
struct Flux {
    #[quantize]
    img_in: Linear,
    #[layers]
    blocks: HashMap<usize, Linear>,
}

fn main() {}
