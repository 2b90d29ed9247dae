// Without the prelude in scope, the suggested bound must still be a path
// that resolves from the user's crate.
use mxswitch::precision;
use mxswitch::runtime::linear::QuantLinear;
use mxswitch::runtime::plan::Plan;

#[precision(layer)]
struct Block {
    #[quantize]
    a: QuantLinear,
}

#[precision(mxfp4, switch_to = fp8, at = 300)]
struct Model<T> {
    #[layers]
    blocks: Vec<T>,
}

fn plan_of<T>(m: &Model<T>) -> Plan {
    m.plan()
}

fn main() {
    let m = Model::<Block> { blocks: vec![] };
    let _ = plan_of(&m);
}
