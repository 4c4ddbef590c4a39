//! A small SVG line chart (accuracy per epoch and the like): a few series over a shared x axis.

use std::fmt::Write as _;

/// Writes an SVG line chart of `series` (name, y values for x = 1, 2, …) with y in [0, 1].
pub fn line_chart(title: &str, x_label: &str, series: &[(String, Vec<f32>)]) -> String {
    let (w, h, left, top, right, bottom) = (640.0, 400.0, 60.0, 40.0, 170.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(1).max(2);
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
    let x = |i: usize| left + pw * i as f32 / (n - 1) as f32;
    let y = |v: f32| top + ph * (1.0 - v.clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        escape(title)
    );
    for k in 0..=10 {
        let v = k as f32 / 10.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{v:.1}</text>"##,
            left + pw,
            left - 6.0,
            y(v) + 4.0,
            yy = y(v)
        );
    }
    for i in 0..n {
        let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, x(i), top + ph + 18.0, i + 1);
    }
    let _ =
        write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, left + pw / 2.0, h - 10.0, escape(x_label));
    let _ = write!(s, r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#);
    for (k, (name, values)) in series.iter().enumerate() {
        let c = colours[k % colours.len()];
        let pts: Vec<String> = values.iter().enumerate().map(|(i, &v)| format!("{:.1},{:.1}", x(i), y(v))).collect();
        let _ = write!(s, r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"/>"#, pts.join(" "));
        for (i, &v) in values.iter().enumerate() {
            let _ = write!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#, x(i), y(v));
        }
        let ly = top + 10.0 + 20.0 * k as f32;
        let _ = write!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            left + pw + 10.0,
            left + pw + 30.0,
            left + pw + 36.0,
            ly + 4.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Writes `contents` to `path` atomically (temporary file, then rename).
pub fn write_atomic(path: &std::path::Path, contents: &str) -> armoury::Result<()> {
    armoury::io::write_atomic(path, contents.as_bytes())
}
