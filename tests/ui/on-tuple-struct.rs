use mxswitch::precision;

struct Linear;

#[precision(mxfp4)]
struct Flux(Linear, Linear);

fn main() {}
