//! Writes a small safetensors file to try `mxswitch quantize` on:
//! a [256, 512] f32 weight with a few outliers, a [512] bf16 bias and an
//! i64 step counter (copied through unchanged by the quantizer).
//!
//! `cargo run --release --example make_tensor -- OUT.safetensors`

use std::collections::HashMap;
use std::process::ExitCode;

use safetensors::tensor::{serialize_to_file, Dtype, TensorView};

fn main() -> ExitCode {
    let Some(out) = std::env::args().nth(1) else {
        eprintln!("usage: make_tensor OUT.safetensors");
        return ExitCode::FAILURE;
    };
    // A seeded linear congruential generator and Box-Muller: normal data, no dependencies.
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f64 + 0.5) / (1u64 << 24) as f64
    };
    let mut normal = move || {
        let (u, v) = (uniform(), uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    };
    let weight: Vec<f32> = (0..256 * 512)
        .map(|i| normal() * if i % 1000 == 0 { 30.0 } else { 0.02 })
        .collect();
    let bias: Vec<u16> = (0..512)
        .map(|_| mxswitch::runtime::formats::bf16::from_f32(normal() * 0.1))
        .collect();
    let step = [1234i64];

    let weight_bytes: Vec<u8> = weight.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bias_bytes: Vec<u8> = bias.iter().flat_map(|v| v.to_le_bytes()).collect();
    let step_bytes: Vec<u8> = step.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = [
        ("layer.weight", Dtype::F32, vec![256, 512], &weight_bytes),
        ("layer.bias", Dtype::BF16, vec![512], &bias_bytes),
        ("step", Dtype::I64, vec![1], &step_bytes),
    ];
    let mut views = HashMap::new();
    for (name, dtype, shape, data) in tensors {
        match TensorView::new(dtype, shape, data) {
            Ok(v) => {
                views.insert(name.to_string(), v);
            }
            Err(e) => {
                eprintln!("error: building tensor {name}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Err(e) = serialize_to_file(&views, &None, std::path::Path::new(&out)) {
        eprintln!("error: writing {out}: {e}");
        return ExitCode::FAILURE;
    }
    println!("wrote {out}: layer.weight f32 [256, 512], layer.bias bf16 [512], step i64 [1]");
    ExitCode::SUCCESS
}
