//! An SVG line chart of commits/s and the device limit against clients.

use std::fmt::Write;

/// One series: a name, a colour, a dash pattern, and (x, y) points.
pub struct Series<'a> {
    /// Legend text.
    pub name: &'a str,
    /// Stroke colour.
    pub color: &'a str,
    /// Dashed line.
    pub dashed: bool,
    /// Points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// Renders the chart: x on a log2 axis (clients), y linear from zero.
pub fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series<'_>]) -> String {
    let (w, h) = (720.0, 440.0);
    let (left, right, top, bottom) = (80.0, 30.0, 50.0, 60.0);
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    let xmin = xs
        .iter()
        .cloned()
        .fold(f64::INFINITY, f64::min)
        .max(1.0)
        .log2();
    let xmax = xs
        .iter()
        .cloned()
        .fold(1.0, f64::max)
        .log2()
        .max(xmin + 1.0);
    let ymax = ys.iter().cloned().fold(1.0, f64::max) * 1.1;
    let px = |x: f64| left + (x.max(1.0).log2() - xmin) / (xmax - xmin) * (w - left - right);
    let py = |y: f64| h - bottom - y / ymax * (h - top - bottom);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{title}</text>"#,
        w / 2.0
    );
    // Axes and ticks.
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        h - bottom,
        w - right,
        h - bottom
    );
    let _ = writeln!(
        s,
        r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#,
        h - bottom
    );
    let mut seen = Vec::new();
    for &x in &xs {
        if seen.contains(&(x as u64)) {
            continue;
        }
        seen.push(x as u64);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            px(x),
            h - bottom + 18.0,
            x as u64
        );
    }
    for i in 0..=5 {
        let y = ymax * i as f64 / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4:.0}</text>"##,
            py(y),
            w - right,
            left - 6.0,
            py(y) + 4.0,
            y
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        (left + w - right) / 2.0,
        h - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{y_label}</text>"#,
        h / 2.0,
        h / 2.0
    );
    for (i, se) in series.iter().enumerate() {
        let pts: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let dash = if se.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            se.color,
            pts.join(" ")
        );
        for &(x, y) in &se.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                px(x),
                py(y),
                se.color
            );
        }
        let ly = top + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{2}" stroke-width="2"{dash}/><text x="{3}" y="{4}">{5}</text>"#,
            left + 12.0,
            left + 36.0,
            se.color,
            left + 42.0,
            ly + 4.0,
            se.name
        );
    }
    s.push_str("</svg>\n");
    s
}
