//! An SVG line chart: series of (clients, rate) points, clients on a log2
//! axis, rates on a linear axis from zero with round ticks (1, 2, 2.5, 5 ×
//! a power of ten) and thousands separators. Small and dependency-free:
//! the benches draw one kind of chart.

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

/// Distinct colours for up to eight series, in order.
pub const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#777777", "#9467bd", "#ff7f0e", "#8c564b", "#17becf",
];

const W: f64 = 760.0;
const H: f64 = 460.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

/// `n` with a thin space every three digits: 1 234 567.
pub fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('\u{2009}');
        }
        out.push(c);
    }
    if n < 0.0 && digits != "0" {
        out.insert(0, '-');
    }
    out
}

/// A round step for about `count` ticks up to `max`: 1, 2, 2.5 or 5 times
/// a power of ten.
pub fn tick_step(max: f64, count: usize) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / count.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    step.max(1.0)
}

/// The plotting area's scales.
struct Scale {
    xmin: f64,
    xmax: f64,
    ymax: f64,
}

impl Scale {
    fn of(series: &[Series<'_>]) -> (Self, f64) {
        let pts = || series.iter().flat_map(|s| s.points.iter());
        let xmin = pts()
            .map(|p| p.0)
            .fold(f64::INFINITY, f64::min)
            .max(1.0)
            .log2();
        let xmax = pts()
            .map(|p| p.0)
            .fold(1.0, f64::max)
            .log2()
            .max(xmin + 1.0);
        let top = pts().map(|p| p.1).fold(1.0, f64::max) * 1.05;
        let step = tick_step(top, 6);
        let ymax = (top / step).ceil() * step;
        (Self { xmin, xmax, ymax }, step)
    }

    fn x(&self, x: f64) -> f64 {
        LEFT + (x.max(1.0).log2() - self.xmin) / (self.xmax - self.xmin) * (W - LEFT - RIGHT)
    }

    fn y(&self, y: f64) -> f64 {
        H - BOTTOM - y / self.ymax * (H - TOP - BOTTOM)
    }
}

/// Renders the chart.
pub fn chart(title: &str, x_label: &str, y_label: &str, series: &[Series<'_>]) -> String {
    let (sc, step) = Scale::of(series);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{title}</text>"#,
        W / 2.0
    );
    axes(&mut s, &sc, step, series, x_label, y_label);
    for (i, se) in series.iter().enumerate() {
        line(&mut s, &sc, se, i);
    }
    s.push_str("</svg>\n");
    s
}

/// The axes: x ticks at every client count plotted, y ticks every `step`
/// with grid lines, and the labels.
fn axes(s: &mut String, sc: &Scale, step: f64, series: &[Series<'_>], xl: &str, yl: &str) {
    let (x0, x1, y0) = (LEFT, W - RIGHT, H - BOTTOM);
    let _ = writeln!(
        s,
        r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{y0}" stroke="black"/>"#
    );
    let mut xs: Vec<u64> = series
        .iter()
        .flat_map(|se| se.points.iter().map(|p| p.0 as u64))
        .collect();
    xs.sort_unstable();
    xs.dedup();
    for x in xs {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            sc.x(x as f64),
            y0 + 18.0,
            thousands(x as f64)
        );
    }
    let mut y = 0.0;
    while y <= sc.ymax + step / 2.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{0:.1}" x2="{x1}" y2="{0:.1}" stroke="#ddd"/><text x="{1}" y="{2:.1}" text-anchor="end">{3}</text>"##,
            sc.y(y),
            x0 - 6.0,
            sc.y(y) + 4.0,
            thousands(y)
        );
        y += step;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{xl} (log scale)</text>"#,
        (x0 + x1) / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">{yl}</text>"#,
        H / 2.0
    );
}

/// One series: its line, its points, its legend entry (the `i`th).
fn line(s: &mut String, sc: &Scale, se: &Series<'_>, i: usize) {
    let pts: Vec<String> = se
        .points
        .iter()
        .map(|&(x, y)| format!("{:.1},{:.1}", sc.x(x), sc.y(y)))
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
            sc.x(x),
            sc.y(y),
            se.color
        );
    }
    let ly = TOP + 16.0 * i as f64;
    let _ = writeln!(
        s,
        r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{2}" stroke-width="2"{dash}/><text x="{3}" y="{4}">{5}</text>"#,
        LEFT + 12.0,
        LEFT + 36.0,
        se.color,
        LEFT + 42.0,
        ly + 4.0,
        se.name
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_numbers_grouped() {
        assert_eq!(tick_step(185_263.0 * 6.0, 6), 200_000.0);
        assert_eq!(tick_step(60_000.0, 6), 10_000.0);
        assert_eq!(tick_step(13_000.0, 6), 2_500.0);
        assert_eq!(tick_step(0.0, 6), 1.0);
        assert_eq!(thousands(159_948.0), "159\u{2009}948");
        assert_eq!(thousands(1_234_567.0), "1\u{2009}234\u{2009}567");
        assert_eq!(thousands(64.0), "64");
    }

    #[test]
    fn a_chart_has_every_series_and_round_ticks() {
        let series = [
            Series {
                name: "a",
                color: PALETTE[0],
                dashed: false,
                points: vec![(1.0, 7_837.0), (64.0, 159_948.0)],
            },
            Series {
                name: "b",
                color: PALETTE[1],
                dashed: true,
                points: vec![(1.0, 7_000.0), (64.0, 120_000.0)],
            },
        ];
        let svg = chart("t", "clients", "commits/s", &series);
        assert_eq!(svg.matches("<polyline").count(), 2);
        // 0 to 200 000 in steps of 50 000.
        assert!(
            svg.contains(">50\u{2009}000<") && svg.contains(">200\u{2009}000<"),
            "{svg}"
        );
    }
}
