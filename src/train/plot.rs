//! The loss-curve PNG: loss per step in blue, each switch a vertical red
//! line. Drawn without text so that no system font library is needed;
//! `metrics.jsonl` beside it has the numbers. The picture is drawn in
//! memory and written atomically, so a failed plot leaves no broken file.

use std::path::Path;

use image::ImageEncoder as _;
use plotters::prelude::*;

use super::StepMetrics;
use crate::files;
use mxswitch_runtime::{Error, Result};

const SIZE: (u32, u32) = (960, 540);

pub fn loss_curve(path: &Path, metrics: &[StepMetrics], switches: &[u64]) -> Result<()> {
    let fail = |e: &dyn std::fmt::Display| Error::Io(format!("loss plot {}: {e}", path.display()));
    let mut rgb = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    draw(&mut rgb, metrics, switches).map_err(|e| fail(&e))?;
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&rgb, SIZE.0, SIZE.1, image::ColorType::Rgb8)
        .map_err(|e| fail(&e))?;
    files::write_atomically(path, |f| std::io::Write::write_all(f, &png))?;
    Ok(())
}

/// Draw the curve into an RGB buffer of [`SIZE`]; the error is plotters'.
fn draw(
    rgb: &mut [u8],
    metrics: &[StepMetrics],
    switches: &[u64],
) -> std::result::Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let root = BitMapBackend::with_buffer(rgb, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    if metrics.is_empty() {
        return root.present().map_err(|e| fail(&e));
    }
    let x0 = metrics[0].iter as f64;
    let x1 = (metrics[metrics.len() - 1].iter as f64).max(x0 + 1.0);
    let finite = metrics
        .iter()
        .map(|m| m.loss as f64)
        .filter(|l| l.is_finite());
    let y1 = finite.clone().fold(f64::MIN, f64::max).max(1e-6) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(|e| fail(&e))?;
    // Axes as plain lines: a labelled mesh would need a font.
    chart
        .draw_series(LineSeries::new(
            [(x0, y1), (x0, 0.0), (x1, 0.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| fail(&e))?;
    for &s in switches
        .iter()
        .filter(|&&s| (s as f64) >= x0 && (s as f64) <= x1)
    {
        chart
            .draw_series(LineSeries::new(
                [(s as f64, 0.0), (s as f64, y1)],
                RED.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?;
    }
    chart
        .draw_series(LineSeries::new(
            metrics.iter().map(|m| (m.iter as f64, m.loss as f64)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}
