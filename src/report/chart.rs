//! Line charts outside the report — training curves, coverage against mutants, ROC curves — drawn by the
//! report's plotters path ([`super::plots`]), so every SVG Armoury writes comes from one place.

use std::path::Path;

use plotters::prelude::*;

use super::plots::{colour, legend_lower_right, line, padded, plot_error, render, xy_chart_within};
use crate::Result;

/// One named series of `(x, y)` points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's name.
    pub name: String,
    /// The points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series of `values` at x = 1, 2, … (per epoch, per round).
    pub fn numbered(name: impl Into<String>, values: &[f32]) -> Series {
        Series {
            name: name.into(),
            points: values.iter().enumerate().map(|(i, &v)| ((i + 1) as f64, v.into())).collect(),
        }
    }
}

/// A line chart: its title, axis descriptions and ranges, series, and optionally the chance diagonal of a ROC
/// curve.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineChart {
    /// The caption.
    pub title: String,
    /// The x axis' description.
    pub x_label: String,
    /// The y axis' description.
    pub y_label: String,
    /// The x range (`None`: the points' range).
    pub x_range: Option<(f64, f64)>,
    /// The y range (`None`: from 0 to 1.1 × the largest value).
    pub y_range: Option<(f64, f64)>,
    /// The series, coloured in order.
    pub series: Vec<Series>,
    /// Draws the dashed line from (0, 0) to (1, 1) (a ROC curve's chance level).
    pub diagonal: bool,
}

impl LineChart {
    /// The chart as an SVG document (plotters' SVG backend; the `<svg>` has the id `id` and the class
    /// `armoury-plot`).
    pub fn svg(&self, id: &str) -> Result<String> {
        let names: Vec<String> = self.series.iter().map(|s| s.name.clone()).collect();
        let points = || self.series.iter().flat_map(|s| s.points.iter().copied());
        let x = self.x_range.unwrap_or_else(|| {
            let lo = points().map(|p| p.0).fold(f64::INFINITY, f64::min);
            let hi = points().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
            if lo.is_finite() {
                padded(lo, hi)
            } else {
                (0.0, 1.0)
            }
        });
        let y = self.y_range.unwrap_or_else(|| (0.0, points().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1));
        let plot = render(id, names, (720, 440), |root| {
            let mut chart = xy_chart_within(root, &self.title, (x, y), &self.x_label, &self.y_label)?;
            if self.diagonal {
                let grey = RGBColor(150, 150, 150);
                chart
                    .draw_series(DashedLineSeries::new([(0.0, 0.0), (1.0, 1.0)], 4, 4, grey.into()))
                    .map_err(plot_error)?;
            }
            for (j, s) in self.series.iter().enumerate() {
                let col = colour(j);
                line(&mut chart, s.points.clone(), col, s.name.clone())?;
                if s.points.len() <= 50 {
                    chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, col.filled()))).map_err(plot_error)?;
                }
            }
            if self.series.is_empty() {
                return Ok(());
            }
            legend_lower_right(&mut chart)
        })?;
        Ok(plot.svg)
    }

    /// Writes [`LineChart::svg`] to `path` atomically ([`crate::io::write_atomic`]); the `<svg>`'s id is the file's
    /// stem.
    pub fn write(&self, path: &Path) -> Result<()> {
        let id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "chart".into());
        crate::io::write_atomic(path, self.svg(&super::plots::slug(&id))?.as_bytes())
    }
}
